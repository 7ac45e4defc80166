//! The fast path of a lock's acquire and release (`lua/acquire_fast.lua`,
//! `lua/release_fast.lua`: an uncontended call answered with an integer reply, without the
//! queue's rules) on what it meets beside a plain thread hold of a plain name: owned holds
//! (a holder per acquisition), names with a hash tag of their own or braces that make none
//! (other key forms, see tests/support/keys.rs), re-entry (which passes the fast acquire
//! and sends the levels held to the release), `FairLock` and `FencedLock` (which send their
//! flags), each with the server's way of running the scripts (`FCALL` where it has
//! functions) and with `use_functions(false)` (`EVALSHA`, Redis 6.2's only way). What is
//! checked is what Redis keeps, not only what the guards say: the hold's field, count and
//! lease after the acquire, that nobody else gets in, that the release deletes the key,
//! that a waiter behind the hold is woken by the release (well before the lease), and that
//! a hold taken away is reported lost by its unlock without touching the next holder.

mod support;

use std::collections::HashMap;
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use redmutex::{Client, Error, Fair, Fenced, LockGuard, LockOptions, OwnedGuard};
use support::clients::Clients;
use support::keys::Keys;
use support::RedisServer;

const PREFIX: &str = "fast:";
/// The watchdog lease: long beside every bound on a wake-up or a call, so that nothing
/// here can pass through a lease running out.
const WATCHDOG: Duration = Duration::from_secs(30);
/// The fixed lease of the holds that take one.
const LEASE: Duration = Duration::from_secs(20);
/// How much less than its lease a hold's PTTL may read just after the acquire, and how long
/// a waiter may take to be woken by a release: wide for a loaded 2-core machine, far below
/// the leases.
const MARGIN: Duration = Duration::from_secs(5);

const CLIENTS: Clients = Clients::new(PREFIX).watchdog(WATCHDOG);

/// The names of the three key forms: wrapped in a tag, with the user's own tag, with braces
/// that make no tag (a digest is the tag).
const NAMES: [&str; 3] = ["fp", "job{t}:fp", "}odd{fp"];

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Plain,
    Fair,
    Fenced,
}

const KINDS: [Kind; 3] = [Kind::Plain, Kind::Fair, Kind::Fenced];

/// Whose a hold is: the thread's (`LockGuard`) or the acquisition's (`OwnedGuard`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Form {
    Thread,
    Owned,
}

const FORMS: [Form; 2] = [Form::Thread, Form::Owned];

/// How the clients run the scripts: the server's way (functions where it has them), or
/// `EVALSHA` whatever it has.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Way {
    Default,
    Evalsha,
}

impl Way {
    fn clients(self) -> Clients {
        match self {
            Way::Default => CLIENTS,
            Way::Evalsha => CLIENTS.functions(false),
        }
    }

    /// Checks that the server ran the scripts this way: `FCALL`s where it has functions
    /// and the clients were left to use them, none otherwise.
    fn assert_ran(self, server: &RedisServer) {
        let calls = server.command_calls();
        let fcalls = calls.get("fcall").copied().unwrap_or(0);
        let evalshas = calls.get("evalsha").copied().unwrap_or(0);
        if self == Way::Default && support::server_kind().has_functions() {
            assert!(fcalls > 0 && evalshas == 0, "{self:?}: {calls:?}");
        } else {
            assert!(fcalls == 0 && evalshas > 0, "{self:?}: {calls:?}");
        }
    }
}

/// A hold of any of the kinds and forms.
enum Held {
    Plain(LockGuard),
    Fair(LockGuard<Fair>),
    Fenced(LockGuard<Fenced>),
    OwnedPlain(OwnedGuard),
    OwnedFair(OwnedGuard<Fair>),
    OwnedFenced(OwnedGuard<Fenced>),
}

impl Held {
    fn unlock(self) -> Result<(), Error> {
        match self {
            Held::Plain(g) => g.unlock(),
            Held::Fair(g) => g.unlock(),
            Held::Fenced(g) => g.unlock(),
            Held::OwnedPlain(g) => g.unlock(),
            Held::OwnedFair(g) => g.unlock(),
            Held::OwnedFenced(g) => g.unlock(),
        }
    }

