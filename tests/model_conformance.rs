//! The Lua scripts against the protocol model (issue 40, docs/protocol.md): random
//! sequences of the model's server-side actions, each run on a real Redis through the
//! library's typed script calls (`redmutex::__conformance`, feature `conformance`) and in
//! `redmutex_model::conformance::Server`; after every step the server's records
//! (`HGETALL`, `PTTL`, `LRANGE`, `GET`, `TIME`) are abstracted into the model's `Records`
//! and compared with the model's, the reply with the model's reply, and the messages the
//! step published (grants, wake-ups, control notices) with the model's.
//!
//! Time is a step of its own, never a race: leases and entries are long (an hour), and a
//! hold's end is `PEXPIRE` of a few ms and a wait until the key is gone; an entry's end,
//! and its passing the starvation bound, are its fields set in the past. A fresh entry's
//! `since` (the server's time when it joined, so young for 2 ms only) is set far in the
//! future right after the step that made it, so that it stays young until a step ages it.
//!
//! Seeded: `REDMUTEX_CONFORMANCE_SEED=<seed>` replays one episode (a failure prints it);
//! `REDMUTEX_CONFORMANCE_STEPS` sets the steps per path (10,000 by default). A failure
//! prints the shortest failing sequence found (steps removed one by one while it still
//! fails), numbered, with the server's and the model's records.

mod support;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use redis::Value;
use redmutex::__conformance::{control_channel, Keys, Kind, Scripts};
use redmutex_model::conformance::{Outcome, Server, NOW};
use redmutex_model::{Entry, Hold, Holder, Msg, Records, Reply, Tick};
use redmutex_model::{ENTRY_TTL, PICKUP, WATCHDOG};
use support::RedisServer;

const CLIENTS: u8 = 4;
/// The watchdog's lease in these steps: long enough that no hold ends by itself.
const LEASE_MS: u64 = 3_600_000;
/// A fixed lease (`lock_with_lease`): long too (the model's server keeps one lease).
const FIXED_MS: u64 = 2_400_000;
/// A queue entry's life.
const ENTRY_MS: u64 = 3_600_000;
/// `force_unlock`'s memory of its call id.
const FORCED_MS: u64 = 3_600_000;
/// The pickup window of a handoff (`lease.rs`'s `PICKUP`): a hold with at most this left
/// is one handed on and not yet confirmed.
const PICKUP_MS: i64 = 1_000;
/// A `since` in the far future: the entry stays younger than the starvation bound.
const YOUNG_FOR_EVER: u64 = 9_000_000_000_000;
/// Steps per episode: each episode is a fresh name (so holder and ticket numbers stay
/// small), and a failure is shrunk within its episode.
const EPISODE: usize = 200;
const PREFIX: &str = "cf:";

fn client_id(c: u8) -> String {
    format!("client{c}")
}

/// One step: a script call with its arguments, or time moving for one record.
#[derive(Clone, Debug)]
enum Step {
    /// acquire.lua by hold `gen` of client `c` (a new call when `expected` is 0).
    Acquire {
        c: u8,
        gen: u8,
        kind: Kind,
        expected: u8,
        queue: bool,
        ticket: u8,
        fixed: bool,
    },
    /// release.lua of one level of `expected` (a late one when `gen` is an earlier hold).
    Release { c: u8, gen: u8, expected: u8 },
    /// renew.lua: the watchdog's round, or a pick-up's confirmation.
    Renew { c: u8, gen: u8 },
    /// renew.lua's queue part: the waiter's entry kept alive.
    Refresh { c: u8, gen: u8 },
    /// cancel.lua: a waiter gives up.
    Cancel { c: u8, gen: u8 },
    /// kick.lua.
    Kick,
    /// force_unlock.lua as call `id` (a repeat when it ran before).
    ForceUnlock { id: u8 },
    /// The hold's key expires (PEXPIRE 3 ms, then wait until it is gone).
    ExpireHold,
    /// Hold `gen` of client `c`'s queue entry lapses.
    ExpireEntry { c: u8, gen: u8 },
    /// Its entry waits past the starvation bound.
    AgeEntry { c: u8, gen: u8 },
    /// Client `c` listens on its inbox, or stops (a pub/sub connection down).
    Listen { c: u8, on: bool },
}

/// splitmix64: the steps are a function of the seed and the model's records.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }
}

