//! Issue 29, item 3: a release that hands the lock to a waiting thread of its own client
//! does not PUBLISH: the script returns the message in its reply and the releasing client
//! delivers it to the thread itself, the way its subscriber delivers a published one
//! (`lua/queue.lua`'s `Q.hand_on`, `Subscriber::deliver_own`). So the confirmation, the
//! pickup window and a cancelled waiter giving the grant back stay the pub/sub grant's.
//!
//! PUBLISHes are counted from `INFO commandstats` (the commands of scripts count there).

mod support;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use crossbeam_channel::Receiver;
use redmutex::{CancellationToken, Client, Error, LockOptions};
use support::clients::Clients;
use support::keys::Keys;
use support::topology::Cluster;
use support::{wait_until, FaultProxy, RedisServer};

const PREFIX: &str = "local-handoff:";

const CLIENTS: Clients = Clients::new(PREFIX).command(Duration::from_secs(2));

/// How long setup steps (a waiter showing in the queue) may take before the test fails.
const SETUP: Duration = Duration::from_secs(10);
/// How soon a freed lock must reach the next waiter: under the pickup window (1 s), after
/// which a grant nobody took passes on anyway (and far under the 30 s leases), ample on a
/// loaded machine for the few round trips a handoff takes.
const PROMPTLY: Duration = Duration::from_millis(900);
/// How long any thread of a test may take to finish its part.
const DONE_WITHIN: Duration = Duration::from_secs(60);

/// PUBLISHes and SPUBLISHes the server ran so far (those of scripts included).
fn publishes(server: &RedisServer) -> u64 {
    let calls = server.command_calls();
    ["publish", "spublish"]
        .iter()
        .map(|c| calls.get(*c).copied().unwrap_or(0))
        .sum()
}

/// Waits until the queue `queue` has `n` entries.
fn await_queued(server: &RedisServer, queue: &str, n: i64) {
    let mut con = server.connection();
    let mut seen = 0;
    let ok = wait_until(SETUP, || {
        seen = support::llen(&mut con, queue);
        seen == n
    });
    assert!(ok, "LLEN {queue} is {seen}, expected {n}");
}

/// Runs `f` on a thread of its own; its result comes on the channel returned.
fn spawn<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> Receiver<T> {
    let (tx, rx) = crossbeam_channel::bounded(1);
    thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx
}

fn done<T>(rx: &Receiver<T>, what: &str) -> T {
    rx.recv_timeout(DONE_WITHIN)
        .unwrap_or_else(|_| panic!("{what} did not finish within {DONE_WITHIN:?}"))
}

/// A release, to run later.
type Release = Box<dyn FnOnce()>;

/// A kind's way to take a hold (on the calling thread) and to give it back.
type Take = fn(&Client, &str) -> Release;

fn take_lock(c: &Client, name: &str) -> Release {
    let g = c.lock(name).lock().unwrap();
    Box::new(move || g.unlock().unwrap())
}

fn take_fair(c: &Client, name: &str) -> Release {
    let g = c.fair_lock(name).lock().unwrap();
    Box::new(move || g.unlock().unwrap())
}

fn take_fenced(c: &Client, name: &str) -> Release {
    let g = c.fenced_lock(name).lock().unwrap();
    Box::new(move || g.unlock().unwrap())
}

fn take_write(c: &Client, name: &str) -> Release {
    let g = c.read_write_lock(name).write().unwrap();
    Box::new(move || g.unlock().unwrap())
}

fn take_read(c: &Client, name: &str) -> Release {
    let g = c.read_write_lock(name).read().unwrap();
    Box::new(move || g.unlock().unwrap())
}

fn take_permit(c: &Client, name: &str) -> Release {
    let p = c.semaphore(name, 1).acquire().unwrap();
    Box::new(move || p.release().unwrap())
}

