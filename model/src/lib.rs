//! An exhaustive model of redmutex's lock protocol for ONE lock name, as the code implements
//! it (`lua/acquire_fast.lua`, `acquire.lua`, `queue.lua`, `release_fast.lua`,
//! `release.lua`, `levels.lua`, `renew.lua`, `cancel.lua`, `kick.lua`,
//! `force_unlock.lua`; on the client, `src/primitives/wait.rs`'s pick-up and confirmation
//! and `src/runtime/holds*.rs`'s validity), checked with `stateright`.
//!
//! See docs/protocol.md for the state, the actions, the faults, the properties, the
//! mutants and how to run it (`cargo test --release -p redmutex-model --test model --
//! --nocapture`).
#![forbid(unsafe_code)]
#![deny(missing_docs)]

pub mod conformance;

use std::fmt::Write as _;

use stateright::{Checker, HasDiscoveries, Model, Property};

/// Real time and every clock is counted in ticks: a tick is the smallest duration the
/// model tells apart (the 2 ms starvation bound is one).
pub type Tick = u8;

/// The watchdog lease (`watchdog_timeout`), in ticks.
pub const WATCHDOG: Tick = 3;
/// A fixed lease (`lock_with_lease`), in ticks: never renewed.
pub const FIXED: Tick = 2;
/// The pickup window of a handoff (`lease.rs`'s `PICKUP`), in ticks.
pub const PICKUP: Tick = 1;
/// The starvation bound (`STARVATION_BOUND`): a plain caller may pass the queue while the
/// first waiter has waited less.
pub const STARVE: Tick = 1;
/// How long a queue entry lives unless refreshed (`entry_ttl_ms`: at most a watchdog
/// timeout; shorter here, so that entries lapse within the horizon).
pub const ENTRY_TTL: Tick = 2;

/// A hole the project had once, put back into the model: each must make the run fail.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Mutant {
    /// Review 3: a handed-over hold's validity counted from when the grant's message
    /// arrived, not from when the waiter's attempt was sent.
    LateGrant,
    /// Review 4: a guard that still says held past its own validity.
    GrantPastValidity,
    /// The release deletes the lock whoever holds it (no holder-id check).
    ReleaseWithoutOwnerCheck,
    /// `Q.head` does not drop lapsed entries: a handoff to a waiter that stopped waiting.
    HandoffToExpiredEntry,
    /// A grant heard after a topology change is picked up without a confirmation: its
    /// server time came from another server's clock.
    UnconfirmedEpochGrant,
    /// `force_unlock` does not tell the holder's client on its control channel.
    ForceUnlockNotTold,
    /// Finding 1 (docs/protocol.md): a `force_unlock` notice that reaches the client
    /// before its hold is registered is dropped (`force_unlocked` finds no hold), as it
    /// was before the fix.
    ForceUnlockNoticeDropped,
    /// Finding 2 (docs/protocol.md): with `sync_replicas`, a watchdog renewal is not
    /// WAITed for, yet extends the guard's validity, as before the fix.
    RenewalNotReplicated,
}

impl Mutant {
    /// Every mutant, in the order `REDMUTEX_MODEL_MUTANT=list` prints them.
    pub const ALL: [Mutant; 8] = [
        Mutant::LateGrant,
        Mutant::GrantPastValidity,
        Mutant::ReleaseWithoutOwnerCheck,
        Mutant::HandoffToExpiredEntry,
        Mutant::UnconfirmedEpochGrant,
        Mutant::ForceUnlockNotTold,
        Mutant::ForceUnlockNoticeDropped,
        Mutant::RenewalNotReplicated,
    ];

    /// The name `REDMUTEX_MODEL_MUTANT` takes.
    pub fn name(self) -> &'static str {
        match self {
            Mutant::LateGrant => "late_grant",
            Mutant::GrantPastValidity => "grant_past_validity",
            Mutant::ReleaseWithoutOwnerCheck => "release_without_owner_check",
            Mutant::HandoffToExpiredEntry => "handoff_to_expired_entry",
            Mutant::UnconfirmedEpochGrant => "unconfirmed_epoch_grant",
            Mutant::ForceUnlockNotTold => "force_unlock_not_told",
            Mutant::ForceUnlockNoticeDropped => "force_unlock_notice_dropped",
            Mutant::RenewalNotReplicated => "renewal_not_replicated",
        }
    }

    /// The mutant of that name.
    pub fn from_name(name: &str) -> Option<Mutant> {
        Mutant::ALL.into_iter().find(|m| m.name() == name)
    }
}

/// One configuration: the bounds of one exhaustive run.
#[derive(Clone, Debug)]
pub struct Config {
    /// Its name in the run's output.
    pub name: &'static str,
    /// Clients on the name (each is one thread of its own process).
    pub clients: u8,
    /// Calls (new holds) each client may make.
    pub calls: u8,
    /// Real time runs from 0 to this.
    pub horizon: Tick,
    /// Calls may be fair (`FairLock`).
    pub fair: bool,
    /// Calls may be fenced (`FencedLock`).
    pub fenced: bool,
    /// Calls may take a fixed lease instead of the watchdog's.
    pub fixed: bool,
    /// A holder may re-enter once.
    pub reentry: bool,
    /// A waiter may give up (its deadline), cancelling its queue entry.
    pub cancel: bool,
    /// Client crashes allowed.
    pub crashes: u8,
    /// Messages (requests, replies, pub/sub, control) that may be lost; a caller whose
    /// request or reply is lost repeats the call, or gives up with its outcome unknown.
    pub losses: u8,
    /// Pub/sub reconnects allowed (messages published meanwhile reach nobody).
    pub reconnects: u8,
    /// `force_unlock` calls allowed.
    pub force_unlocks: u8,
    /// Failovers allowed (the replica, with whatever it was sent, becomes the primary).
    pub failovers: u8,
    /// `sync_replicas`: acquisitions and confirmations WAIT for the replica.
    pub sync_replicas: bool,
    /// The replica's clock may be ahead of the primary's by one tick.
    pub skewed_replica: bool,
    /// Finding 1 (docs/protocol.md): a `force_unlock` notice that reached the client before
    /// its hold was registered was dropped before the fix; `false` exempts such a holder
    /// from "told" (the property as it was checked then), `true` (the default) checks it.
    pub strict_told: bool,
    /// Finding 2 (docs/protocol.md): with `sync_replicas`, a watchdog renewal is not
    /// WAITed, so a failover may shorten a hold its client counts from the renewal;
    /// `false` exempts such a holder from exclusion, `true` checks it (and fails).
    pub strict_renewal: bool,
    /// Weak fairness for the liveness properties: time does not pass while a message is
    /// in flight or a waiter's timer or entry refresh is due (every process takes its
    /// due step within the tick).
    pub urgent: bool,
    /// Faults happen only before this real time (liveness: none from some point on).
    pub calm: Tick,
    /// The mutant switched on, if any.
    pub mutant: Option<Mutant>,
}

impl Config {
    /// A configuration with no option and no fault.
    pub const fn base(name: &'static str) -> Config {
        Config {
            name,
            clients: 3,
            calls: 1,
            horizon: 3,
            fair: false,
            fenced: false,
            fixed: false,
            reentry: false,
            cancel: false,
            crashes: 0,
            losses: 0,
            reconnects: 0,
            force_unlocks: 0,
            failovers: 0,
            sync_replicas: false,
            skewed_replica: false,
            strict_told: true,
            strict_renewal: false,
            urgent: false,
            calm: Tick::MAX,
            mutant: None,
        }
    }
}