/// What the driver keeps between steps to make the next: each client's current hold
/// number, kind and next ticket, the last force_unlock id.
struct Driver {
    gens: Vec<u8>,
    kinds: Vec<Kind>,
    tickets: Vec<u8>,
    listening: Vec<bool>,
    forced: u8,
}

impl Driver {
    fn new() -> Driver {
        let n = CLIENTS as usize;
        Driver {
            gens: vec![0; n],
            kinds: vec![Kind::Plain; n],
            tickets: vec![0; n],
            listening: vec![true; n],
            forced: 0,
        }
    }

    fn ticket(&mut self, c: u8) -> u8 {
        let t = &mut self.tickets[c as usize];
        *t = *t % 250 + 1;
        *t
    }

    /// The next step: any call of any client, with arguments a client could send (and some
    /// it sends only late or repeated); a hold in its pickup window is confirmed, released
    /// or let expire at once (a real client has a second for it).
    fn choose(&mut self, rng: &mut Rng, rec: &Records) -> Step {
        if let Some(h) = rec.hold.as_ref().filter(|h| h.end <= NOW + PICKUP) {
            let (c, gen) = h.holder;
            let current = self.gens[c as usize] == gen;
            return match rng.below(3) {
                0 if current => Step::Renew { c, gen },
                1 if current => Step::Release {
                    c,
                    gen,
                    expected: 1,
                },
                _ => Step::ExpireHold,
            };
        }
        let c = rng.below(CLIENTS as u64) as u8;
        let i = c as usize;
        let gen = self.gens[i];
        let count_of = |g: u8| {
            rec.hold
                .as_ref()
                .filter(|h| h.holder == (c, g))
                .map_or(0, |h| h.count)
        };
        let queued: Vec<Holder> = rec.queue.iter().map(|e| e.holder).collect();
        let roll = rng.below(100);
        match roll {
            0..=21 => {
                let gen = gen + 1;
                self.gens[i] = gen;
                let mut kinds = vec![Kind::Plain];
                if c % 2 == 1 {
                    kinds.push(Kind::Fair);
                }
                if c != 1 {
                    kinds.push(Kind::Fenced);
                }
                let kind = kinds[rng.below(kinds.len() as u64) as usize];
                self.kinds[i] = kind;
                Step::Acquire {
                    c,
                    gen,
                    kind,
                    expected: 0,
                    queue: rng.chance(70),
                    ticket: self.ticket(c),
                    fixed: rng.chance(20),
                }
            }
            22..=33 if gen > 0 => {
                // A re-entry, or a repeat of a call whose reply was lost (the levels it
                // believes it holds may be fewer than the server has).
                let held = count_of(gen);
                let expected = if rng.chance(70) {
                    held
                } else {
                    rng.below(held as u64 + 1) as u8
                };
                Step::Acquire {
                    c,
                    gen,
                    kind: self.kinds[i],
                    expected,
                    queue: rng.chance(60),
                    ticket: self.ticket(c),
                    fixed: rng.chance(20),
                }
            }
            34..=49 if gen > 0 => {
                // Now and then a late release of the client's earlier hold.
                let gen = if gen > 1 && rng.chance(15) {
                    gen - 1
                } else {
                    gen
                };
                let held = count_of(gen);
                let expected = if held > 0 && rng.chance(85) {
                    held
                } else {
                    1 + rng.below(2) as u8
                };
                Step::Release { c, gen, expected }
            }
            50..=56 if gen > 0 => Step::Renew { c, gen },
            57..=61 if gen > 0 => Step::Refresh { c, gen },
            62..=67 if gen > 0 => Step::Cancel { c, gen },
            68..=72 => Step::Kick,
            73..=75 => {
                if self.forced == 0 || rng.chance(75) {
                    self.forced += 1;
                }
                Step::ForceUnlock { id: self.forced }
            }
            76..=81 if rec.hold.is_some() => Step::ExpireHold,
            82..=95 if !queued.is_empty() => {
                let (c, gen) = queued[rng.below(queued.len() as u64) as usize];
                if roll < 88 {
                    Step::ExpireEntry { c, gen }
                } else {
                    Step::AgeEntry { c, gen }
                }
            }
            96..=99 => {
                let on = !self.listening[i];
                self.listening[i] = on;
                Step::Listen { c, on }
            }
            _ => Step::Kick,
        }
    }
}

fn holder_id(c: u8, gen: u8) -> String {
    format!("{}:{gen}", client_id(c))
}