    /// The hold's fencing token, if it is fenced.
    fn token(&self) -> Option<u64> {
        match self {
            Held::Fenced(g) => Some(g.token()),
            Held::OwnedFenced(g) => Some(g.token()),
            _ => None,
        }
    }
}

/// Takes `name` as `kind` in `form` with `options`: `None` when it was not granted.
fn take(
    c: &Client,
    kind: Kind,
    form: Form,
    name: &str,
    options: LockOptions,
) -> Result<Option<Held>, Error> {
    Ok(match (kind, form) {
        (Kind::Plain, Form::Thread) => c.lock(name).try_lock_with(options)?.map(Held::Plain),
        (Kind::Fair, Form::Thread) => c.fair_lock(name).try_lock_with(options)?.map(Held::Fair),
        (Kind::Fenced, Form::Thread) => c
            .fenced_lock(name)
            .try_lock_with(options)?
            .map(Held::Fenced),
        (Kind::Plain, Form::Owned) => c
            .lock(name)
            .owned()
            .try_lock_with(options)?
            .map(Held::OwnedPlain),
        (Kind::Fair, Form::Owned) => c
            .fair_lock(name)
            .owned()
            .try_lock_with(options)?
            .map(Held::OwnedFair),
        (Kind::Fenced, Form::Owned) => c
            .fenced_lock(name)
            .owned()
            .try_lock_with(options)?
            .map(Held::OwnedFenced),
    })
}

/// `name` taken at once: with the watchdog lease for an owned hold, with [`LEASE`] for a
/// thread's (both leases through the same scripts). Returns the hold and its lease.
fn hold(c: &Client, kind: Kind, form: Form, name: &str, what: &str) -> (Held, Duration) {
    let (options, lease) = match form {
        Form::Thread => (LockOptions::new().lease(LEASE), LEASE),
        Form::Owned => (LockOptions::new(), WATCHDOG),
    };
    let held = take(c, kind, form, name, options.wait_for(Duration::ZERO))
        .unwrap_or_else(|e| panic!("{what}: {e}"))
        .unwrap_or_else(|| panic!("{what}: not granted on a free name"));
    (held, lease)
}

/// Whether a new acquisition of `name` by `c` is refused at once.
fn refused(c: &Client, kind: Kind, form: Form, name: &str, what: &str) -> bool {
    match take(
        c,
        kind,
        form,
        name,
        LockOptions::new().wait_for(Duration::ZERO),
    ) {
        Ok(None) => true,
        Ok(Some(h)) => {
            h.unlock().unwrap();
            false
        }
        Err(e) => panic!("{what}: {e}"),
    }
}

/// The lock hash of `name`: its holders' fields and counts, and its own fields (`~...`).
fn fields(server: &RedisServer, name: &str) -> HashMap<String, String> {
    support::query_key(
        &mut server.connection(),
        "HGETALL",
        Keys::lock(PREFIX, name).key(),
    )
}

/// The one holder field of `name` and its count, after checking that it is `c`'s.
fn holder_of(server: &RedisServer, name: &str, c: &Client, what: &str) -> (String, String) {
    let fields = fields(server, name);
    let holders: Vec<(&String, &String)> =
        fields.iter().filter(|(f, _)| !f.starts_with('~')).collect();
    assert_eq!(holders.len(), 1, "{what}: one holder: {fields:?}");
    let (field, count) = holders[0];
    assert!(
        field.starts_with(&format!("{}:", c.id())),
        "{what}: the hold is not the client's {}: {fields:?}",
        c.id()
    );
    (field.clone(), count.clone())
}

fn pttl(server: &RedisServer, name: &str) -> Duration {
    let ms: i64 = support::query_key(
        &mut server.connection(),
        "PTTL",
        Keys::lock(PREFIX, name).key(),
    );
    assert!(ms > 0, "PTTL {ms}");
    Duration::from_millis(ms as u64)
}

/// The keys of `name` left in Redis, less the fencing-token counter (which never expires).
fn keys_left(server: &RedisServer, name: &str) -> Vec<String> {
    let keys = Keys::lock(PREFIX, name);
    let mut con = server.connection();
    [keys.key(), keys.queue(), keys.waiters()]
        .into_iter()
        .filter(|k| support::exists(&mut con, k))
        .collect()
}