/// A hold's owner as the server names it: the client and which of its holds (the library
/// draws a fresh holder token for every new hold, so a late call of an earlier hold never
/// names a later one).
pub type Holder = (u8, u8);

/// The lock hash: the holder, its count, its expiry (real time), the '~q' mark and the
/// '~fence' token (0: none).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Hold {
    /// Holder field.
    pub holder: Holder,
    /// Reentry count.
    pub count: u8,
    /// The key's expiry (PTTL added to now).
    pub end: Tick,
    /// The queue mark '~q'.
    pub marked: bool,
    /// '~fence', 0 when none.
    pub fence: u8,
}

/// One queue entry (the LIST position and the waiters HASH value).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Entry {
    /// The waiting holder id.
    pub holder: Holder,
    /// Its expiry (real time).
    pub expiry: Tick,
    /// Since when it waits (real time).
    pub since: Tick,
    /// Flag 1.
    pub fair: bool,
    /// Flag 2.
    pub fenced: bool,
    /// The lease its hold needs.
    pub lease: Tick,
    /// The waiting call's ticket.
    pub ticket: u8,
}

/// What one server has of the name: what `HGETALL`, `LRANGE`, `PTTL` and `GET` of the
/// name's keys read, abstracted (the conformance test's `abstract_server_state`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct Records {
    /// The lock hash, if the key exists.
    pub hold: Option<Hold>,
    /// The queue, in LIST order, with each entry's waiters-HASH value.
    pub queue: Vec<Entry>,
    /// The fencing-token counter.
    pub fence_counter: u8,
    /// The id of the last `force_unlock` call that deleted the lock.
    pub forced: Option<u8>,
}

/// What a client's guard and waiting call know.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Client {
    /// No call, no hold.
    Idle,
    /// An attempt is out (its request or its reply in flight); `queue`: it may queue.
    Acquiring {
        /// The call's first ticket.
        first: u8,
        /// This attempt's ticket.
        ticket: u8,
        /// Its send time, on the client's clock.
        sent: Tick,
        /// Levels it believes it holds (re-entry: the count).
        expected: u8,
        /// The attempt may queue.
        queue: bool,
    },
    /// Queued; listening for a grant or a wake-up.
    Waiting {
        /// The call's first ticket.
        first: u8,
        /// The ticket of the attempt that queued it.
        ticket: u8,
        /// When that attempt was sent (client clock).
        joined: Tick,
        /// The server time its reply carried.
        queued_at: Tick,
        /// The topology epoch when it was sent.
        epoch: u8,
        /// When its timer fires (the lease end the attempt saw): it tries again then.
        until: Tick,
    },
    /// A grant heard with too little window left (or under another epoch, or with
    /// `sync_replicas`): its confirmation (renew.lua) is out.
    Confirming {
        /// The call's first ticket.
        first: u8,
        /// Its send time (client clock).
        sent: Tick,
        /// The fence the grant carried.
        fence: u8,
    },
    /// A guard.
    Holding {
        /// Levels held.
        count: u8,
        /// Its validity end on the client's clock.
        valid: Tick,
        /// Told that it lost the hold (renewal found it gone, control message).
        lost: bool,
        /// A renewal is out, sent at this time.
        renewing: Option<Tick>,
        /// The fencing token, 0 when none.
        fence: u8,
    },
    /// A release is out; the guard is gone.
    Releasing {
        /// The levels it was told.
        expected: u8,
    },
    /// An inner level's release is out; the guard keeps the outer level.
    Crashed,
}

/// What a client asks, as one script call.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Op {
    /// acquire_fast.lua + acquire.lua.
    Acquire {
        /// ARGV[3].
        expected: u8,
        /// ARGV[5].
        queue: bool,
        /// ARGV[7].
        ticket: u8,
    },
    /// release_fast.lua + release.lua.
    Release {
        /// ARGV[3].
        expected: u8,
    },
    /// renew.lua mode 'k' (a watchdog round, or a pick-up's confirmation).
    Renew,
    /// cancel.lua with ARGV[2] = 0, ARGV[4] = 0.
    Cancel,
}

/// A reply, as the client reads it.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Reply {
    /// Granted: count and fence.
    Granted(u8, u8),
    /// Not granted: the holder's lease end (client-visible as a PTTL).
    Refused(Tick),
    /// Queued, with the server's time.
    Queued(Tick, Tick),
    /// renew.lua: still held.
    Renewed,
    /// renew.lua: gone.
    Gone,
    /// A release or a cancel is done.
    Done,
}

/// A message in flight.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Msg {
    /// A script call on its way to the primary.
    Request(Holder, Op),
    /// Its reply on its way back.
    Reply(Holder, Reply),
    /// "g <token> <ticket> <fence> <now>" on the waiter's inbox.
    Grant(Holder, u8, u8, Tick),
    /// "w <token> <ticket>".
    Wake(Holder, u8),
    /// "f <token> <key>" on the holder's control channel.
    Forced(Holder),
}

/// The whole system at one instant.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct State {
    /// Real time.
    pub now: Tick,
    /// The primary's records.
    pub primary: Records,
    /// What the replica was sent.
    pub replica: Records,
    /// The primary's clock offset (server time = now + offset): the replica's becomes it.
    pub offset: Tick,
    /// Topology epoch (failovers seen).
    pub epoch: u8,
    /// Each client's view.
    pub clients: Vec<Client>,
    /// Each client's holds made so far (its holder token generation).
    pub gens: Vec<u8>,
    /// Each client's next ticket.
    pub tickets: Vec<u8>,
    /// Each client's pub/sub connection is down (reconnecting).
    pub deaf: Vec<bool>,
    /// Messages in flight (a multiset, sorted).
    pub net: Vec<Msg>,
    /// Fault budgets used: crashes, losses, reconnects, force_unlocks, failovers.
    pub used: [u8; 5],
    /// Holders whose hold an administrator took (`force_unlock`): they may believe until
    /// told; exempt from exclusion, not from being told.
    pub forced: Vec<Holder>,
    /// Holders whose hold a failover without `sync_replicas` lost (documented).
    pub rolled_back: Vec<Holder>,
    /// Holders whose `force_unlock` notice reached their client before their guard
    /// existed: kept there for the hold's registration, which is then lost (finding 1).
    pub unheard: Vec<Holder>,
    /// A handoff went to a waiter whose entry had lapsed.
    pub lapsed_handoff: bool,
    /// Holders whose hold a failover kept but shortened: the lease end their last
    /// renewal (not WAITed, even with `sync_replicas`) wrote had not reached the replica.
    pub shortened: Vec<Holder>,
    /// A call was granted while a live `FairLock` waiter stood ahead of it in the queue.
    pub out_of_order: bool,
    /// Since when (real time) the lock is free while some call waits for it (only kept
    /// with `urgent`, for the liveness property).
    pub free_since: Option<Tick>,
    /// Some call was granted (for the liveness check).
    pub granted_any: bool,
    /// A call made more attempts than the bound: the path is cut there.
    pub overflow: bool,
}

impl State {
    /// No holds, queues or messages: `n` idle clients at time 0.
    pub fn initial(n: usize) -> State {
        State {
            now: 0,
            primary: Records::default(),
            replica: Records::default(),
            offset: 0,
            epoch: 0,
            clients: vec![Client::Idle; n],
            gens: vec![0; n],
            tickets: vec![1; n],
            deaf: vec![false; n],
            net: Vec::new(),
            used: [0; 5],
            forced: Vec::new(),
            rolled_back: Vec::new(),
            unheard: Vec::new(),
            lapsed_handoff: false,
            shortened: Vec::new(),
            out_of_order: false,
            free_since: None,
            granted_any: false,
            overflow: false,
        }
    }
}

