#!/usr/bin/env python3
# The harness behind issue 29's and issue 41's per-cut figures (docs/benchmarks.md): it puts
# the scripts together from src/runtime/scripting/manifest.rs as the client does.
"""Redis CPU per uncontended lock/unlock pair of redmutex's Lock scripts (read from a
worktree's lua/ and src/runtime/scripting/manifest.rs), of the hashfloor and of the naive lock,
measured server-side: INFO cpu (user+sys) and commandstats deltas over N pairs over 1,000
names, on a private redis-server. Modes: --pipe (batches of pairs, the per-request
overhead amortised: the scripts' own cost stands out) or one request at a time.

usage: script_cpu.py WORKTREE [--server BIN] [--evalsha] [--n N] [--batch B] [--reps R]
       [--kinds lock,hashfloor,naive,x_argv,x_argv4,x_exists8,x_exists15,x_lindex]  (x_: FCALL only)
       [--argv old|short|lean]  (old: a first attempt sends ARGV[5..7], before i29-fast;
       lean: ARGV[3..4] and the release's ARGV[2..3] left out at their defaults, i29-lean)
WORKTREE: a directory with lua/ and src/runtime/scripting/manifest.rs (git archive <rev>
lua src/runtime/scripting/manifest.rs | tar -x -C DIR compares revisions).
"""
import argparse, hashlib, os, random, re, socket, subprocess, sys, time

def resp(*args):
    out = [b'*%d\r\n' % len(args)]
    for a in args:
        if isinstance(a, int):
            a = str(a)
        if isinstance(a, str):
            a = a.encode()
        out.append(b'$%d\r\n%s\r\n' % (len(a), a))
    return b''.join(out)

class Con:
    def __init__(self, port):
        self.s = socket.create_connection(('127.0.0.1', port))
        self.buf = b''
    def _line(self):
        while b'\r\n' not in self.buf:
            self.buf += self.s.recv(1 << 20)
        i = self.buf.index(b'\r\n')
        l, self.buf = self.buf[:i], self.buf[i + 2:]
        return l
    def _read(self, n):
        while len(self.buf) < n + 2:
            self.buf += self.s.recv(1 << 20)
        d, self.buf = self.buf[:n], self.buf[n + 2:]
        return d
    def reply(self):
        l = self._line()
        t, rest = l[:1], l[1:]
        if t == b'+': return rest.decode()
        if t == b'-': return RuntimeError(rest.decode())
        if t == b':': return int(rest)
        if t == b'$':
            n = int(rest)
            return None if n < 0 else self._read(n)
        if t == b'*':
            n = int(rest)
            return None if n < 0 else [self.reply() for _ in range(n)]
        raise ValueError(l)
    def call(self, *args):
        self.s.sendall(resp(*args))
        r = self.reply()
        if isinstance(r, RuntimeError):
            raise r
        return r
    def pipe(self, payload, count):
        self.s.sendall(payload)
        out = [self.reply() for _ in range(count)]
        for r in out:
            if isinstance(r, RuntimeError):
                raise r
        return out

def manifest(wt):
    """The library's groups and the parts' texts, read from manifest.rs: (texts, shared,
    groups), a group being (rule part names, [function]) and a function a dict of name,
    allow_oom, oom_marker, levels, fast (a part name or None) and body (a part name)."""
    src = open(os.path.join(wt, 'src/runtime/scripting/manifest.rs')).read()
    src = re.sub(r'//[^\n]*', '', src)
    texts = {name: open(os.path.join(wt, 'lua', f)).read()
             for name, f in re.findall(r'(\w+) = "([\w.]+)";', src)}
    names = lambda t: [x.strip() for x in t.split(',') if x.strip()]
    shared = names(re.search(r'pub const SHARED: &\[Part\] = &\[([^\]]*)\]', src).group(1))
    lib = src[src.index('pub const LIBRARY'):]
    groups = []
    for g in re.finditer(r'Group \{\s*rules: &\[([^\]]*)\],\s*functions: &\[(.*?)\],\s*\},', lib, re.S):
        functions = []
        # One entry per call of `function(` or `release(`, with what wraps it.
        entries, depth, cur = [], 0, ''
        for ch in g.group(2):
            if ch == ',' and depth == 0:
                entries.append(cur)
                cur = ''
                continue
            depth += ch in '({'
            depth -= ch in ')}'
            cur += ch
        entries.append(cur)
        for e in (e.strip() for e in entries):
            if not e:
                continue
            m = re.search(r'(function|release)\("(\w+)",\s*(?:(true|false),\s*)?(\w+)\)', e)
            is_release = m.group(1) == 'release'
            allow_oom = is_release or m.group(3) == 'true'
            fast = re.search(r'fast: Some\((\w+)\)', e)
            functions.append(dict(
                name=m.group(2), allow_oom=allow_oom,
                oom_marker=allow_oom and not e.startswith('unmarked('),
                levels=is_release, fast=fast and fast.group(1), body=m.group(4)))
        groups.append((names(g.group(1)), functions))
    if not groups:
        raise SystemExit('no LIBRARY groups found in manifest.rs')
    return texts, shared, groups