/// Holds `name` with `hold` on this thread, queues a thread of the same client behind it
/// with `wait`, releases: how long the waiter took to hold it from the release's start,
/// and how many PUBLISHes the handoff cost.
fn hand_to_own_thread(
    server: &RedisServer,
    c: &Client,
    name: &str,
    queue: &str,
    hold: Take,
    wait: Take,
) -> (Duration, u64) {
    let release = hold(c, name);
    let (c2, n2) = (c.clone(), name.to_owned());
    let got = spawn(move || {
        let release = wait(&c2, &n2);
        let at = Instant::now();
        release();
        at
    });
    await_queued(server, queue, 1);
    let before = publishes(server);
    let released = Instant::now();
    release();
    let at = done(&got, "the waiter");
    (at - released, publishes(server) - before)
}

/// Each kind that queues hands a freed hold to a waiting thread of the releasing client
/// without a PUBLISH, and the waiter holds it at once (not at the pickup window's end).
#[test]
fn a_release_hands_on_to_its_own_client_without_publishing() {
    let server = RedisServer::new();
    let c = CLIENTS.at(&server);
    let cases: [(&str, Take, Take, Keys); 6] = [
        ("Lock", take_lock, take_lock, Keys::lock(PREFIX, "plain")),
        ("FairLock", take_fair, take_fair, Keys::lock(PREFIX, "fair")),
        (
            "FencedLock",
            take_fenced,
            take_fenced,
            Keys::lock(PREFIX, "fenced"),
        ),
        (
            "write -> write",
            take_write,
            take_write,
            Keys::rw(PREFIX, "ww"),
        ),
        (
            "write -> read",
            take_write,
            take_read,
            Keys::rw(PREFIX, "wr"),
        ),
        (
            "Semaphore",
            take_permit,
            take_permit,
            Keys::sem(PREFIX, "sem"),
        ),
    ];
    let names = ["plain", "fair", "fenced", "ww", "wr", "sem"];
    for ((what, hold, wait, keys), name) in cases.into_iter().zip(names) {
        let (took, published) = hand_to_own_thread(&server, &c, name, &keys.queue(), hold, wait);
        assert_eq!(
            published, 0,
            "{what}: the handoff to the same client published"
        );
        assert!(took < PROMPTLY, "{what}: the waiter took {took:?}");
    }
    // The same handoff between two clients is published: the count above could see one.
    let other = CLIENTS.at(&server);
    let release = take_fair(&c, "two");
    let waiting = spawn(move || take_fair(&other, "two")());
    await_queued(&server, &Keys::lock(PREFIX, "two").queue(), 1);
    let before = publishes(&server);
    release();
    done(&waiting, "the other client's waiter");
    assert_eq!(
        publishes(&server) - before,
        1,
        "a handoff to another client publishes"
    );
}

/// Waiters of two clients queued alternately on a `FairLock`: they hold it in the order
/// they queued, one at a time, whichever client each belongs to; only the handoffs
/// between the clients are published.
#[test]
fn local_and_remote_waiters_keep_fifo_order() {
    let server = RedisServer::new();
    let clients = [CLIENTS.at(&server), CLIENTS.at(&server)];
    let queue = Keys::lock(PREFIX, "order").queue();
    let first = clients[0].fair_lock("order").lock().unwrap();
    let order = Arc::new(Mutex::new(Vec::new()));
    let inside = Arc::new(AtomicBool::new(false));
    // Client 0, client 1, client 0, client 1, client 0 queue in this order behind
    // client 0's holder.
    let mut waiting = Vec::new();
    for i in 0..5 {
        let c = clients[i % 2].clone();
        let (order, inside) = (order.clone(), inside.clone());
        waiting.push(spawn(move || {
            let g = c.fair_lock("order").lock().unwrap();
            assert!(!inside.swap(true, Ordering::SeqCst), "two holders at once");
            order.lock().unwrap().push(i);
            thread::sleep(Duration::from_millis(2));
            inside.store(false, Ordering::SeqCst);
            g.unlock().unwrap();
        }));
        await_queued(&server, &queue, i as i64 + 1);
    }
    let before = publishes(&server);
    first.unlock().unwrap();
    for w in &waiting {
        done(w, "a waiter");
    }
    assert_eq!(
        *order.lock().unwrap(),
        [0, 1, 2, 3, 4],
        "first come, first served"
    );
    // Client 0 -> its own waiter 0: not published; 0 -> 1, 1 -> 2, 2 -> 3, 3 -> 4 are.
    assert_eq!(publishes(&server) - before, 4);
}