/// Attempts one call may make (the bound that keeps the state space finite).
pub const ATTEMPTS: u8 = 4;

/// A step.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Action {
    /// One tick of real time passes (every clock moves one tick; leases and entries end).
    Tick,
    /// Client starts a call: plain/fair, fenced or not, fixed lease or the watchdog's.
    Call(u8),
    /// A holder re-enters.
    Reenter(u8),
    /// A holder releases.
    Release(u8),
    /// The watchdog renews a holder's lease (or refreshes a waiter's entry).
    Renew(u8),
    /// A waiter's timer fires: it tries again.
    Retry(u8),
    /// The watchdog keeps a waiter's queue entry alive (renew.lua's queue part, run as one
    /// step: its reply only says whether the entry is gone, and then the waiter asks again).
    Refresh(u8),
    /// A waiter gives up (deadline): cancel.
    GiveUp(u8),
    /// The primary runs the request at this index of `net`.
    Serve(usize),
    /// The message at this index of `net` reaches its client.
    Deliver(usize),
    /// Fault: the message at this index of `net` is lost.
    Lose(usize),
    /// A caller whose request or reply was lost repeats it, same arguments.
    Repeat(u8),
    /// A caller gives up on a call whose outcome is unknown (its request may run late).
    Abandon(u8),
    /// Fault: a client's process dies.
    Crash(u8),
    /// Fault: a client's pub/sub connection drops.
    Disconnect(u8),
    /// Its pub/sub connection is back; a waiter tries again.
    Reconnect(u8),
    /// An administrator's `force_unlock` runs on the primary.
    ForceUnlock,
    /// kick.lua runs (a releaser's check after a handoff).
    Kick,
    /// The replica receives what the primary wrote so far.
    Replicate,
    /// Fault: failover to the replica.
    Failover,
}

/// The model of one configuration.
#[derive(Clone, Debug)]
pub struct ProtocolModel {
    /// Its bounds.
    pub cfg: Config,
}

fn client_of(m: &Msg) -> u8 {
    match m {
        Msg::Request(h, _)
        | Msg::Reply(h, _)
        | Msg::Grant(h, _, _, _)
        | Msg::Wake(h, _)
        | Msg::Forced(h) => h.0,
    }
}

impl ProtocolModel {
    fn mutant(&self, m: Mutant) -> bool {
        self.cfg.mutant == Some(m)
    }

    fn lease(&self) -> Tick {
        WATCHDOG
    }

    fn holder(&self, s: &State, c: u8) -> Holder {
        (c, s.gens[c as usize])
    }

    /// Whether client `c` believes it holds the lock now.
    pub fn believes(&self, s: &State, c: usize) -> bool {
        match &s.clients[c] {
            Client::Holding { valid, lost, .. } => {
                !lost && (s.now < *valid || self.mutant(Mutant::GrantPastValidity))
            }
            _ => false,
        }
    }

    fn send(s: &mut State, m: Msg) {
        s.net.push(m);
        s.net.sort();
    }

    // ---- the server (the Lua, on the primary) ----

    /// Drops the lapsed: the key past its PTTL (Redis's expiry).
    fn expire(s: &mut State) {
        if s.primary.hold.as_ref().is_some_and(|h| h.end <= s.now) {
            s.primary.hold = None;
        }
        if s.replica.hold.as_ref().is_some_and(|h| h.end <= s.now) {
            s.replica.hold = None;
        }
    }

    /// Q.head: the first live waiter, dropping lapsed entries in front of it.
    fn head(&self, s: &mut State) -> Option<Entry> {
        loop {
            let e = s.primary.queue.first()?.clone();
            if e.expiry > s.now || self.mutant(Mutant::HandoffToExpiredEntry) {
                return Some(e);
            }
            s.primary.queue.remove(0);
        }
    }

    /// renew.lua's queue part: `h`'s entry, if the waiters hash still has it, lives
    /// `ENTRY_TTL` from now, whether or not it had lapsed (nothing dropped it, so no
    /// message went past it: the conformance test found the script reviving one); false
    /// when it is gone.
    fn refresh_entry(s: &mut State, h: Holder) -> bool {
        let now = s.now;
        match s.primary.queue.iter_mut().find(|e| e.holder == h) {
            Some(e) => {
                e.expiry = now + ENTRY_TTL;
                true
            }
            None => false,
        }
    }

    fn remove(s: &mut State, h: Holder) -> bool {
        let before = s.primary.queue.len();
        s.primary.queue.retain(|e| e.holder != h);
        before != s.primary.queue.len()
    }

    fn draw_fence(s: &mut State) -> u8 {
        s.primary.fence_counter += 1;
        s.primary.fence_counter
    }

    fn listening(s: &State, c: u8) -> bool {
        !matches!(s.clients[c as usize], Client::Crashed) && !s.deaf[c as usize]
    }

    /// Q.hand_on: `give` hands the lock to the first live waiter; otherwise only a fair or
    /// starved one is made the holder (and only if `sure` the name is a lock), the others
    /// are told to try. Returns the holder served.
    fn hand_on(
        &self,
        s: &mut State,
        give: bool,
        me: Option<Holder>,
        free: bool,
        sure: bool,
    ) -> Option<Holder> {
        loop {
            let e = self.head(s)?;
            if Some(e.holder) == me {
                return None;
            }
            if !free && s.primary.hold.is_some() {
                return None;
            }
            let mut grant = give || e.fair || s.now.saturating_sub(e.since) >= STARVE;
            if grant && !sure {
                grant = s.primary.hold.is_some();
            }
            // queue.lua draws a fenced waiter's token before it publishes the grant, so
            // one nobody hears burns a token (harmless: tokens only need to grow).
            let fence = if grant && e.fenced {
                Self::draw_fence(s)
            } else {
                0
            };
            let heard = Self::listening(s, e.holder.0);
            if heard && !grant {
                Self::send(s, Msg::Wake(e.holder, e.ticket));
                return Some(e.holder);
            }
            s.primary.queue.remove(0);
            if heard {
                Self::send(s, Msg::Grant(e.holder, e.ticket, fence, s.now + s.offset));
                if e.expiry <= s.now {
                    s.lapsed_handoff = true;
                }
                s.primary.hold = Some(Hold {
                    holder: e.holder,
                    count: 1,
                    end: s.now + e.lease.min(PICKUP),
                    marked: true,
                    fence,
                });
                s.granted_any = true;
                return Some(e.holder);
            }
        }
    }

    fn serve(&self, s: &mut State, h: Holder, op: Op) {
        let reply = match op {
            Op::Acquire {
                expected,
                queue,
                ticket,
            } => self.acquire(s, h, expected, queue, ticket),
            Op::Release { expected } => self.release(s, h, expected),
            Op::Renew => {
                if s.primary.hold.as_ref().is_some_and(|x| x.holder == h) {
                    let hold = s.primary.hold.as_mut().unwrap();
                    hold.end = hold.end.max(s.now + WATCHDOG);
                    Reply::Renewed
                } else {
                    Reply::Gone
                }
            }
            Op::Cancel => {
                let held = s
                    .primary
                    .hold
                    .as_ref()
                    .filter(|x| x.holder == h)
                    .map(|x| x.count);
                Self::remove(s, h);
                match held {
                    // More than one level beyond the expected (0): cancel.lua leaves them
                    // (a give-up never frees a hold it did not take).
                    Some(n) if n > 1 => return self.reply(s, h, Reply::Done),
                    // One level nobody knows of: given back.
                    Some(_) => s.primary.hold = None,
                    None => {}
                }
                if s.primary.hold.is_none() {
                    // cancel.lua names no holder (`mine` nil): a starved or fair head is
                    // granted only where the script sees the name held (Q.hand_on's
                    // `sure`), so with the lock free it is woken to try (conformance).
                    self.hand_on(s, false, None, true, false);
                }
                Reply::Done
            }
        };
        self.reply(s, h, reply);
    }