def library_body(wt):
    """The library's text after its name line and the constants, as scripts.rs's
    library_body puts it together."""
    texts, shared, groups = manifest(wt)
    body = ["local KEYS, ARGV\n", "local setmetatable\n",
            "local function register(name, flags, body)\n",
            "    redis.register_function{function_name = LIB .. '_' .. name, flags = flags,\n",
            "        callback = function(keys, args) KEYS, ARGV = keys, args return body() end}\n",
            "end\n"]
    body += [texts[p] for p in shared]
    for rules, functions in groups:
        body.append("do\n")
        body += [texts[r] for r in rules]
        for f in functions:
            flags = "{'allow-oom'}" if f['allow_oom'] else "{}"
            body.append("\nregister('%s', %s, function()\n" % (f['name'], flags))
            if f['fast']:
                body.append(texts[f['fast']])
            body.append(texts[f['body']])
            body.append("\nend)\n")
        body.append("end\n")
    return ''.join(body)

def script_text(wt, name):
    """The function `name` as a script of its own (EVALSHA), as manifest.rs's
    script_parts orders it, without the constants line."""
    texts, _, groups = manifest(wt)
    for rules, functions in groups:
        for f in functions:
            if f['name'] == name:
                parts = (['ALLOW_OOM'] if f['oom_marker'] else []) + \
                    (['LEVELS'] if f['levels'] else []) + \
                    ([f['fast']] if f['fast'] else []) + rules + [f['body']]
                return ''.join(texts[p] for p in parts)
    raise SystemExit('no function %s in manifest.rs' % name)

CONSTANTS = 'local PICKUP, STARVE = 1000, 2\n'

