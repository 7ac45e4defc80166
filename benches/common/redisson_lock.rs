//! Redisson's `RLock` as a bench peer (issue 41): its scripts' commands and its waiters'
//! wake-ups, written here from Redisson 3.x's documented behaviour (our code, not its).

use std::collections::HashMap;
use std::io::{BufReader, Write as _};
use std::net::TcpStream;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use super::REDISSON_FAIR_BODIES;

/// How long a latch key remembers an unlock's result: Redisson's response timeout plus
/// its retry attempts times their interval (long enough for a retried unlock to find
/// it), 3 s + 3 x 1.5 s with its usual defaults.
pub const UNLOCK_LATCH_PX_MS: u64 = 7_500;

/// A wait that no message nor TTL ends sooner fails the bench instead of hanging it.
const STUCK: Duration = Duration::from_secs(60);

/// The scripts, written against `keys` and `args` (a function's parameters); the EVALSHA
/// text reads `KEYS` and `ARGV` instead.
/// lock KEYS: the lock hash; ARGV: lease ms, holder. nil when taken (or re-entered),
/// else the lock's PTTL.
/// unlock KEYS: the lock hash, its channel, this unlock request's latch key; ARGV: the
/// unlock message, lease ms, holder, latch PX ms. A latch already set: its remembered
/// result; not the holder: nil; 0 when levels are left, 1 when freed (and published).
const REDISSON_BODIES: [(&str, &str); 2] = [
    (
        "redisson_lock",
        r#"
if redis.call('EXISTS', keys[1]) == 0 or redis.call('HEXISTS', keys[1], args[2]) == 1 then
    redis.call('HINCRBY', keys[1], args[2], 1)
    redis.call('PEXPIRE', keys[1], args[1])
    return nil
end
return redis.call('PTTL', keys[1])
"#,
    ),
    (
        "redisson_unlock",
        r#"
local seen = redis.call('GET', keys[3])
if seen then
    return tonumber(seen)
end
if redis.call('HEXISTS', keys[1], args[3]) == 0 then
    return nil
end
if redis.call('HINCRBY', keys[1], args[3], -1) > 0 then
    redis.call('PEXPIRE', keys[1], args[2])
    redis.call('SET', keys[3], 0, 'PX', args[4])
    return 0
end
redis.call('DEL', keys[1])
redis.call('PUBLISH', keys[2], args[1])
redis.call('SET', keys[3], 1, 'PX', args[4])
return 1
"#,
    ),
];

/// The function library of the Redisson peers (Redis 7.0+, Valkey).
const REDISSON_LIBRARY: &str = "redmutex_bench_redisson";

/// Loads (or replaces) the Redisson peers' function library: once, before the workers start.
pub fn load_redisson_library(con: &mut redis::Connection) {
    let mut code = format!("#!lua name={REDISSON_LIBRARY}\n");
    for (name, body) in REDISSON_BODIES.iter().chain(&REDISSON_FAIR_BODIES) {
        code.push_str(&format!(
            "redis.register_function('{name}', function(keys, args){body}end)\n"
        ));
    }
    let _: String = redis::cmd("FUNCTION")
        .arg("LOAD")
        .arg("REPLACE")
        .arg(code)
        .query(con)
        .expect("FUNCTION LOAD the Redisson peers' library");
}

/// One of the Redisson peers' scripts, run as FCALL of their library or as EVALSHA.
pub(super) struct PeerScript {
    name: &'static str,
    fcall: bool,
    script: redis::Script,
}

impl PeerScript {
    pub(super) fn new(name: &'static str, fcall: bool) -> PeerScript {
        let (_, body) = REDISSON_BODIES
            .iter()
            .chain(&REDISSON_FAIR_BODIES)
            .find(|(n, _)| *n == name)
            .expect("a Redisson peer body");
        PeerScript {
            name,
            fcall,
            script: redis::Script::new(&body.replace("keys[", "KEYS[").replace("args[", "ARGV[")),
        }
    }