    fn reply(&self, s: &mut State, h: Holder, reply: Reply) {
        // sync_replicas: a grant's reply (an acquisition, a pick-up's confirmation:
        // settle.rs) and a watchdog renewal's (holds/watchdog.rs `renew_batch`, since
        // finding 2's fix) wait for the replica to have it: the validity a reply raises is
        // then one a failover keeps. (The renewal's WAIT falling short leaves the validity
        // as it was; here the replica always answers.)
        let c = h.0 as usize;
        let confirming = matches!(s.clients[c], Client::Confirming { .. }) && s.gens[c] == h.1;
        let waited = match reply {
            Reply::Granted(..) => true,
            Reply::Renewed => confirming || !self.mutant(Mutant::RenewalNotReplicated),
            _ => false,
        };
        if self.cfg.sync_replicas && waited {
            s.replica = s.primary.clone();
        }
        Self::send(s, Msg::Reply(h, reply));
    }

    fn acquire(&self, s: &mut State, h: Holder, expected: u8, queue: bool, ticket: u8) -> Reply {
        let lease = self.lease();
        let fair = self.cfg.fair && h.0 % 2 == 1;
        let fenced = self.cfg.fenced && h.0 != 1;
        let mine_hold = s
            .primary
            .hold
            .as_ref()
            .filter(|x| x.holder == h)
            .map(|x| x.count);
        if let Some(held) = mine_hold {
            // Re-entry (or a repeated call whose first run took effect).
            let hold = s.primary.hold.as_mut().unwrap();
            let count = if held > expected {
                expected + 1
            } else {
                held + 1
            };
            hold.count = count;
            hold.end = hold.end.max(s.now + lease);
            if fenced && hold.fence == 0 {
                let f = Self::draw_fence(s);
                s.primary.hold.as_mut().unwrap().fence = f;
            }
            let fence = s.primary.hold.as_ref().unwrap().fence;
            s.granted_any = true;
            return Reply::Granted(count, fence);
        }
        let taken = s.primary.hold.clone();
        let listed = !s.primary.queue.is_empty();
        let passes = self.passes_fair_waiter(s, h);
        if taken.is_none() {
            let mut mine = true;
            if listed {
                match self.head(s) {
                    None => mine = true,
                    Some(e) if e.holder == h => {
                        s.primary.queue.remove(0);
                        mine = true;
                    }
                    Some(e) => {
                        let fairs = s.primary.queue.iter().any(|x| x.fair);
                        mine = !fair && !fairs && s.now.saturating_sub(e.since) < STARVE;
                        if !mine {
                            mine = self.hand_on(s, true, Some(h), true, true).is_none();
                        }
                        if mine {
                            Self::remove(s, h);
                        }
                    }
                }
            }
            if mine {
                s.out_of_order |= passes;
                let fence = if fenced { Self::draw_fence(s) } else { 0 };
                s.primary.hold = Some(Hold {
                    holder: h,
                    count: 1,
                    end: s.now + lease,
                    marked: listed,
                    fence,
                });
                s.granted_any = true;
                return Reply::Granted(1, fence);
            }
        }
        let end = s.primary.hold.as_ref().map_or(s.now, |x| x.end);
        if queue {
            let now = s.now;
            if let Some(e) = s.primary.queue.iter_mut().find(|e| e.holder == h) {
                e.expiry = now + ENTRY_TTL;
                e.ticket = ticket;
            } else {
                s.primary.queue.push(Entry {
                    holder: h,
                    expiry: now + ENTRY_TTL,
                    since: now,
                    fair,
                    fenced,
                    lease,
                    ticket,
                });
            }
            if let Some(x) = s.primary.hold.as_mut() {
                x.marked = true;
            }
            return Reply::Queued(end, s.now + s.offset);
        }
        Reply::Refused(end)
    }

    /// Whether granting `h` now would pass a live `FairLock` waiter queued ahead of it
    /// (a live waiter: its entry has not lapsed and its call is still waiting, listening).
    fn passes_fair_waiter(&self, s: &State, h: Holder) -> bool {
        let pos = s
            .primary
            .queue
            .iter()
            .position(|e| e.holder == h)
            .unwrap_or(s.primary.queue.len());
        s.primary.queue[..pos]
            .iter()
            .any(|e| e.fair && e.expiry > s.now && Self::waits(s, e.holder))
    }

    /// Whether holder `h`'s call is waiting for the lock (not given up, not crashed, its
    /// pub/sub connection up).
    fn waits(s: &State, h: Holder) -> bool {
        let c = h.0 as usize;
        s.gens[c] == h.1
            && !s.deaf[c]
            && matches!(
                s.clients[c],
                Client::Waiting { .. } | Client::Acquiring { expected: 0, .. }
            )
    }

    /// Work due before time may pass (`urgent`): a message in flight, a call whose
    /// request or reply was lost (its repeat), a waiter whose timer fired or whose entry
    /// would lapse at the next tick.
    fn due(&self, s: &State) -> bool {
        !s.net.is_empty()
            || (0..s.clients.len()).any(|i| {
                let h = (i as u8, s.gens[i]);
                if self.outstanding(s, i).is_some() && !Self::has_msg(s, h) {
                    return true;
                }
                match s.clients[i] {
                    Client::Waiting { until, .. } if !Self::has_msg(s, h) => {
                        s.now >= until
                            || s.primary
                                .queue
                                .iter()
                                .find(|e| e.holder == h)
                                .is_none_or(|e| e.expiry <= s.now + 1)
                    }
                    _ => false,
                }
            })
    }

    fn release(&self, s: &mut State, h: Holder, expected: u8) -> Reply {
        let owner_ok = if self.mutant(Mutant::ReleaseWithoutOwnerCheck) {
            s.primary.hold.is_some()
        } else {
            s.primary.hold.as_ref().is_some_and(|x| x.holder == h)
        };
        if !owner_ok {
            return Reply::Done;
        }
        let hold = s.primary.hold.clone().unwrap();
        if expected > 1 {
            if hold.count < expected {
                return Reply::Done;
            }
            let hold = s.primary.hold.as_mut().unwrap();
            hold.count = expected - 1;
            hold.end = s.now + WATCHDOG;
            return Reply::Done;
        }
        s.primary.hold = None;
        if hold.marked {
            // release.lua tells waiters of the releaser's own client in its reply
            // (queue.lua's `told`), not by pub/sub: they are heard whatever that client's
            // subscriber does (found by the conformance test).
            let deaf = std::mem::replace(&mut s.deaf[h.0 as usize], false);
            self.hand_on(s, false, None, true, true);
            s.deaf[h.0 as usize] = deaf;
        }
        Reply::Done
    }

    fn force_unlock(&self, s: &mut State) {
        let id = s.used[3] + 1;
        if s.primary.forced == Some(id) {
            return;
        }
        let Some(hold) = s.primary.hold.take() else {
            return;
        };
        if !self.mutant(Mutant::ForceUnlockNotTold) {
            Self::send(s, Msg::Forced(hold.holder));
        }
        s.forced.push(hold.holder);
        s.forced.sort();
        self.hand_on(s, false, None, false, false);
        s.primary.forced = Some(id);
    }