/// Threads of two clients loop on one lock: never two holders at once, and everyone is
/// served; a share of the handoffs stays within a client, unpublished.
#[test]
fn threads_of_two_clients_never_hold_at_once() {
    let server = RedisServer::new();
    for fair in [false, true] {
        let name = if fair { "busy-fair" } else { "busy" };
        let clients = [CLIENTS.at(&server), CLIENTS.at(&server)];
        let inside = Arc::new(AtomicBool::new(false));
        const ROUNDS: usize = 30;
        let before = (publishes(&server), server.script_calls());
        let mut threads = Vec::new();
        for i in 0..6 {
            let c = clients[i % 2].clone();
            let inside = inside.clone();
            threads.push(spawn(move || {
                for _ in 0..ROUNDS {
                    let release: Release = if fair {
                        take_fair(&c, name)
                    } else {
                        take_lock(&c, name)
                    };
                    assert!(!inside.swap(true, Ordering::SeqCst), "two holders at once");
                    thread::sleep(Duration::from_micros(300));
                    inside.store(false, Ordering::SeqCst);
                    release();
                }
            }));
        }
        for t in &threads {
            done(t, "a looping thread");
        }
        let published = publishes(&server) - before.0;
        eprintln!(
            "{name}: {} acquisitions, {published} PUBLISHes, {} script calls",
            6 * ROUNDS,
            server.script_calls() - before.1
        );
    }
}

/// A waiter of the releasing client that is cancelled while the lock is being handed to
/// it (its cancellation and the release sent at once, in either order): whatever it got
/// (nothing, or the lock it then gives back), the next waiter holds the lock promptly, not
/// at the end of a pickup window nor of a lease.
#[test]
fn a_cancelled_local_waiter_strands_nothing() {
    let server = RedisServer::new();
    let c = CLIENTS.at(&server);
    for (i, fair) in [false, true].into_iter().cycle().take(24).enumerate() {
        let name = format!("cancelled-{i}");
        let queue = Keys::lock(PREFIX, &name).queue();
        let take = move |c: &Client, name: &str, options: LockOptions| {
            if fair {
                c.fair_lock(name)
                    .try_lock_with(options)
                    .map(|g| g.map(|g| Box::new(move || g.unlock().unwrap()) as Release))
            } else {
                c.lock(name)
                    .try_lock_with(options)
                    .map(|g| g.map(|g| Box::new(move || g.unlock().unwrap()) as Release))
            }
        };
        let first = take(&c, &name, LockOptions::new()).unwrap().unwrap();
        let token = CancellationToken::new();
        let (c1, n1, t1) = (c.clone(), name.clone(), token.clone());
        let cancelled = spawn(
            move || match take(&c1, &n1, LockOptions::new().cancellable(&t1)) {
                // Picked up before the cancellation was seen: given back at once.
                Ok(Some(release)) => release(),
                Err(Error::Cancelled { .. }) => {}
                other => panic!(
                    "a cancelled wait ended with {:?}",
                    other.map(|g| g.is_some())
                ),
            },
        );
        await_queued(&server, &queue, 1);
        let (c2, n2) = (c.clone(), name.clone());
        let next = spawn(move || {
            let release = take(&c2, &n2, LockOptions::new()).unwrap().unwrap();
            let at = Instant::now();
            release();
            at
        });
        await_queued(&server, &queue, 2);
        let released = Instant::now();
        if i % 4 < 2 {
            token.cancel();
            first();
        } else {
            first();
            token.cancel();
        }
        done(&cancelled, "the cancelled waiter");
        let took = done(&next, "the next waiter") - released;
        assert!(took < PROMPTLY, "round {i}: the next waiter took {took:?}");
    }
}