/// One episode's name on one server: runs steps on Redis and in the model.
struct Episode<'a> {
    scripts: &'a mut Scripts,
    pubsub: redis::PubSub<'a>,
    server: Server,
    keys: Vec<Keys>,
    sentinel: String,
    /// The real fencing counter's value when the model's counter was 1.
    fence_base: Option<u64>,
    /// The server's records as last read, for the report.
    last_real: String,
    seen: Seen,
}

static NAMES: AtomicU64 = AtomicU64::new(0);

/// What the run exercised (so that a run that tried nothing cannot pass): grants handed
/// on, wake-ups, control notices, re-entries, fenced grants, queued replies.
#[derive(Default, Debug)]
struct Seen {
    handoffs: usize,
    wakeups: usize,
    notices: usize,
    reentries: usize,
    fenced: usize,
    queued: usize,
}

impl<'a> Episode<'a> {
    fn new(scripts: &'a mut Scripts, sub: &'a mut redis::Connection, tag: &str) -> Episode<'a> {
        let n = NAMES.fetch_add(1, Ordering::Relaxed);
        let name = format!("{tag}-{n}");
        let keys: Vec<Keys> = (0..CLIENTS)
            .map(|c| Keys::new(PREFIX, &name, &client_id(c), Kind::Plain))
            .collect();
        let sentinel = format!("{PREFIX}sentinel:{name}");
        let mut pubsub = sub.as_pubsub();
        pubsub
            .set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        for (c, k) in keys.iter().enumerate() {
            pubsub.subscribe(k.inbox()).unwrap();
            pubsub
                .subscribe(control_channel(PREFIX, &client_id(c as u8)))
                .unwrap();
        }
        pubsub.subscribe(&sentinel).unwrap();
        Episode {
            scripts,
            pubsub,
            server: Server::new(CLIENTS),
            keys,
            sentinel,
            fence_base: None,
            last_real: String::new(),
            seen: Seen::default(),
        }
    }

    fn keys(&self, c: u8, kind: Kind) -> Keys {
        Keys::new(PREFIX, &self.name(), &client_id(c), kind)
    }

    fn name(&self) -> String {
        // The name is the key between the braces.
        let key = String::from_utf8(self.keys[0].key()).unwrap();
        key[key.find('{').unwrap() + 1..key.rfind('}').unwrap()].to_owned()
    }

    /// Runs `step` on both sides and compares; `Err` says how they differ.
    fn apply(&mut self, step: &Step) -> Result<(), String> {
        let k0 = self.keys(0, Kind::Plain);
        let (real, model): (Option<Value>, Outcome) = match *step {
            Step::Acquire {
                c,
                gen,
                kind,
                expected,
                queue,
                ticket,
                fixed,
            } => {
                let keys = self.keys(c, kind);
                let lease = if fixed { FIXED_MS } else { LEASE_MS };
                let join = queue.then_some((ticket as u64, ENTRY_MS));
                let v = self
                    .scripts
                    .acquire(&keys, &holder_id(c, gen), lease, expected as usize, join)
                    .map_err(|e| format!("acquire failed: {e}"))?;
                let m = self.server.acquire(
                    (c, gen),
                    kind == Kind::Fair,
                    kind == Kind::Fenced,
                    expected,
                    queue,
                    ticket,
                );
                (Some(v), m)
            }
            Step::Release { c, gen, expected } => {
                let v = self
                    .scripts
                    .release(&k0, &holder_id(c, gen), LEASE_MS, expected as usize)
                    .map_err(|e| format!("release failed: {e}"))?;
                (Some(v), self.server.release((c, gen), expected))
            }
            Step::Renew { c, gen } => {
                let v = self
                    .scripts
                    .renew(&k0, &holder_id(c, gen), LEASE_MS)
                    .map_err(|e| format!("renew failed: {e}"))?;
                (Some(v), self.server.renew((c, gen)))
            }
            Step::Refresh { c, gen } => {
                let v = self
                    .scripts
                    .refresh(&k0, &holder_id(c, gen), ENTRY_MS)
                    .map_err(|e| format!("refresh failed: {e}"))?;
                let kept = self.server.refresh((c, gen));
                let gone = !renew_lists(&v).1.is_empty();
                if gone == kept {
                    return Err(format!(
                        "renew.lua's entry refresh says gone={gone}, the model kept={kept}"
                    ));
                }
                (
                    None,
                    Outcome {
                        reply: None,
                        published: Vec::new(),
                    },
                )
            }
            Step::Cancel { c, gen } => {
                let v = self
                    .scripts
                    .cancel(&k0, &holder_id(c, gen), 0, 0, false)
                    .map_err(|e| format!("cancel failed: {e}"))?;
                (Some(v), self.server.cancel((c, gen)))
            }
            Step::Kick => {
                let v = self
                    .scripts
                    .kick(&k0)
                    .map_err(|e| format!("kick failed: {e}"))?;
                (Some(v), self.server.kick())
            }
            Step::ForceUnlock { id } => {
                let v = self
                    .scripts
                    .force_unlock(&k0, &format!("fu{id}"), FORCED_MS, PREFIX)
                    .map_err(|e| format!("force_unlock failed: {e}"))?;
                (Some(v), self.server.force_unlock(id))
            }
            Step::ExpireHold => {
                let con = self.scripts.connection();
                let key = k0.key();
                let _: i64 = redis::cmd("PEXPIRE").arg(&key).arg(3).query(con).unwrap();
                let start = Instant::now();
                while redis::cmd("EXISTS").arg(&key).query::<i64>(con).unwrap() == 1 {
                    assert!(
                        start.elapsed() < Duration::from_secs(5),
                        "a key with a PTTL of 3 ms still there after 5 s"
                    );
                    std::thread::sleep(Duration::from_millis(1));
                }
                self.server.expire_hold();
                (None, nothing())
            }
            Step::ExpireEntry { c, gen } => {
                self.rewrite_entry(&k0, &holder_id(c, gen), 0, "1");
                self.server.expire_entry((c, gen));
                (None, nothing())
            }
            Step::AgeEntry { c, gen } => {
                self.rewrite_entry(&k0, &holder_id(c, gen), 1, "1");
                self.server.age_entry((c, gen));
                (None, nothing())
            }
            Step::Listen { c, on } => {
                let inbox = self.keys[c as usize].inbox();
                if on {
                    self.pubsub.subscribe(inbox).unwrap();
                } else {
                    self.pubsub.unsubscribe(inbox).unwrap();
                }
                self.server.set_listening(c, on);
                (None, nothing())
            }
        };
        self.compare(step, real, model)
    }

    /// Sets field `i` of `holder`'s waiters entry to `value` (time moving for it).
    fn rewrite_entry(&mut self, k: &Keys, holder: &str, i: usize, value: &str) {
        let con = self.scripts.connection();
        let v: Option<String> = redis::cmd("HGET")
            .arg(k.waiters())
            .arg(holder)
            .query(con)
            .unwrap();
        let Some(v) = v else { return };
        let mut parts: Vec<String> = v.split(' ').map(str::to_owned).collect();
        parts[i] = value.to_owned();
        let _: i64 = redis::cmd("HSET")
            .arg(k.waiters())
            .arg(holder)
            .arg(parts.join(" "))
            .query(con)
            .unwrap();
    }

    fn fence_ordinal(&mut self, real: u64, model_counter: u8) -> u8 {
        let base = *self
            .fence_base
            .get_or_insert(real.wrapping_sub(model_counter.max(1) as u64 - 1));
        let d = real.wrapping_sub(base);
        if d < 200 {
            d as u8 + 1
        } else {
            u8::MAX
        }
    }

    /// Reads the name's records (one pipeline), abstracts them, publishes the sentinel
    /// and collects what the step published; compares all with the model.
    fn compare(&mut self, step: &Step, real: Option<Value>, model: Outcome) -> Result<(), String> {
        let k = self.keys(0, Kind::Plain);
        let mut pipe = redis::pipe();
        pipe.cmd("HGETALL")
            .arg(k.key())
            .cmd("PTTL")
            .arg(k.key())
            .cmd("LRANGE")
            .arg(k.queue())
            .arg(0)
            .arg(-1)
            .cmd("HGETALL")
            .arg(k.waiters())
            .cmd("GET")
            .arg(k.fence())
            .cmd("GET")
            .arg(k.forced())
            .cmd("TIME")
            .cmd("PUBLISH")
            .arg(&self.sentinel)
            .arg("s");
        type Read = (
            HashMap<String, String>,
            i64,
            Vec<String>,
            HashMap<String, String>,
            Option<u64>,
            Option<String>,
            (u64, u64),
            i64,
        );
        let (hash, pttl, list, waiters, fence, forced, time, _): Read =
            pipe.query(self.scripts.connection()).unwrap();
        let server_ms = time.0 * 1000 + time.1 / 1000;
        self.last_real = format!(
            "hash {hash:?} pttl {pttl} queue {list:?} waiters {waiters:?} fence {fence:?} forced {forced:?}"
        );
        let want = normalize(self.server.records());
        let mut fresh = Vec::new();
        let got = self.abstract_records(
            &hash,
            pttl,
            &list,
            &waiters,
            fence,
            forced.as_deref(),
            server_ms,
            want.fence_counter,
            &mut fresh,
        )?;
        // What the step published, up to the sentinel.
        let mut published = Vec::new();
        loop {
            let msg = self
                .pubsub
                .get_message()
                .map_err(|e| format!("no sentinel: {e}"))?;
            let channel = msg.get_channel_name().to_owned();
            if channel == self.sentinel {
                break;
            }
            let payload: String = msg.get_payload().unwrap();
            if let Some(m) = self.abstract_message(&channel, &payload, want.fence_counter) {
                published.push(m);
            }
        }
        // A release tells the waiters of its own client in its reply (queue.lua's `told`),
        // not on their inbox: the same messages.
        if let (Step::Release { c, .. }, Some(Value::Array(items))) = (step, &real) {
            let inbox = String::from_utf8(self.keys[*c as usize].inbox()).unwrap();
            for item in items.iter().skip(2) {
                let Value::BulkString(b) = item else {
                    return Err(format!("release.lua replied {real:?}"));
                };
                let payload = String::from_utf8_lossy(b).into_owned();
                if let Some(m) = self.abstract_message(&inbox, &payload, want.fence_counter) {
                    published.push(m);
                }
            }
        }
        published.sort();
        let mut errors = Vec::new();
        if got != want {
            errors.push(format!(
                "records differ:\n      redis: {got:?}\n      model: {want:?}"
            ));
        }
        if published != model.published {
            errors.push(format!(
                "published differ:\n      redis: {published:?}\n      model: {:?}",
                model.published
            ));
        }
        if let (Some(v), Some(r)) = (&real, &model.reply) {
            let mine = self.abstract_reply(step, v, want.fence_counter)?;
            if let Some(mine) = mine {
                if mine != *r {
                    errors.push(format!(
                        "replies differ:\n      redis: {mine:?} ({v:?})\n      model: {r:?}"
                    ));
                }
            }
        }
        if !errors.is_empty() {
            return Err(errors.join("\n    "));
        }
        for m in &model.published {
            match m {
                Msg::Grant(..) => self.seen.handoffs += 1,
                Msg::Wake(..) => self.seen.wakeups += 1,
                Msg::Forced(..) => self.seen.notices += 1,
                _ => {}
            }
        }
        match model.reply {
            Some(Reply::Granted(n, f)) => {
                self.seen.reentries += usize::from(n > 1);
                self.seen.fenced += usize::from(f > 0);
            }
            Some(Reply::Queued(..)) => self.seen.queued += 1,
            _ => {}
        }
        // A fresh entry is young for 2 ms of the server's clock: made young until a step
        // ages it (no script runs between the step that made it and this write).
        for holder in fresh {
            let since = YOUNG_FOR_EVER.to_string();
            self.rewrite_entry(&k, &holder, 1, &since);
        }
        Ok(())
    }

    fn holder_of(field: &str) -> Result<Holder, String> {
        let (client, gen) = field
            .rsplit_once(':')
            .ok_or_else(|| format!("a field {field:?} that is no holder"))?;
        let c: u8 = client
            .strip_prefix("client")
            .and_then(|c| c.parse().ok())
            .ok_or_else(|| format!("a field {field:?} of no client"))?;
        let g: u8 = gen.parse().map_err(|_| format!("a field {field:?}"))?;
        Ok((c, g))
    }

    #[allow(clippy::too_many_arguments)]
    fn abstract_records(
        &mut self,
        hash: &HashMap<String, String>,
        pttl: i64,
        list: &[String],
        waiters: &HashMap<String, String>,
        fence: Option<u64>,
        forced: Option<&str>,
        server_ms: u64,
        model_fence: u8,
        fresh: &mut Vec<String>,
    ) -> Result<Records, String> {
        let mut rec = Records::default();
        if !hash.is_empty() {
            let holders: Vec<&String> = hash.keys().filter(|f| !f.starts_with('~')).collect();
            if holders.len() != 1 {
                return Err(format!(
                    "the lock hash has {} holders: {hash:?}",
                    holders.len()
                ));
            }
            let holder = Self::holder_of(holders[0])?;
            if pttl < 0 {
                return Err(format!("the lock hash has no expiry (PTTL {pttl})"));
            }
            let marked = match hash.get("~q").map(String::as_str) {
                None => false,
                Some("1") => true,
                Some(other) => return Err(format!("a '~q' of {other:?}")),
            };
            let fence = match hash.get("~fence") {
                None => 0,
                Some(t) => {
                    let t: u64 = t.parse().map_err(|_| format!("a '~fence' of {t:?}"))?;
                    self.fence_ordinal(t, model_fence)
                }
            };
            let unknown: Vec<_> = hash
                .keys()
                .filter(|f| f.starts_with('~') && *f != "~q" && *f != "~fence")
                .collect();
            if !unknown.is_empty() {
                return Err(format!("unknown fields in the lock hash: {unknown:?}"));
            }
            rec.hold = Some(Hold {
                holder,
                count: hash[holders[0]]
                    .parse()
                    .map_err(|_| format!("a count of {:?}", hash[holders[0]]))?,
                end: end_class(pttl),
                marked,
                fence,
            });
        }
        let mut fairs = 0;
        for h in list {
            let v = waiters
                .get(h)
                .ok_or_else(|| format!("{h} queued with no waiters entry"))?;
            let parts: Vec<u64> = v
                .split(' ')
                .map(|p| p.parse().map_err(|_| format!("a waiters entry {v:?}")))
                .collect::<Result<_, _>>()?;
            let [expiry, since, lease, flags, ticket, amount] = parts[..] else {
                return Err(format!("a waiters entry {v:?}"));
            };
            if amount != 1 || flags & !3 != 0 {
                return Err(format!("a waiters entry {v:?}"));
            }
            let since = if since >= YOUNG_FOR_EVER {
                NOW
            } else if since <= 1 {
                NOW - redmutex_model::STARVE
            } else {
                // Made by this step.
                fresh.push(h.clone());
                NOW
            };
            fairs += flags & 1;
            rec.queue.push(Entry {
                holder: Self::holder_of(h)?,
                expiry: if expiry > server_ms {
                    NOW + ENTRY_TTL
                } else {
                    NOW
                },
                since,
                fair: flags & 1 == 1,
                fenced: flags & 2 == 2,
                lease: lease_class(lease as i64),
                ticket: ticket as u8,
            });
        }
        let listed: Vec<&String> = waiters.keys().filter(|f| !f.starts_with('~')).collect();
        if listed.len() != list.len() {
            return Err(format!(
                "the queue {list:?} and the waiters {waiters:?} disagree"
            ));
        }
        let counted: u64 = match waiters.get("~fair") {
            None => 0,
            Some(n) => n.parse().map_err(|_| format!("a '~fair' of {n:?}"))?,
        };
        if counted != fairs {
            return Err(format!(
                "'~fair' counts {counted} fair waiters, {fairs} are queued: {waiters:?}"
            ));
        }
        rec.fence_counter = match fence {
            None => 0,
            Some(v) => self.fence_ordinal(v, model_fence),
        };
        rec.forced = match forced {
            None => None,
            Some(id) => Some(
                id.strip_prefix("fu")
                    .and_then(|n| n.parse().ok())
                    .ok_or_else(|| format!("a forced call id {id:?}"))?,
            ),
        };
        Ok(rec)
    }

    fn abstract_message(&mut self, channel: &str, payload: &str, model_fence: u8) -> Option<Msg> {
        let parts: Vec<&str> = payload.split(' ').collect();
        for c in 0..CLIENTS {
            let inbox = String::from_utf8(self.keys[c as usize].inbox()).unwrap();
            let control = String::from_utf8(control_channel(PREFIX, &client_id(c))).unwrap();
            let num =
                |i: usize| -> u64 { parts.get(i).and_then(|p| p.parse().ok()).unwrap_or(999) };
            if channel == inbox {
                return Some(match parts[0] {
                    "g" => Msg::Grant(
                        (c, num(1) as u8),
                        num(2) as u8,
                        match num(3) {
                            0 => 0,
                            f => self.fence_ordinal(f, model_fence),
                        },
                        NOW,
                    ),
                    "w" => Msg::Wake((c, num(1) as u8), num(2) as u8),
                    _ => panic!("an inbox message {payload:?}"),
                });
            }
            if channel == control {
                let key = String::from_utf8(self.keys[0].key()).unwrap();
                // Another episode's (this client's channel is the same for every name).
                return (parts.get(2) == Some(&key.as_str()) && parts[0] == "f")
                    .then(|| Msg::Forced((c, num(1) as u8)));
            }
        }
        None
    }

    fn abstract_reply(
        &mut self,
        step: &Step,
        v: &Value,
        model_fence: u8,
    ) -> Result<Option<Reply>, String> {
        let ints = |v: &Value| -> Vec<i64> {
            match v {
                Value::Array(items) => items
                    .iter()
                    .map(|x| match x {
                        Value::Int(n) => *n,
                        Value::BulkString(b) => {
                            String::from_utf8_lossy(b).parse().unwrap_or(i64::MIN)
                        }
                        _ => i64::MIN,
                    })
                    .collect(),
                Value::Int(n) => vec![*n],
                _ => Vec::new(),
            }
        };
        Ok(match step {
            Step::Acquire { .. } => Some(match (v, ints(v).as_slice()) {
                (Value::Int(n), _) => Reply::Granted(*n as u8, 0),
                (_, [1, count, token]) => {
                    Reply::Granted(*count as u8, self.fence_ordinal(*token as u64, model_fence))
                }
                (_, [0, pttl]) => Reply::Refused(end_class(*pttl)),
                (_, [0, pttl, _now]) => Reply::Queued(end_class(*pttl), NOW),
                _ => return Err(format!("acquire.lua replied {v:?}")),
            }),
            Step::Renew { .. } => Some(if renew_lists(v).0.is_empty() {
                Reply::Renewed
            } else {
                Reply::Gone
            }),
            Step::Release { .. } | Step::Cancel { .. } => Some(Reply::Done),
            _ => None,
        })
    }
}