    // ---- the client ----

    fn clock(s: &State) -> Tick {
        // Client clocks run at the servers' rate (the documented 0.1% bound is below a
        // tick over any lease modelled); their offsets cancel out, as a client only
        // subtracts its own times.
        s.now
    }

    fn deliver(&self, s: &mut State, m: Msg) {
        let c = client_of(&m) as usize;
        let gen = s.gens[c];
        let now = Self::clock(s);
        let client = s.clients[c].clone();
        match m {
            Msg::Reply(h, r) => {
                if h.1 != gen {
                    return;
                }
                match (client.clone(), r) {
                    (
                        Client::Acquiring {
                            expected,
                            sent,
                            first,
                            queue,
                            ..
                        },
                        Reply::Granted(count, fence),
                    ) => {
                        let _ = (first, queue);
                        let lease = if self.cfg.fixed && c == 0 {
                            FIXED
                        } else {
                            WATCHDOG
                        };
                        s.clients[c] = match s.clients[c].clone() {
                            Client::Holding {
                                valid,
                                lost,
                                renewing,
                                ..
                            } if expected > 0 => Client::Holding {
                                count,
                                valid: valid.max(sent + lease),
                                lost,
                                renewing,
                                fence,
                            },
                            _ => Client::Holding {
                                count,
                                valid: sent + lease,
                                lost: self.forced_before(s, h),
                                renewing: None,
                                fence,
                            },
                        };
                    }
                    (
                        Client::Acquiring {
                            first,
                            ticket,
                            sent,
                            queue: true,
                            ..
                        },
                        Reply::Queued(end, at),
                    ) => {
                        s.clients[c] = Client::Waiting {
                            first,
                            ticket,
                            joined: sent,
                            queued_at: at,
                            epoch: s.epoch,
                            until: end,
                        };
                    }
                    (
                        Client::Acquiring {
                            first,
                            queue: false,
                            expected: 0,
                            ..
                        },
                        Reply::Refused(_),
                    ) => {
                        // Refused: subscribe, then an attempt that queues.
                        self.attempt(s, c, first, 0, true);
                    }
                    (
                        Client::Acquiring {
                            first,
                            queue: true,
                            expected: 0,
                            ..
                        },
                        Reply::Refused(_),
                    ) => {
                        self.attempt(s, c, first, 0, true);
                    }
                    (Client::Confirming { sent, fence, .. }, Reply::Renewed) => {
                        s.clients[c] = Client::Holding {
                            count: 1,
                            valid: sent + WATCHDOG,
                            lost: self.forced_before(s, h),
                            renewing: None,
                            fence,
                        };
                    }
                    (Client::Confirming { first, .. }, Reply::Gone) => {
                        self.attempt(s, c, first, 0, true);
                    }
                    (
                        Client::Holding {
                            count,
                            valid,
                            lost,
                            renewing: Some(sent),
                            fence,
                        },
                        Reply::Renewed,
                    ) => {
                        s.clients[c] = Client::Holding {
                            count,
                            valid: valid.max(sent + WATCHDOG),
                            lost,
                            renewing: None,
                            fence,
                        };
                    }
                    (
                        Client::Holding {
                            count,
                            valid,
                            renewing: Some(_),
                            fence,
                            ..
                        },
                        Reply::Gone,
                    ) => {
                        s.clients[c] = Client::Holding {
                            count,
                            valid,
                            lost: true,
                            renewing: None,
                            fence,
                        };
                    }
                    (Client::Waiting { .. }, Reply::Gone) => {
                        // The entry is gone: ask again.
                        if let Client::Waiting { first, .. } = client {
                            self.attempt(s, c, first, 0, true);
                        }
                    }
                    (
                        Client::Holding {
                            valid,
                            lost,
                            renewing,
                            ..
                        },
                        Reply::Granted(count, fence),
                    ) => {
                        // A re-entry's reply: one level more (its validity is left as
                        // it was: the re-entry's own send time is not kept, and counting
                        // less is the safe side).
                        s.clients[c] = Client::Holding {
                            count,
                            valid,
                            lost,
                            renewing,
                            fence,
                        };
                    }
                    (Client::Releasing { .. }, Reply::Done) => {
                        s.clients[c] = Client::Idle;
                    }
                    (
                        Client::Holding {
                            count,
                            valid,
                            lost,
                            renewing,
                            fence,
                        },
                        Reply::Done,
                    ) => {
                        // An inner level's release.
                        let _ = (count, valid, lost, renewing, fence);
                    }
                    _ => {}
                }
            }
            Msg::Grant(h, ticket, fence, at) => {
                if h.1 != gen {
                    return;
                }
                let Client::Waiting {
                    first,
                    ticket: mine,
                    joined,
                    queued_at,
                    epoch,
                    ..
                } = client
                else {
                    return;
                };
                if ticket < first {
                    return;
                }
                // wait.rs's window_start.
                let window = WATCHDOG.min(PICKUP);
                let same = s.epoch == epoch || self.mutant(Mutant::UnconfirmedEpochGrant);
                let start = if self.mutant(Mutant::LateGrant) {
                    Some(now)
                } else if ticket == mine && !self.cfg.sync_replicas && same {
                    let start = joined + at.saturating_sub(queued_at);
                    (start <= now && start + window >= now && start + window - now > window / 2)
                        .then_some(start)
                } else {
                    None
                };
                match start {
                    Some(start) => {
                        s.clients[c] = Client::Holding {
                            count: 1,
                            valid: start + window,
                            lost: self.forced_before(s, h),
                            renewing: None,
                            fence,
                        };
                    }
                    None => {
                        s.clients[c] = Client::Confirming {
                            first,
                            sent: now,
                            fence,
                        };
                        Self::send(s, Msg::Request(h, Op::Renew));
                    }
                }
            }
            Msg::Wake(h, ticket) => {
                if h.1 != gen {
                    return;
                }
                if let Client::Waiting { first, .. } = client {
                    if ticket >= first {
                        self.attempt(s, c, first, 0, true);
                    }
                }
            }
            Msg::Forced(h) => {
                if h.1 != gen {
                    return;
                }
                match client {
                    Client::Holding {
                        count,
                        valid,
                        renewing,
                        fence,
                        ..
                    } => {
                        s.clients[c] = Client::Holding {
                            count,
                            valid,
                            lost: true,
                            renewing,
                            fence,
                        };
                    }
                    // found.rs's force_unlocked finds no hold of that token yet: kept for
                    // its registration (dropped there with the mutant).
                    _ => {
                        s.unheard.push(h);
                        s.unheard.sort();
                    }
                }
            }
            Msg::Request(..) => {}
        }
    }

    /// Whether a `force_unlock` notice for `h` came before its hold's registration (the
    /// hold table's `forced_before`): the hold is then lost from the start.
    fn forced_before(&self, s: &State, h: Holder) -> bool {
        !self.mutant(Mutant::ForceUnlockNoticeDropped) && s.unheard.contains(&h)
    }

    fn attempt(&self, s: &mut State, c: usize, first: u8, expected: u8, queue: bool) {
        let ticket = s.tickets[c];
        if ticket >= first + ATTEMPTS {
            s.overflow = true;
        }
        s.tickets[c] += 1;
        let h = (c as u8, s.gens[c]);
        s.clients[c] = Client::Acquiring {
            first,
            ticket,
            sent: Self::clock(s),
            expected,
            queue,
        };
        Self::send(
            s,
            Msg::Request(
                h,
                Op::Acquire {
                    expected,
                    queue,
                    ticket,
                },
            ),
        );
    }