/// The same with a waiter whose deadline passes about when the lock is handed to it: it
/// may leave with it (and gives it back) or without; the next waiter holds it promptly.
#[test]
fn a_local_waiter_whose_deadline_passes_strands_nothing() {
    let server = RedisServer::new();
    let c = CLIENTS.at(&server);
    for i in 0..16 {
        let name = format!("deadline-{i}");
        let queue = Keys::lock(PREFIX, &name).queue();
        let first = c.lock(&name).lock().unwrap();
        let wait = Duration::from_millis(150);
        let (c1, n1) = (c.clone(), name.clone());
        let late = spawn(move || {
            if let Some(g) = c1.lock(&n1).try_lock_for(wait).unwrap() {
                g.unlock().unwrap();
            }
        });
        await_queued(&server, &queue, 1);
        let queued = Instant::now();
        let (c2, n2) = (c.clone(), name.clone());
        let next = spawn(move || {
            let g = c2.lock(&n2).lock().unwrap();
            let at = Instant::now();
            g.unlock().unwrap();
            at
        });
        await_queued(&server, &queue, 2);
        // Around the first waiter's deadline: a little before, at, a little after it.
        let at = queued + wait - Duration::from_millis(10) + Duration::from_millis(5 * (i % 5));
        thread::sleep(at.saturating_duration_since(Instant::now()));
        let released = Instant::now();
        first.unlock().unwrap();
        done(&late, "the waiter whose deadline passed");
        let took = done(&next, "the next waiter") - released;
        assert!(took < PROMPTLY, "round {i}: the next waiter took {took:?}");
    }
}

/// A release that handed the lock to a thread of its own client and whose reply was lost
/// (the message for the thread was in it): the release is sent again, and the waiting
/// thread holds the lock promptly, as after a published grant lost in a reconnect, not
/// at the end of the lease its client saw (30 s) nor after a pickup window.
#[test]
fn a_local_grant_whose_release_reply_is_lost_is_picked_up() {
    let server = RedisServer::new();
    let proxy = FaultProxy::new(server.port());
    let c = CLIENTS
        .builder_at(&proxy.url())
        .build()
        .expect("build client");
    c.lock("warm-up").lock().unwrap().unlock().unwrap();
    for fair in [false, true] {
        let name = if fair { "lost-fair" } else { "lost" };
        let queue = Keys::lock(PREFIX, name).queue();
        let take: Take = if fair { take_fair } else { take_lock };
        let first = support::hold_lock(&c, name, fair);
        let (c2, n2) = (c.clone(), name.to_owned());
        let got = spawn(move || {
            let release = take(&c2, &n2);
            let at = Instant::now();
            release();
            at
        });
        await_queued(&server, &queue, 1);
        let lost = proxy.lost_replies();
        proxy.lose_next_reply_to(&support::function_name(&server.url(), "release"));
        let released = Instant::now();
        // The retry finds the hold gone (handed on by the first run): `NotHeld`, what a
        // release that cannot vouch for itself says.
        let r = first();
        assert!(matches!(r, Ok(()) | Err(Error::NotHeld { .. })), "{r:?}");
        assert_eq!(proxy.lost_replies(), lost + 1, "the fault was injected");
        let took = done(&got, "the waiter") - released;
        assert!(took < PROMPTLY, "{name}: the waiter took {took:?}");
    }
}

/// A measurement, not a check (`cargo test --release --test local_handoff -- --ignored`):
/// the handoff latency, from the start of a release to the waiter holding the lock, of
/// two threads passing a lock back and forth (each holds 2 ms, so that the other has
/// queued), on one client (local handoffs) and on two (published), printed as p50/p99.
#[test]
#[ignore]
fn handoff_latency() {
    let server = RedisServer::new();
    const ROUNDS: usize = 300;
    for fair in [true, false] {
        for same in [true, false] {
            let name = format!("latency-{fair}-{same}");
            let a = CLIENTS.at(&server);
            let b = if same { a.clone() } else { CLIENTS.at(&server) };
            let base = Instant::now();
            // When the latest release began, ns after `base`.
            let released = Arc::new(std::sync::atomic::AtomicU64::new(0));
            let samples = Arc::new(Mutex::new(Vec::new()));
            let threads: Vec<_> = [a, b]
                .into_iter()
                .map(|c| {
                    let (name, released, samples) =
                        (name.clone(), released.clone(), samples.clone());
                    spawn(move || {
                        for _ in 0..ROUNDS {
                            let release: Release = if fair {
                                take_fair(&c, &name)
                            } else {
                                take_lock(&c, &name)
                            };
                            let at = base.elapsed().as_nanos() as u64;
                            let from = released.load(Ordering::SeqCst);
                            if from > 0 {
                                samples.lock().unwrap().push(at - from);
                            }
                            thread::sleep(Duration::from_millis(2));
                            released.store(base.elapsed().as_nanos() as u64, Ordering::SeqCst);
                            release();
                        }
                    })
                })
                .collect();
            for t in &threads {
                done(t, "a ping-pong thread");
            }
            let mut s = samples.lock().unwrap().clone();
            s.sort_unstable();
            let p = |q: f64| s[((s.len() - 1) as f64 * q) as usize] / 1_000;
            eprintln!(
                "{} {}: handoff p50 {} µs, p99 {} µs ({} samples)",
                if fair { "FairLock" } else { "Lock" },
                if same {
                    "one client (local)"
                } else {
                    "two clients (published)"
                },
                p(0.5),
                p(0.99),
                s.len()
            );
        }
    }
}