fn nothing() -> Outcome {
    Outcome {
        reply: None,
        published: Vec::new(),
    }
}

/// renew.lua's `{lost, gone}`.
fn renew_lists(v: &Value) -> (Vec<Value>, Vec<Value>) {
    match v {
        Value::Array(items) if items.len() == 2 => {
            let list = |x: &Value| match x {
                Value::Array(l) => l.clone(),
                _ => Vec::new(),
            };
            (list(&items[0]), list(&items[1]))
        }
        other => panic!("renew.lua replied {other:?}"),
    }
}

/// A key's remaining lease as the model's end: none, the pickup window, a lease.
fn end_class(pttl: i64) -> Tick {
    if pttl < 0 {
        NOW
    } else {
        lease_class(pttl)
    }
}

fn lease_class(ms: i64) -> Tick {
    if ms <= PICKUP_MS {
        NOW + PICKUP
    } else {
        NOW + WATCHDOG
    }
}

/// The model's records with its times in the same classes.
fn normalize(r: &Records) -> Records {
    let mut r = r.clone();
    let class = |end: Tick| {
        if end <= NOW {
            NOW
        } else if end <= NOW + PICKUP {
            NOW + PICKUP
        } else {
            NOW + WATCHDOG
        }
    };
    if let Some(h) = r.hold.as_mut() {
        h.end = class(h.end);
    }
    for e in &mut r.queue {
        e.expiry = if e.expiry > NOW { NOW + ENTRY_TTL } else { NOW };
        e.lease = if e.lease <= PICKUP {
            NOW + PICKUP
        } else {
            NOW + WATCHDOG
        };
    }
    r
}