    fn has_msg(s: &State, h: Holder) -> bool {
        s.net.iter().any(|m| match m {
            Msg::Request(x, _) | Msg::Reply(x, _) => *x == h,
            _ => false,
        })
    }

    /// The request a caller in this state has out (to repeat it).
    fn outstanding(&self, s: &State, c: usize) -> Option<Op> {
        match &s.clients[c] {
            Client::Acquiring {
                expected,
                queue,
                ticket,
                ..
            } => Some(Op::Acquire {
                expected: *expected,
                queue: *queue,
                ticket: *ticket,
            }),
            Client::Confirming { .. } => Some(Op::Renew),
            Client::Holding {
                renewing: Some(_), ..
            } => Some(Op::Renew),
            Client::Releasing { expected } => Some(Op::Release {
                expected: *expected,
            }),
            _ => None,
        }
    }

    /// A readable line for one step, with the times.
    pub fn describe(&self, s: &State, a: &Action) -> String {
        let who = |c: &u8| format!("client {c}");
        let cl = format!(
            "[real t={}, server clock {}, epoch {}]",
            s.now,
            s.now + s.offset,
            s.epoch
        );
        let what = match a {
            Action::Tick => "time passes one tick".to_string(),
            Action::Call(c) => format!(
                "{} (hold #{}) calls lock(): first attempt sent at its clock {}",
                who(c),
                s.gens[*c as usize] + 1,
                s.now
            ),
            Action::Reenter(c) => format!("{} re-enters its hold", who(c)),
            Action::Release(c) => format!("{} drops its guard: release sent", who(c)),
            Action::Renew(c) => format!("{}'s watchdog sends renew.lua", who(c)),
            Action::Retry(c) => format!("{}'s wait timer fires: it tries again", who(c)),
            Action::Refresh(c) => format!(
                "{}'s watchdog refreshes its queue entry (renew.lua)",
                who(c)
            ),
            Action::GiveUp(c) => format!("{}'s deadline passes: cancel.lua sent", who(c)),
            Action::Serve(i) => format!("primary runs {:?}", s.net[*i]),
            Action::Deliver(i) => format!("delivered: {:?}", s.net[*i]),
            Action::Lose(i) => format!("FAULT: lost in the network: {:?}", s.net[*i]),
            Action::Repeat(c) => format!(
                "{} repeats its call (its request or reply was lost)",
                who(c)
            ),
            Action::Abandon(c) => format!(
                "{} gives its call up, outcome unknown (the request may still run)",
                who(c)
            ),
            Action::Crash(c) => format!("FAULT: {} crashes", who(c)),
            Action::Disconnect(c) => format!("FAULT: {}'s pub/sub connection drops", who(c)),
            Action::Reconnect(c) => format!("{}'s pub/sub connection is back", who(c)),
            Action::ForceUnlock => "administrator runs force_unlock".to_string(),
            Action::Kick => "kick.lua runs".to_string(),
            Action::Replicate => "the replica receives the primary's writes".to_string(),
            Action::Failover => "FAULT: failover: the replica becomes the primary".to_string(),
        };
        format!("{cl} {what}")
    }

    /// Server and client views after a step, for the trace.
    pub fn show(&self, s: &State) -> String {
        let mut out = format!("      primary: {:?}", s.primary.hold);
        if !s.primary.queue.is_empty() {
            let q: Vec<_> = s
                .primary
                .queue
                .iter()
                .map(|e| format!("{:?}@exp{}", e.holder, e.expiry))
                .collect();
            let _ = write!(out, " queue {q:?}");
        }
        for (c, v) in s.clients.iter().enumerate() {
            let _ = write!(
                out,
                "\n      client {c}: {v:?}{}",
                if self.believes(s, c) {
                    " BELIEVES IT HOLDS"
                } else {
                    ""
                }
            );
        }
        out
    }

    /// Runs the checker exhaustively: the counts, or the first property broken with its
    /// trace.
    pub fn check(self) -> Result<(usize, usize), String> {
        let model = self.clone();
        let checker = self
            .checker()
            .threads(2)
            .finish_when(HasDiscoveries::AnyFailures)
            .spawn_bfs()
            .join();
        for p in model.properties() {
            if let Some(path) = checker.discovery(p.name) {
                let failing = p.expectation != stateright::Expectation::Sometimes;
                if !failing {
                    continue;
                }
                let mut out = format!("property broken: {}\n", p.name);
                for (i, (st, a)) in path.into_vec().into_iter().enumerate() {
                    match a {
                        Some(a) => {
                            let _ = writeln!(out, "  {:>2}. {}", i + 1, model.describe(&st, &a));
                        }
                        None => {
                            let _ = writeln!(out, "  end state:\n{}", model.show(&st));
                        }
                    }
                }
                return Err(out);
            }
        }
        Ok((checker.state_count(), checker.unique_state_count()))
    }
}

impl Model for ProtocolModel {
    type State = State;
    type Action = Action;

    fn init_states(&self) -> Vec<State> {
        let n = self.cfg.clients as usize;
        let offsets: &[Tick] = &[0];
        offsets.iter().map(|_| State::initial(n)).collect()
    }

    fn actions(&self, s: &State, out: &mut Vec<Action>) {
        let cfg = &self.cfg;
        if s.now < cfg.horizon && !(cfg.urgent && self.due(s)) {
            out.push(Action::Tick);
        }
        let faults = s.now < cfg.calm;
        for c in 0..cfg.clients {
            let i = c as usize;
            let h = self.holder(s, c);
            match &s.clients[i] {
                Client::Idle if s.gens[i] < cfg.calls => out.push(Action::Call(c)),
                Client::Holding {
                    count,
                    lost,
                    renewing,
                    ..
                } => {
                    if cfg.reentry
                        && *count == 1
                        && !lost
                        && renewing.is_none()
                        && !Self::has_msg(s, h)
                    {
                        out.push(Action::Reenter(c));
                    }
                    if renewing.is_none() && !Self::has_msg(s, h) {
                        out.push(Action::Release(c));
                        let fixed = cfg.fixed && c == 0;
                        if !fixed && !lost {
                            out.push(Action::Renew(c));
                        }
                    }
                }
                Client::Waiting { until, .. } if !Self::has_msg(s, h) => {
                    if s.now >= *until {
                        out.push(Action::Retry(c));
                    }
                    let live = s.primary.queue.iter().find(|e| e.holder == h);
                    if live.is_none_or(|e| e.expiry < s.now + ENTRY_TTL) {
                        out.push(Action::Refresh(c));
                    }
                    if cfg.cancel {
                        out.push(Action::GiveUp(c));
                    }
                }
                _ => {}
            }
            if self.outstanding(s, i).is_some()
                && !Self::has_msg(s, h)
                && !matches!(s.clients[i], Client::Crashed)
            {
                out.push(Action::Repeat(c));
            }
            if matches!(s.clients[i], Client::Releasing { .. })
                && Self::has_msg(s, h)
                && s.used[1] < cfg.losses
                && faults
            {
                out.push(Action::Abandon(c));
            }
            if faults
                && s.used[0] < cfg.crashes
                && !matches!(s.clients[i], Client::Crashed | Client::Idle)
            {
                out.push(Action::Crash(c));
            }
            if faults
                && s.used[2] < cfg.reconnects
                && !s.deaf[i]
                && matches!(s.clients[i], Client::Waiting { .. })
            {
                out.push(Action::Disconnect(c));
            }
            if s.deaf[i] {
                out.push(Action::Reconnect(c));
            }
        }
        for (i, m) in s.net.iter().enumerate() {
            if i > 0 && s.net[i - 1] == *m {
                continue;
            }
            // A grant or wake-up that reaches a caller in the middle of an attempt that
            // queues waits in its subscription (wait.rs reads it once the reply is in).
            let buffered = match m {
                Msg::Grant(h, ..) | Msg::Wake(h, _) => {
                    s.gens[h.0 as usize] == h.1
                        && matches!(
                            s.clients[h.0 as usize],
                            Client::Acquiring { queue: true, .. }
                        )
                }
                _ => false,
            };
            match m {
                Msg::Request(..) => out.push(Action::Serve(i)),
                _ if buffered => {}
                _ => out.push(Action::Deliver(i)),
            }
            if faults && s.used[1] < cfg.losses {
                out.push(Action::Lose(i));
            }
        }
        if faults && s.used[3] < cfg.force_unlocks && s.primary.hold.is_some() {
            out.push(Action::ForceUnlock);
        }
        // The check a releaser makes after a handoff (or a forced unlock): modelled at any
        // moment the lock is free with waiters and no wake-up or grant is on its way.
        if s.primary.hold.is_none()
            && !s.primary.queue.is_empty()
            && !s
                .net
                .iter()
                .any(|m| matches!(m, Msg::Grant(..) | Msg::Wake(..)))
        {
            out.push(Action::Kick);
        }
        if cfg.failovers > 0 {
            if s.replica != s.primary {
                out.push(Action::Replicate);
            }
            if faults && s.used[4] < cfg.failovers {
                out.push(Action::Failover);
            }
        }
    }