/// PUBLISHes and SPUBLISHes of every node of `cluster` so far.
fn cluster_publishes(cluster: &Cluster) -> u64 {
    (0..cluster.nodes().len())
        .map(|i| {
            let calls = support::commandstats(&mut cluster.node(i).connection());
            ["publish", "spublish"]
                .iter()
                .map(|c| calls.get(*c).copied().unwrap_or(0))
                .sum::<u64>()
        })
        .sum()
}

/// On a Redis Cluster (waiters listening with sharded pub/sub from 7.0 on, flag 128;
/// classic before), a handoff to a thread of the releasing client is neither SPUBLISHed
/// nor PUBLISHed on any node; one to another client's thread is.
#[test]
fn on_a_cluster_a_local_handoff_publishes_on_no_node() {
    let cluster = Cluster::new(3, 0);
    let c = CLIENTS.cluster_at(cluster.seed_urls());
    let other = CLIENTS.cluster_at(cluster.seed_urls());
    for (i, fair) in [false, true, false, true].into_iter().enumerate() {
        let remote = i >= 2;
        let name = format!("cluster-{i}");
        let queue = Keys::lock(PREFIX, &name).queue();
        let take: Take = if fair { take_fair } else { take_lock };
        let release = take(&c, &name);
        let waiter = if remote { other.clone() } else { c.clone() };
        let n = name.clone();
        let got = spawn(move || {
            let release = take(&waiter, &n);
            let at = Instant::now();
            release();
            at
        });
        let mut con = cluster.connection_for_key(&queue);
        assert!(
            wait_until(SETUP, || support::llen(&mut con, &queue) == 1),
            "the waiter queued"
        );
        let before = cluster_publishes(&cluster);
        let released = Instant::now();
        release();
        let took = done(&got, "the waiter") - released;
        let published = cluster_publishes(&cluster) - before;
        assert!(took < PROMPTLY, "{name}: the waiter took {took:?}");
        if remote {
            assert!(
                published >= 1,
                "{name}: a handoff to another client is published"
            );
        } else {
            assert_eq!(
                published, 0,
                "{name}: a handoff within the client published"
            );
        }
    }
}

/// A release that hands a read-write lock to a run of readers of its own client returns a
/// message for each in its reply: all of them hold at once, and nothing is published.
#[test]
fn a_run_of_local_readers_is_handed_on_in_one_reply() {
    let server = RedisServer::new();
    let c = CLIENTS.at(&server);
    let queue = Keys::rw(PREFIX, "readers").queue();
    let release = take_write(&c, "readers");
    const READERS: usize = 3;
    let all_in = Arc::new(std::sync::Barrier::new(READERS));
    let readers: Vec<_> = (0..READERS)
        .map(|i| {
            let (c, all_in) = (c.clone(), all_in.clone());
            let r = spawn(move || {
                let release = take_read(&c, "readers");
                let at = Instant::now();
                // Every reader holds before any gives its share back: one run.
                all_in.wait();
                release();
                at
            });
            await_queued(&server, &queue, i as i64 + 1);
            r
        })
        .collect();
    let before = publishes(&server);
    let released = Instant::now();
    release();
    for r in &readers {
        let took = done(r, "a reader") - released;
        assert!(took < PROMPTLY, "a reader took {took:?}");
    }
    assert_eq!(
        publishes(&server) - before,
        0,
        "the readers' handoff published"
    );
}