/// Runs the steps the seed makes (or `fixed`, when shrinking) on a fresh name: the index
/// of the first failing step and why, with the steps run.
fn run_episode(
    server: &RedisServer,
    functions: bool,
    seed: u64,
    steps: usize,
    fixed: Option<&[Step]>,
    seen: &mut Seen,
) -> (Vec<Step>, Option<(usize, String, String)>) {
    let mut scripts = Scripts::new(server.connection(), functions);
    let mut sub = server.connection();
    let mut ep = Episode::new(&mut scripts, &mut sub, &format!("s{seed}"));
    let mut rng = Rng(seed);
    let mut driver = Driver::new();
    let mut ran = Vec::new();
    let n = fixed.map_or(steps, |f| f.len());
    for i in 0..n {
        let step = match fixed {
            Some(f) => f[i].clone(),
            None => driver.choose(&mut rng, ep.server.records()),
        };
        ran.push(step.clone());
        if let Err(why) = ep.apply(&step) {
            let state = format!(
                "    redis (raw): {}\n    model: {:?}",
                ep.last_real,
                ep.server.records()
            );
            return (ran, Some((i, why, state)));
        }
    }
    let e = std::mem::take(&mut ep.seen);
    seen.handoffs += e.handoffs;
    seen.wakeups += e.wakeups;
    seen.notices += e.notices;
    seen.reentries += e.reentries;
    seen.fenced += e.fenced;
    seen.queued += e.queued;
    (ran, None)
}