    fn next_state(&self, last: &State, a: Action) -> Option<State> {
        let mut s = last.clone();
        match a {
            Action::Tick => {
                s.now += 1;
                Self::expire(&mut s);
            }
            Action::Call(c) => {
                let i = c as usize;
                s.gens[i] += 1;
                let first = s.tickets[i];
                self.attempt(&mut s, i, first, 0, false);
            }
            Action::Reenter(c) => {
                let i = c as usize;
                let h = self.holder(&s, c);
                let ticket = s.tickets[i];
                s.tickets[i] += 1;
                // The guard stays; the re-entry's reply raises the count.
                if let Client::Holding { .. } = s.clients[i] {
                    Self::send(
                        &mut s,
                        Msg::Request(
                            h,
                            Op::Acquire {
                                expected: 1,
                                queue: false,
                                ticket,
                            },
                        ),
                    );
                    let sent = Self::clock(&s);
                    // Kept as the guard (count 1) with the attempt out: modelled by
                    // Acquiring with expected 1 once the guard's count is read back.
                    s.clients[i] = match s.clients[i].clone() {
                        Client::Holding {
                            valid, lost, fence, ..
                        } => Client::Holding {
                            count: 1,
                            valid,
                            lost,
                            renewing: None,
                            fence,
                        },
                        x => x,
                    };
                    let _ = sent;
                }
            }
            Action::Release(c) => {
                let i = c as usize;
                let h = self.holder(&s, c);
                if let Client::Holding {
                    count,
                    valid,
                    lost,
                    fence,
                    ..
                } = s.clients[i].clone()
                {
                    Self::send(&mut s, Msg::Request(h, Op::Release { expected: count }));
                    s.clients[i] = if count > 1 {
                        Client::Holding {
                            count: count - 1,
                            valid,
                            lost,
                            renewing: None,
                            fence,
                        }
                    } else {
                        Client::Releasing { expected: count }
                    };
                }
            }
            Action::Renew(c) => {
                let i = c as usize;
                let h = self.holder(&s, c);
                if let Client::Holding {
                    count,
                    valid,
                    lost,
                    fence,
                    ..
                } = s.clients[i].clone()
                {
                    s.clients[i] = Client::Holding {
                        count,
                        valid,
                        lost,
                        renewing: Some(Self::clock(&s)),
                        fence,
                    };
                }
                Self::send(&mut s, Msg::Request(h, Op::Renew));
            }
            Action::Retry(c) => {
                let i = c as usize;
                if let Client::Waiting { first, .. } = s.clients[i] {
                    self.attempt(&mut s, i, first, 0, true);
                }
            }
            Action::Refresh(c) => {
                let i = c as usize;
                let h = self.holder(&s, c);
                if !Self::refresh_entry(&mut s, h) {
                    if let Client::Waiting { first, .. } = s.clients[i] {
                        self.attempt(&mut s, i, first, 0, true);
                    }
                }
            }
            Action::GiveUp(c) => {
                let i = c as usize;
                let h = self.holder(&s, c);
                Self::send(&mut s, Msg::Request(h, Op::Cancel));
                s.clients[i] = Client::Idle;
            }
            Action::Serve(i) => {
                let m = s.net.remove(i);
                if let Msg::Request(h, op) = m {
                    self.serve(&mut s, h, op);
                }
            }
            Action::Deliver(i) => {
                let m = s.net.remove(i);
                let c = client_of(&m) as usize;
                // A crashed client hears nothing; one reconnecting, no pub/sub message.
                let pubsub = matches!(m, Msg::Grant(..) | Msg::Wake(..) | Msg::Forced(..));
                let dropped = matches!(s.clients[c], Client::Crashed) || (s.deaf[c] && pubsub);
                if !dropped {
                    self.deliver(&mut s, m);
                }
            }
            Action::Lose(i) => {
                s.net.remove(i);
                s.used[1] += 1;
            }
            Action::Repeat(c) => {
                let i = c as usize;
                let h = self.holder(&s, c);
                let op = self.outstanding(&s, i)?;
                Self::send(&mut s, Msg::Request(h, op));
            }
            Action::Abandon(c) => {
                s.clients[c as usize] = Client::Idle;
                s.used[1] += 1;
            }
            Action::Crash(c) => {
                s.clients[c as usize] = Client::Crashed;
                s.used[0] += 1;
                s.net
                    .retain(|m| client_of(m) != c || matches!(m, Msg::Request(..)));
            }
            Action::Disconnect(c) => {
                s.deaf[c as usize] = true;
                s.used[2] += 1;
            }
            Action::Reconnect(c) => {
                let i = c as usize;
                s.deaf[i] = false;
                if let Client::Waiting { first, .. } = s.clients[i] {
                    self.attempt(&mut s, i, first, 0, true);
                }
            }
            Action::ForceUnlock => {
                self.force_unlock(&mut s);
                s.used[3] += 1;
            }
            Action::Kick => {
                self.hand_on(&mut s, false, None, false, false);
            }
            Action::Replicate => {
                s.replica = s.primary.clone();
            }
            Action::Failover => {
                if let Some(h) = &s.primary.hold {
                    match &s.replica.hold {
                        Some(r) if r.holder == h.holder => {
                            if r.end < h.end {
                                s.shortened.push(h.holder);
                                s.shortened.sort();
                            }
                        }
                        // With sync_replicas every grant a client believes (acquisition,
                        // confirmation) WAITed: a believed hold the replica lacks is one
                        // whose end there was older (a renewal not WAITed) and has passed.
                        _ if self.cfg.sync_replicas => {
                            s.shortened.push(h.holder);
                            s.shortened.sort();
                        }
                        _ => s.rolled_back.push(h.holder),
                    }
                }
                s.primary = s.replica.clone();
                s.epoch += 1;
                s.used[4] += 1;
                if self.cfg.skewed_replica {
                    s.offset = 1;
                }
                // Requests in flight to the old primary are lost with their connections;
                // the callers repeat them.
                s.net
                    .retain(|m| !matches!(m, Msg::Request(..) | Msg::Reply(..)));
            }
        }
        if self.cfg.urgent {
            let waiting = (0..s.clients.len()).any(|i| {
                matches!(
                    s.clients[i],
                    Client::Waiting { .. }
                        | Client::Acquiring { expected: 0, .. }
                        | Client::Confirming { .. }
                )
            });
            s.free_since = if s.primary.hold.is_none() && waiting {
                Some(s.free_since.unwrap_or(s.now))
            } else {
                None
            };
        }
        // Tickets bound every path (a re-entry draws one too).
        let cap = 1 + ATTEMPTS * self.cfg.calls + 2;
        (!s.overflow && s.tickets.iter().all(|&t| t <= cap)).then_some(s)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        vec![
            Property::always("exclusion in real time", |m: &ProtocolModel, s: &State| {
                let n = s.clients.len();
                let exempt = |c: usize| {
                    let g = s.gens[c];
                    s.forced.contains(&(c as u8, g))
                        || (!m.cfg.sync_replicas && s.rolled_back.contains(&(c as u8, g)))
                        || ((!m.cfg.sync_replicas || !m.cfg.strict_renewal)
                            && s.shortened.contains(&(c as u8, g)))
                };
                (0..n).filter(|&c| m.believes(s, c) && !exempt(c)).count() <= 1
            }),
            Property::always(
                "a believer's hold is on the primary until its validity ends",
                |m: &ProtocolModel, s: &State| {
                    (0..s.clients.len()).all(|c| {
                        let h = (c as u8, s.gens[c]);
                        let exempt = s.forced.contains(&h)
                            || s.rolled_back.contains(&h)
                            || s.shortened.contains(&h)
                            || s.unheard.contains(&h);
                        !m.believes(s, c)
                            || exempt
                            || s.primary.hold.as_ref().is_some_and(|x| {
                                x.holder == h
                                    && matches!(s.clients[c],
                                        Client::Holding { valid, .. } if valid <= x.end)
                            })
                    })
                },
            ),
            Property::always(
                "told: a force-unlocked holder is told",
                |m: &ProtocolModel, s: &State| {
                    (0..s.clients.len()).all(|c| {
                        let h = (c as u8, s.gens[c]);
                        !m.believes(s, c)
                            || !s.forced.contains(&h)
                            || s.net.contains(&Msg::Forced(h))
                            || s.used[1] > 0
                            || (!m.cfg.strict_told && s.unheard.contains(&h))
                    })
                },
            ),
            Property::always(
                "handoffs go to live entries",
                |_: &ProtocolModel, s: &State| !s.lapsed_handoff,
            ),
            Property::always(
                "a FairLock's live waiters are granted in queue order",
                |_: &ProtocolModel, s: &State| !s.out_of_order,
            ),
            Property::always(
                "nobody waits on a lock nobody holds for longer than a lease",
                |_: &ProtocolModel, s: &State| s.free_since.is_none_or(|t| s.now - t <= WATCHDOG),
            ),
            Property::always(
                "a waiter of a lock that became free after the faults is granted at once",
                |m: &ProtocolModel, s: &State| {
                    s.free_since.is_none_or(|t| t < m.cfg.calm || t == s.now)
                },
            ),
            Property::eventually("some call is granted", |_: &ProtocolModel, s: &State| {
                s.granted_any
            }),
        ]
    }
}