/// Every combination of `ways`, names, kinds and `forms`, each way on a server of its own,
/// checked to have run the scripts that way.
fn each(forms: &[Form], mut check: impl FnMut(&RedisServer, Way, &str, Kind, Form, &str)) {
    for way in [Way::Default, Way::Evalsha] {
        let server = RedisServer::new();
        for name in NAMES {
            for kind in KINDS {
                for &form in forms {
                    let what = format!("{kind:?} {form:?} on {name:?} ({way:?})");
                    check(&server, way, name, kind, form, &what);
                }
            }
        }
        way.assert_ran(&server);
    }
}

/// An uncontended hold is in Redis as the fast path writes it (the caller's field, count
/// 1, the lease; a fenced hold's token beside it; no queue mark), nobody else gets it (an
/// owned hold: not even the same client's next owned acquisition), a bounded wait for it
/// ends empty, and the release deletes the key, after which another client takes it.
#[test]
fn an_uncontended_hold_is_kept_excludes_and_is_freed() {
    each(&FORMS, |server, way, name, kind, form, what| {
        let a = way.clients().at(server);
        let b = way.clients().at(server);
        let (held, lease) = hold(&a, kind, form, name, what);
        let (_, count) = holder_of(server, name, &a, what);
        assert_eq!(count, "1", "{what}");
        let left = pttl(server, name);
        assert!(
            left <= lease && left > lease - MARGIN,
            "{what}: PTTL {left:?}"
        );
        let f = fields(server, name);
        match held.token() {
            Some(token) => {
                assert_eq!(f.get("~fence"), Some(&token.to_string()), "{what}: {f:?}")
            }
            None => assert!(!f.contains_key("~fence"), "{what}: {f:?}"),
        }
        assert!(
            !f.contains_key("~q"),
            "{what}: marked with nobody queued: {f:?}"
        );

        assert!(
            refused(&b, kind, form, name, what),
            "{what}: taken by another client"
        );
        if form == Form::Owned {
            assert!(
                refused(&a, kind, form, name, what),
                "{what}: a second owned hold of the same client"
            );
        }
        // A bounded wait queues behind the hold (marking it) and leaves when it ends.
        let (got, took) = support::timed(|| {
            take(
                &b,
                kind,
                form,
                name,
                LockOptions::new().wait_for(Duration::from_millis(200)),
            )
        });
        assert!(got.unwrap().is_none(), "{what}: taken by a waiter");
        assert!(
            took >= Duration::from_millis(200) && took < MARGIN,
            "{what}: waited {took:?}"
        );
        assert_eq!(holder_of(server, name, &a, what).1, "1", "{what}");

        held.unlock()
            .unwrap_or_else(|e| panic!("{what}: unlock: {e}"));
        assert_eq!(keys_left(server, name), Vec::<String>::new(), "{what}");
        let (next, _) = hold(&b, kind, form, name, &format!("{what}, then"));
        holder_of(server, name, &b, what);
        next.unlock().unwrap();
        assert_eq!(keys_left(server, name), Vec::<String>::new(), "{what}");
    });
}

/// A thread's hold taken again (an inner level) counts 2 with the longer lease of the
/// two, keeps a fenced hold's token, still excludes others; the inner level's release
/// leaves count 1 with the outer level's lease, and the outer's deletes the key.
#[test]
fn a_reentered_hold_counts_its_levels_and_leases() {
    each(&[Form::Thread], |server, way, name, kind, form, what| {
        let a = way.clients().at(server);
        let b = way.clients().at(server);
        let outer_lease = Duration::from_secs(10);
        let outer = take(&a, kind, form, name, LockOptions::new().lease(outer_lease))
            .unwrap()
            .unwrap();
        // The inner level with the watchdog lease (30 s): longer, so the key's grows.
        let inner = take(&a, kind, form, name, LockOptions::new())
            .unwrap()
            .unwrap();
        assert_eq!(holder_of(server, name, &a, what).1, "2", "{what}");
        let left = pttl(server, name);
        assert!(
            left > WATCHDOG - MARGIN,
            "{what}: PTTL {left:?} after the re-entry"
        );
        assert_eq!(inner.token(), outer.token(), "{what}: the token");
        assert!(
            refused(&b, kind, form, name, what),
            "{what}: taken by another client"
        );

        inner
            .unlock()
            .unwrap_or_else(|e| panic!("{what}: inner unlock: {e}"));
        assert_eq!(holder_of(server, name, &a, what).1, "1", "{what}");
        let left = pttl(server, name);
        assert!(
            left <= outer_lease && left > outer_lease - MARGIN,
            "{what}: PTTL {left:?} after the inner release"
        );
        assert!(
            refused(&b, kind, form, name, what),
            "{what}: taken by another client"
        );
        outer
            .unlock()
            .unwrap_or_else(|e| panic!("{what}: outer unlock: {e}"));
        assert_eq!(keys_left(server, name), Vec::<String>::new(), "{what}");
    });
}