/// The shortest failing sequence found: steps removed one at a time, last first, while
/// the rest still fails.
fn shrink(server: &RedisServer, functions: bool, mut steps: Vec<Step>) -> Vec<Step> {
    let mut i = steps.len();
    while i > 0 {
        i -= 1;
        if i + 1 == steps.len() {
            continue;
        }
        let mut fewer = steps.clone();
        fewer.remove(i);
        if let (_, Some((at, ..))) =
            run_episode(server, functions, 0, 0, Some(&fewer), &mut Seen::default())
        {
            fewer.truncate(at + 1);
            steps = fewer;
            i = i.min(steps.len());
        }
    }
    steps
}

fn conformance(server: &RedisServer, functions: bool) {
    let steps: usize = std::env::var("REDMUTEX_CONFORMANCE_STEPS")
        .ok()
        .map_or(10_000, |s| {
            s.parse().expect("REDMUTEX_CONFORMANCE_STEPS: a number")
        });
    let (base, episodes) = match std::env::var("REDMUTEX_CONFORMANCE_SEED") {
        Ok(s) => (s.parse().expect("REDMUTEX_CONFORMANCE_SEED: a number"), 1),
        Err(_) => {
            let t = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap();
            (t.as_nanos() as u64 & 0xFFFF_FFFF, steps.div_ceil(EPISODE))
        }
    };
    let path = if functions { "FCALL" } else { "EVALSHA" };
    let start = Instant::now();
    let mut total = 0;
    let mut seen = Seen::default();
    for e in 0..episodes as u64 {
        let seed = base + e;
        let (ran, failed) = run_episode(server, functions, seed, EPISODE, None, &mut seen);
        total += ran.len();
        if let Some((at, why, state)) = failed {
            let ran = ran[..=at].to_vec();
            let short = shrink(server, functions, ran.clone());
            let (_, again) =
                run_episode(server, functions, 0, 0, Some(&short), &mut Seen::default());
            let (why, state) = again.map_or((why.clone(), state.clone()), |(_, w, s)| (w, s));
            let mut trace = String::new();
            for (i, s) in short.iter().enumerate() {
                trace.push_str(&format!("  {:>3}. {s:?}\n", i + 1));
            }
            panic!(
                "conformance ({path}): the scripts and the model differ at step {} of seed {seed} \
                 (replay: REDMUTEX_CONFORMANCE_SEED={seed}); shortest failing sequence found, \
                 {} steps:\n{trace}  after the last step:\n    {why}\n{state}",
                at + 1,
                short.len()
            );
        }
    }
    eprintln!(
        "conformance ({path}): {total} steps in {episodes} episodes from seed {base}, {:.1?}: {seen:?}",
        start.elapsed()
    );
    if episodes > 1 {
        assert!(
            seen.handoffs > 0
                && seen.wakeups > 0
                && seen.notices > 0
                && seen.reentries > 0
                && seen.fenced > 0
                && seen.queued > 0,
            "a run that did not exercise every message and reply: {seen:?}"
        );
    }
    assert!(
        total >= steps.min(EPISODE * episodes),
        "only {total} steps ran"
    );
}

#[test]
fn scripts_conform_to_the_model_with_fcall() {
    let server = RedisServer::new();
    if !support::server_kind().has_functions() {
        support::skip(
            "scripts_conform_to_the_model_with_fcall",
            "functions (the other test covers EVALSHA)",
        );
        return;
    }
    conformance(&server, true);
}

#[test]
fn scripts_conform_to_the_model_with_evalsha() {
    let server = RedisServer::new();
    conformance(&server, false);
}