    pub(super) fn call(
        &self,
        con: &mut redis::Connection,
        keys: &[&str],
        args: &[&str],
    ) -> Option<i64> {
        if self.fcall {
            redis::cmd("FCALL")
                .arg(self.name)
                .arg(keys.len())
                .arg(keys)
                .arg(args)
                .query(con)
        } else {
            let mut call = self.script.prepare_invoke();
            for k in keys {
                call.key(*k);
            }
            for a in args {
                call.arg(*a);
            }
            call.invoke(con)
        }
        .unwrap_or_else(|e| panic!("{}: {e}", self.name))
    }
}

/// A fresh unlock request id (Redisson's are random too): the latch key's suffix.
pub(super) fn request_id() -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    format!(
        "{:016x}{:08x}{:08x}",
        super::mono_ns(),
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}

/// What one process knows of a channel it listens on for its waiting threads.
#[derive(Default)]
struct Channel {
    /// Threads of this process waiting on it: subscribed while above 0.
    waiters: usize,
    /// SUBSCRIBEs sent, and confirmed by the server (a waiter retries only once its own
    /// is confirmed, so no message it needs can be missed).
    sent: u64,
    confirmed: u64,
    /// Messages received and not yet taken: each lets one waiting thread retry (Redisson's
    /// per-process semaphore, released once per message).
    permits: usize,
}

/// One process's pub/sub connection, shared by its threads as Redisson shares one per
/// client: a channel is subscribed when the first thread of the process waits on it and
/// unsubscribed when the last stops waiting, so a lock nobody waits on costs its unlock a
/// PUBLISH to no one, as with Redisson.
pub struct PubSub {
    writer: Mutex<TcpStream>,
    channels: Mutex<HashMap<String, Channel>>,
    changed: Condvar,
}

impl PubSub {
    /// Connects to `url` (`redis://host:port/`, no password: the bench's own server) and
    /// starts the thread that reads its messages.
    pub fn connect(url: &str) -> Arc<PubSub> {
        let addr = url
            .strip_prefix("redis://")
            .and_then(|rest| rest.split('/').next())
            .filter(|a| !a.contains('@'))
            .unwrap_or_else(|| panic!("the Redisson peers need a redis://host:port URL: {url}"));
        let stream = TcpStream::connect(addr).expect("connect the pub/sub connection");
        stream.set_nodelay(true).expect("TCP_NODELAY");
        let reader = stream.try_clone().expect("clone the pub/sub stream");
        let ps = Arc::new(PubSub {
            writer: Mutex::new(stream),
            channels: Mutex::new(HashMap::new()),
            changed: Condvar::new(),
        });
        let me = ps.clone();
        std::thread::spawn(move || me.read(reader));
        ps
    }

    fn read(&self, stream: TcpStream) {
        let mut reader = BufReader::new(stream);
        let mut parser = redis::Parser::new();
        loop {
            let Ok(value) = parser.parse_value(&mut reader) else {
                // The process is ending (or the server went away: its waiters time out).
                return;
            };
            let parts: Vec<redis::Value> = redis::from_redis_value(value).expect("a push");
            let kind: String = redis::from_redis_value(parts[0].clone()).expect("push kind");
            let channel: String = redis::from_redis_value(parts[1].clone()).expect("channel");
            let mut channels = self.channels.lock().expect("channels");
            let c = channels.entry(channel).or_default();
            match kind.as_str() {
                "subscribe" => c.confirmed += 1,
                "message" => c.permits += 1,
                _ => continue,
            }
            self.changed.notify_all();
        }
    }

    fn send(&self, command: &str, channel: &str) {
        let packed = redis::cmd(command).arg(channel).get_packed_command();
        self.writer
            .lock()
            .expect("pub/sub writer")
            .write_all(&packed)
            .expect("send to the pub/sub connection");
    }

    /// This thread waits on `channel` from now on: subscribes when it is the process's
    /// first waiter there; returns once the subscription is confirmed.
    pub fn join(&self, channel: &str) {
        let mut channels = self.channels.lock().expect("channels");
        let c = channels.entry(channel.to_owned()).or_default();
        c.waiters += 1;
        if c.waiters == 1 {
            c.permits = 0;
            c.sent += 1;
            self.send("SUBSCRIBE", channel);
        }
        let need = c.sent;
        let deadline = Instant::now() + STUCK;
        while channels[channel].confirmed < need {
            let left = deadline
                .checked_duration_since(Instant::now())
                .expect("SUBSCRIBE not confirmed within a minute");
            channels = self
                .changed
                .wait_timeout(channels, left)
                .expect("channels")
                .0;
        }
    }