def spawn(binary, port):
    p = subprocess.Popen([binary, '--port', str(port), '--save', '', '--appendonly', 'no',
                          '--bind', '127.0.0.1'], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    for _ in range(100):
        if p.poll() is not None:
            break
        try:
            c = Con(port)
            c.call('PING')
            return p, c
        except OSError:
            time.sleep(0.05)
    p.terminate()
    p.wait()
    raise SystemExit('no server')

def cpu(c):
    info = c.call('INFO', 'cpu').decode()
    d = dict(l.split(':', 1) for l in info.splitlines() if ':' in l)
    return float(d['used_cpu_user']) + float(d['used_cpu_sys'])

def stats(c):
    info = c.call('INFO', 'commandstats').decode()
    out = {}
    for l in info.splitlines():
        m = re.match(r'cmdstat_([^:]+):calls=(\d+)', l)
        if m:
            out[m.group(1)] = int(m.group(2))
    return out

def main():
    ap = argparse.ArgumentParser()
    ap.add_argument('worktree')
    ap.add_argument('--server', default='/usr/bin/redis-server')
    ap.add_argument('--evalsha', action='store_true')
    ap.add_argument('--n', type=int, default=60000)
    ap.add_argument('--batch', type=int, default=50, help='pairs per pipeline batch (1: one request at a time)')
    ap.add_argument('--kinds', default='lock,hashfloor,naive')
    ap.add_argument('--argv', default=os.environ.get('ARGV_FORMAT', 'old'))
    ap.add_argument('--reps', type=int, default=3)
    ap.add_argument('--port', type=int, default=47000 + os.getpid() % 1000)
    a = ap.parse_args()
    # A port another process took meanwhile (tests spawn servers too): the next ones.
    for port in range(a.port, a.port + 20):
        try:
            proc, c = spawn(a.server, port)
            break
        except SystemExit:
            continue
    else:
        raise SystemExit('no server')
    try:
        run(a, c)
    finally:
        proc.terminate()
        proc.wait()

def run(a, c):
    version = c.call('INFO', 'server').decode()
    version = re.search(r'redis_version:(\S+)', version).group(1)
    fcall = not a.evalsha and int(version.split('.')[0]) >= 7
    wt = a.worktree
    lua = lambda f: open(os.path.join(wt, 'lua', f)).read()
    if fcall:
        body = CONSTANTS + library_body(wt)
        c.call('FUNCTION', 'LOAD', 'REPLACE', "#!lua name=rm\nlocal LIB = 'rm'\n" + body)
        floor = ("#!lua name=floors\n"
                 "redis.register_function('hashfloor_take', function(keys, args)\n"
                 "if redis.call('EXISTS', keys[1]) == 0 then redis.call('HSET', keys[1], args[1], 1) redis.call('PEXPIRE', keys[1], args[2]) return 1 end\n"
                 "if redis.call('HEXISTS', keys[1], args[1]) == 1 then redis.call('HINCRBY', keys[1], args[1], 1) redis.call('PEXPIRE', keys[1], args[2]) return 1 end\n"
                 "return 0 end)\n"
                 "redis.register_function('hashfloor_give', function(keys, args)\n"
                 "local n = redis.call('HGET', keys[1], args[1]) if not n then return -1 end\n"
                 "if tonumber(n) > 1 then redis.call('HINCRBY', keys[1], args[1], -1) redis.call('PEXPIRE', keys[1], args[2]) return 0 end\n"
                 "redis.call('DEL', keys[1]) return 1 end)\n")
        c.call('FUNCTION', 'LOAD', 'REPLACE', floor)
    # The scripts as the client sends them with EVALSHA (scripts.rs: the constants first).
    def bundled(name):
        return CONSTANTS + script_text(wt, name)
    acq_text = bundled('acquire')
    rel_text = bundled('release')
    take_text = ("if redis.call('EXISTS', KEYS[1]) == 0 then redis.call('HSET', KEYS[1], ARGV[1], 1) redis.call('PEXPIRE', KEYS[1], ARGV[2]) return 1 end\n"
                 "if redis.call('HEXISTS', KEYS[1], ARGV[1]) == 1 then redis.call('HINCRBY', KEYS[1], ARGV[1], 1) redis.call('PEXPIRE', KEYS[1], ARGV[2]) return 1 end\nreturn 0")
    give_text = ("local n = redis.call('HGET', KEYS[1], ARGV[1]) if not n then return -1 end\n"
                 "if tonumber(n) > 1 then redis.call('HINCRBY', KEYS[1], ARGV[1], -1) redis.call('PEXPIRE', KEYS[1], ARGV[2]) return 0 end\n"
                 "redis.call('DEL', KEYS[1]) return 1")
    cad_text = "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0"
    shas = {}
    for k, t in [('acq', acq_text), ('rel', rel_text), ('take', take_text), ('give', give_text), ('cad', cad_text)]:
        shas[k] = c.call('SCRIPT', 'LOAD', t).decode()
    prefix = 'redmutex-saturation:1764166000000000000:lock-1000:'
    holder = '3f2a9c1e-5b7d-4e2f-8a1b-9c3d5e7f1a2b:7'

    def lock_keys(n):
        tag = '{n%d}' % n
        return [prefix + tag, prefix + '!fence:' + tag, prefix + '!queue:' + tag,
                prefix + '!waiters:' + tag, prefix + '!rw:' + tag, prefix + '!sem:' + tag,
                prefix + '!latch:' + tag]

    def script(kind, name, keys, args):
        if fcall:
            return resp('FCALL', name, len(keys), *keys, *args)
        return resp('EVALSHA', shas[kind], len(keys), *keys, *args)

    def lock_pair(n):
        k = lock_keys(n)
        if a.argv == 'old':
            acq = script('acq', 'rm_acquire', k, [holder, 30000, 0, 0, 0, 0, 0])
        elif a.argv == 'short':
            acq = script('acq', 'rm_acquire', k, [holder, 30000, 0, 0])
        elif a.argv == 'lean':
            acq = script('acq', 'rm_acquire', k, [holder, 30000])
        else:
            raise SystemExit('argv format ' + a.argv)
        # lean: a release of one level needing no lease sends the holder id alone (i29-lean)
        rel = script('rel', 'rm_release', k[:4], [holder] if a.argv == 'lean' else [holder, 0, 1])
        return acq + rel

    def hashfloor_pair(n):
        key = prefix.replace('lock', 'hashfloor') + 'hashfloor:n%d' % n
        if fcall:
            return (resp('FCALL', 'hashfloor_take', 1, key, holder, 30000) +
                    resp('FCALL', 'hashfloor_give', 1, key, holder, 30000))
        return (resp('EVALSHA', shas['take'], 1, key, holder, 30000) +
                resp('EVALSHA', shas['give'], 1, key, holder, 30000))

    seq = [0]
    def naive_pair(n):
        key = prefix.replace('lock', 'naive') + 'naive:n%d' % n
        seq[0] += 1
        tok = '12345:%d:%d' % (n % 4, seq[0])
        return resp('SET', key, tok, 'NX', 'PX', 30000) + resp('EVALSHA', shas['cad'], 1, key, tok)

    if fcall:
        exp = ("#!lua name=exp\n"
               "redis.register_function('exp_take', function(keys, args)\n"
               "if redis.call('EXISTS', keys[1]) == 0 then redis.call('HSET', keys[1], args[1], 1) redis.call('PEXPIRE', keys[1], args[2]) return 1 end\n"
               "return 0 end)\n"
               "redis.register_function('exp_take15', function(keys, args)\n"
               "local a, b, c = keys[5], keys[6], keys[7]\n"
               "if redis.call('EXISTS', keys[1], keys[3], keys[3], a, a, a, a, b, b, b, b, c, c, c, c) == 0 then redis.call('HSET', keys[1], args[1], 1) redis.call('PEXPIRE', keys[1], args[2]) return 1 end\n"
               "return 0 end)\n"
               "redis.register_function('exp_take8', function(keys, args)\n"
               "local a, b, c = keys[5], keys[6], keys[7]\n"
               "if redis.call('EXISTS', keys[1], keys[3], a, a, b, b, c, c) == 0 then redis.call('HSET', keys[1], args[1], 1) redis.call('PEXPIRE', keys[1], args[2]) return 1 end\n"
               "return 0 end)\n"
               "redis.register_function('exp_give', function(keys, args)\n"
               "local n = redis.call('HGET', keys[1], args[1]) if not n then return -1 end\n"
               "redis.call('DEL', keys[1]) return 1 end)\n"
               "redis.register_function('exp_give_lindex', function(keys, args)\n"
               "local n = redis.call('HGET', keys[1], args[1]) if not n then return -1 end\n"
               "redis.call('DEL', keys[1]) redis.call('LINDEX', keys[3], 0) return 1 end)\n")
        c.call('FUNCTION', 'LOAD', 'REPLACE', exp)

    def exp_pair(take, give, nargs_take):
        def f(n):
            k = lock_keys(n)
            args = [holder, 30000, 0, 0, 0, 0, 0][:nargs_take]
            return (resp('FCALL', take, 7, *k, *args) +
                    resp('FCALL', give, 4, *k[:4], holder, 0, 1))
        return f

    makers = {'lock': lock_pair, 'hashfloor': hashfloor_pair, 'naive': naive_pair,
              # argv of Lock, work of hashfloor
              'x_argv': exp_pair('exp_take', 'exp_give', 7),
              'x_argv4': exp_pair('exp_take', 'exp_give', 4),
              # + the 15-key EXISTS
              'x_exists15': exp_pair('exp_take15', 'exp_give', 7),
              'x_exists8': exp_pair('exp_take8', 'exp_give', 7),
              # + the release's LINDEX
              'x_lindex': exp_pair('exp_take15', 'exp_give_lindex', 7)}
    bad = [k for k in a.kinds.split(',') if k.startswith('x_') and not fcall]
    if bad:
        raise SystemExit('%s: the x_ kinds are functions of their own, FCALL only (Redis 7.0+, no --evalsha)' % ','.join(bad))
    rng = random.Random(7)
    names = [rng.randrange(1000) for _ in range(a.n)]
    # Check the replies of one pair of each kind once.
    for kind in a.kinds.split(','):
        out = c.pipe(makers[kind](999), 2)
        print('# %s replies: %r' % (kind, out), file=sys.stderr)
    results = {}
    for rep in range(a.reps):
        for kind in a.kinds.split(','):
            payloads = []
            for i in range(0, a.n, a.batch):
                payloads.append((b''.join(makers[kind](n) for n in names[i:i + a.batch]),
                                 2 * len(names[i:i + a.batch])))
            s0, t0 = stats(c), cpu(c)
            for p, cnt in payloads:
                c.pipe(p, cnt)
            t1, s1 = cpu(c), stats(c)
            us = (t1 - t0) / a.n * 1e6
            ex = sum(s1.get(k, 0) - s0.get(k, 0) for k in s1 if k not in ('info',)) / a.n
            results.setdefault(kind, []).append((us, ex))
    print('server %s, %s, %d pairs x %d reps, batch %d, argv %s' % (
        version, 'FCALL' if fcall else 'EVALSHA', a.n, a.reps, a.batch, a.argv))
    base = {}
    for kind, rs in results.items():
        best = min(r[0] for r in rs)
        med = sorted(r[0] for r in rs)[len(rs) // 2]
        base[kind] = med
        print('  %-10s us/pair median %.2f (best %.2f; runs %s)  executed/pair %.2f' % (
            kind, med, best, ' '.join('%.2f' % r[0] for r in rs), rs[0][1]))
    if 'lock' in base and 'hashfloor' in base:
        print('  lock/hashfloor %.3f' % (base['lock'] / base['hashfloor']))
    if 'lock' in base and 'naive' in base:
        print('  naive/lock (acq per CPU s x naive) %.3f' % (base['naive'] / base['lock']))

if __name__ == '__main__':
    main()