/// A waiter behind a hold (of another client, or another thread of the same client:
/// the local handoff) is granted by the release, not by the lease (20 or 30 s) running
/// out: well within [`MARGIN`] of it, and not before it.
#[test]
fn a_waiter_is_woken_by_the_release() {
    each(&FORMS, |server, way, name, kind, form, what| {
        let a = way.clients().at(server);
        let b = way.clients().at(server);
        for (whose, waiter) in [("another client", &b), ("the same client", &a)] {
            let what = format!("{what}, a waiter of {whose}");
            let (held, _) = hold(&a, kind, form, name, &what);
            thread::scope(|s| {
                let what = &what;
                let (granted_tx, granted_rx) = mpsc::channel();
                // Dropped when this thread panics, which ends the waiter's hold.
                let (done_tx, done_rx) = mpsc::channel::<()>();
                s.spawn(move || {
                    // Shorter than the lease: a grant only by its running out fails.
                    let wait = LockOptions::new().wait_for(LEASE / 2);
                    let got = take(waiter, kind, form, name, wait)
                        .unwrap_or_else(|e| panic!("{what}: waiter: {e}"))
                        .unwrap_or_else(|| panic!("{what}: the waiter gave up"));
                    granted_tx.send(Instant::now()).unwrap();
                    let _ = done_rx.recv();
                    got.unlock().unwrap();
                });
                let queue = Keys::lock(PREFIX, name).queue();
                assert!(
                    support::wait_until(MARGIN, || {
                        support::llen(&mut server.connection(), &queue) == 1
                    }),
                    "{what}: the waiter never queued"
                );
                assert!(granted_rx.try_recv().is_err(), "{what}: granted while held");
                let released = Instant::now();
                held.unlock()
                    .unwrap_or_else(|e| panic!("{what}: unlock: {e}"));
                let granted = granted_rx
                    .recv_timeout(MARGIN)
                    .unwrap_or_else(|_| panic!("{what}: not woken within {MARGIN:?}"));
                assert!(granted >= released, "{what}");
                assert_eq!(holder_of(server, name, waiter, what).1, "1", "{what}");
                done_tx.send(()).unwrap();
            });
            assert_eq!(keys_left(server, name), Vec::<String>::new(), "{what}");
        }
    });
}

/// A hold taken away, by `force_unlock` (its client is told) or by its key vanishing
/// (nobody is told: the release script finds no hold), is reported lost by its unlock,
/// which leaves the next holder's hold alone.
#[test]
fn the_unlock_of_a_hold_taken_away_reports_the_loss() {
    each(&FORMS, |server, way, name, kind, form, what| {
        let a = way.clients().at(server);
        let b = way.clients().at(server);
        for forced in [true, false] {
            let what = format!("{what}, forced: {forced}");
            let (held, _) = hold(&a, kind, form, name, &what);
            if forced {
                assert!(
                    b.lock(name).force_unlock().unwrap(),
                    "{what}: nothing freed"
                );
            } else {
                let _: () = support::query_key(
                    &mut server.connection(),
                    "DEL",
                    Keys::lock(PREFIX, name).key(),
                );
            }
            assert_eq!(keys_left(server, name), Vec::<String>::new(), "{what}");
            let (next, _) = hold(&b, kind, form, name, &format!("{what}, then"));
            match held.unlock() {
                Err(Error::LeaseLost { .. }) => {}
                other => panic!("{what}: unlock of the hold taken away: {other:?}"),
            }
            assert_eq!(holder_of(server, name, &b, &what).1, "1", "{what}");
            next.unlock().unwrap();
            assert_eq!(keys_left(server, name), Vec::<String>::new(), "{what}");
        }
    });
}