    /// This thread stops waiting on `channel`: unsubscribes after the process's last waiter.
    pub fn leave(&self, channel: &str) {
        let mut channels = self.channels.lock().expect("channels");
        let c = channels.get_mut(channel).expect("a joined channel");
        c.waiters -= 1;
        if c.waiters == 0 {
            self.send("UNSUBSCRIBE", channel);
        }
    }

    /// Waits for a message on `channel` (joined) to let this thread retry, or `timeout`.
    pub fn wait(&self, channel: &str, timeout: Duration) {
        let deadline = Instant::now() + timeout.min(STUCK);
        let mut channels = self.channels.lock().expect("channels");
        loop {
            let c = channels.get_mut(channel).expect("a joined channel");
            if c.permits > 0 {
                c.permits -= 1;
                return;
            }
            let Some(left) = deadline.checked_duration_since(Instant::now()) else {
                return;
            };
            channels = self
                .changed
                .wait_timeout(channels, left)
                .expect("channels")
                .0;
        }
    }
}

/// The wait after a try that replied `ttl` ms (negative: the key has no expiry).
pub(super) fn ttl_wait(ttl: i64) -> Duration {
    u64::try_from(ttl).map_or(STUCK, Duration::from_millis)
}

/// Redisson 3.x's `RLock` (reentrant, not fair), as the `redisson` row runs it: the
/// lock script (`EXISTS`, else `HEXISTS` the holder's field; `HINCRBY` + `PEXPIRE` the
/// watchdog's 30 s lease, reply nil; else reply `PTTL`) and the unlock script (`GET` of
/// this request's unlock latch, `HEXISTS`, `HINCRBY -1`, then `PEXPIRE` or `DEL` +
/// `PUBLISH` on the lock's channel, and `SET` of the latch `PX` a few seconds). A waiter
/// subscribes its process to the lock's channel, retries, and after each failed retry
/// waits for a message (one waiting thread per process retries per message) or the
/// holder's TTL. No watchdog renewal: a run is shorter than the lease.
pub struct RedissonLock {
    lock: PeerScript,
    unlock: PeerScript,
}

impl RedissonLock {
    /// Run as FCALL of the peers' library ([`load_redisson_library`], loaded first) or as
    /// EVALSHA (as Redisson runs its scripts).
    pub fn new(fcall: bool) -> RedissonLock {
        RedissonLock {
            lock: PeerScript::new("redisson_lock", fcall),
            unlock: PeerScript::new("redisson_unlock", fcall),
        }
    }

    /// Redisson's lock channel of the lock hash `key`.
    pub fn channel(prefix: &str, name: &str) -> String {
        format!("{prefix}redisson_lock__channel:{{{name}}}")
    }

    fn try_lock(
        &self,
        con: &mut redis::Connection,
        key: &str,
        holder: &str,
        lease: &str,
    ) -> Option<i64> {
        self.lock.call(con, &[key], &[lease, holder])
    }

    /// Takes `key` as `holder`, waiting as Redisson's `lock()` does.
    pub fn lock(
        &self,
        con: &mut redis::Connection,
        ps: &PubSub,
        key: &str,
        channel: &str,
        holder: &str,
        lease_ms: u64,
    ) {
        let lease = lease_ms.to_string();
        if self.try_lock(con, key, holder, &lease).is_none() {
            return;
        }
        ps.join(channel);
        while let Some(ttl) = self.try_lock(con, key, holder, &lease) {
            ps.wait(channel, ttl_wait(ttl));
        }
        ps.leave(channel);
    }

    /// Gives one level of `key` back; fails the bench if `holder` did not hold it.
    pub fn unlock(
        &self,
        con: &mut redis::Connection,
        key: &str,
        channel: &str,
        holder: &str,
        lease_ms: u64,
    ) {
        let latch = format!("{key}:redisson_unlock_latch:{}", request_id());
        let r = self.unlock.call(
            con,
            &[key, channel, &latch],
            &[
                "0",
                &lease_ms.to_string(),
                holder,
                &UNLOCK_LATCH_PX_MS.to_string(),
            ],
        );
        assert!(r.is_some(), "the redisson lock was not ours any more");
    }
}