/// The configurations of the run. `REDMUTEX_MODEL_BIG=1` raises the bounds.
pub fn configurations() -> Vec<Config> {
    let big = std::env::var("REDMUTEX_MODEL_BIG").is_ok_and(|v| v == "1");
    // Horizons: two ticks where a lease, a pickup window or an entry can end within the
    // run (and the mutants need it); one tick for the faults whose interleavings alone fill
    // the budget of 5 minutes on 2 cores.
    let mut v = vec![
        Config {
            horizon: 2,
            ..Config::base("plain, 3 clients, watchdog renewal, release, handoff")
        },
        Config {
            horizon: 2,
            fair: true,
            fenced: true,
            cancel: true,
            ..Config::base("fair + fenced, cancel")
        },
        Config {
            horizon: 1,
            fixed: true,
            reentry: true,
            ..Config::base("fixed lease + re-entry")
        },
        Config {
            horizon: 2,
            crashes: 1,
            ..Config::base("client crash")
        },
        Config {
            horizon: 2,
            losses: 1,
            ..Config::base("lost message (reply or request) with repeat, late calls")
        },
        Config {
            horizon: 1,
            reconnects: 1,
            losses: 1,
            cancel: true,
            ..Config::base("lost/delayed pub/sub + reconnect")
        },
        Config {
            horizon: 1,
            force_unlocks: 1,
            ..Config::base("force_unlock")
        },
        Config {
            horizon: 0,
            failovers: 1,
            ..Config::base("failover without sync_replicas")
        },
        Config {
            horizon: 1,
            failovers: 1,
            sync_replicas: true,
            ..Config::base("failover with sync_replicas")
        },
        // Focused: a grant heard after a failover to a replica whose clock is ahead needs
        // two ticks (the starvation bound, then the pickup window's end), which three
        // clients cannot afford; two reach it (a waiter queued on the old primary, the
        // holder's release hands over on the new one, the grant heard as the pickup
        // window ends: "a believer's hold is on the server" breaks).
        Config {
            clients: 2,
            horizon: 2,
            failovers: 1,
            skewed_replica: true,
            ..Config::base("failover to a server whose clock is ahead, 2 clients")
        },
    ];
    // Liveness (weak fairness: `urgent`; no faults from `calm` on). The horizon reaches
    // past a lease after the last fault, so that a lost wake-up's wait is seen whole.
    v.push(Config {
        horizon: 3,
        urgent: true,
        ..Config::base("liveness: plain, no faults")
    });
    v.push(Config {
        horizon: 3,
        urgent: true,
        fair: true,
        cancel: true,
        ..Config::base("liveness: fair, cancel, no faults")
    });
    v.push(Config {
        clients: 2,
        horizon: 4,
        urgent: true,
        fair: true,
        losses: 1,
        crashes: 1,
        calm: 1,
        ..Config::base("liveness: fair, 2 clients, a lost message or a crash before t=1")
    });
    // Finding 2's shape (docs/protocol.md): a renewal, then a failover, then the hold's
    // old end passes: three ticks.
    v.push(Config {
        clients: 2,
        horizon: 3,
        failovers: 1,
        sync_replicas: true,
        strict_renewal: true,
        ..Config::base("failover with sync_replicas after a renewal, 2 clients")
    });
    if let Ok(h) = std::env::var("REDMUTEX_MODEL_HORIZON") {
        let h: Tick = h
            .parse()
            .expect("REDMUTEX_MODEL_HORIZON: a number of ticks");
        for c in &mut v {
            c.horizon = h;
        }
    }
    if let Ok(only) = std::env::var("REDMUTEX_MODEL_ONLY") {
        v.retain(|c| c.name.contains(only.as_str()));
    }
    if big {
        for c in &mut v {
            c.horizon += 2;
            c.calls += 1;
        }
    }
    v
}

/// The mutant named by `REDMUTEX_MODEL_MUTANT`, `None` when unset.
pub fn mutant_from_env() -> Result<Option<Mutant>, String> {
    match std::env::var("REDMUTEX_MODEL_MUTANT") {
        Err(_) => Ok(None),
        Ok(name) if name.is_empty() => Ok(None),
        Ok(name) => Mutant::from_name(&name)
            .map(Some)
            .ok_or_else(|| format!("no mutant named {name:?}")),
    }
}
