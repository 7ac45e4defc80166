//! The signals redmutex catches: from before a lock is taken to after it is released, no
//! signal ends redmutex while it holds one.

use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::thread;
use std::time::Duration;

use crossbeam_channel::{unbounded, Receiver};
use nix::sys::signal::{pthread_sigmask, SigSet, SigmaskHow, Signal};
use redmutex::{CancellationToken, Error};
use signal_hook::consts::{SIGCONT, SIGHUP, SIGINT, SIGQUIT, SIGTERM, SIGTSTP};
use signal_hook::iterator::{Handle, Signals};

use crate::output::warn;

/// The signals redmutex answers (passing them on once the command runs).
pub(crate) const CAUGHT: [i32; 4] = [SIGINT, SIGTERM, SIGHUP, SIGQUIT];
/// How long a signal that arrives while the lock is being taken waits for the call to
/// return before redmutex exits. The signal cancels the wait, which then returns within a
/// round trip (or two: leaving the queue); a round trip under way ends well within it, and
/// if it took the lock, the lock is given back at once instead of staying held for a lease.
pub(crate) const ACQUIRE_GRACE: Duration = Duration::from_secs(1);

/// Job control from the terminal (Ctrl-Z, `fg`, `bg`), which the command's group would
/// not see: passed on while the command runs.
pub(crate) const JOB: [i32; 2] = [SIGTSTP, SIGCONT];

/// The signals blocked in every thread of redmutex but the one that catches them:
/// [`CAUGHT`] and [`JOB`].
pub(crate) fn caught_set() -> SigSet {
    let mut set = SigSet::empty();
    for sig in CAUGHT.into_iter().chain(JOB) {
        set.add(Signal::try_from(sig).expect("a valid signal"));
    }
    set
}

/// Where the acquisition is: shared by the thread that takes the lock and the one that
/// catches signals.
enum Phase {
    /// Being taken; the first signal that arrived meanwhile.
    Acquiring(Option<i32>),
    /// Taken or not: signals go to the channel from now on.
    Settled,
}

/// Catches [`CAUGHT`] from before the lock is taken to after it is released, so that no
/// signal ends redmutex while it holds the lock.
pub(crate) struct Catcher {
    /// The signals that arrived once the acquisition was settled.
    pub(crate) signals: Receiver<i32>,
    handle: Handle,
    phase: Arc<(Mutex<Phase>, Condvar)>,
    /// Cancelled by the first signal that arrives while the lock is being taken: the wait
    /// ends on the signal itself, as flock(1)'s does.
    cancel: CancellationToken,
}

impl Catcher {
    /// Catches from now on. Until [`settle`](Catcher::settle), a signal cancels the
    /// acquisition's wait (through [`cancel`](Catcher::cancel)) and waits up to `grace` for
    /// it to return (its outcome then decides), and ends redmutex with 128 + n if it has
    /// not: a wait may last forever (a connection being made, a single `--no-wait` attempt,
    /// are not cancelled), and a wait that has not returned holds nothing that outlives the
    /// process, short of a reply still under way.
    pub(crate) fn install(name: &str, grace: Duration) -> Result<Catcher, Error> {
        let mut caught = Signals::new(CAUGHT).map_err(Error::Thread)?;
        let handle = caught.handle();
        let phase = Arc::new((Mutex::new(Phase::Acquiring(None)), Condvar::new()));
        let (tx, signals) = unbounded();
        let shared = Arc::clone(&phase);
        let name = name.to_owned();
        let cancel = CancellationToken::new();
        let canceller = cancel.clone();
        thread::spawn(move || {
            for sig in caught.forever() {
                let (lock, settled) = &*shared;
                let mut phase = lock.lock().unwrap_or_else(PoisonError::into_inner);
                if let Phase::Acquiring(first) = &mut *phase {
                    let sig = *first.get_or_insert(sig);
                    // The wait leaves the queue and returns `Cancelled` at once.
                    canceller.cancel();
                    let (phase, _) = settled
                        .wait_timeout_while(phase, grace, |p| matches!(p, Phase::Acquiring(_)))
                        .unwrap_or_else(PoisonError::into_inner);
                    if matches!(*phase, Phase::Acquiring(_)) {
                        warn(format_args!(
                            "redmutex: signal {sig} while waiting for {name}; not acquired"
                        ));
                        std::process::exit(128 + sig);
                    }
                    // The acquiring thread took the signal over with the outcome.
                    continue;
                }
                drop(phase);
                if tx.send(sig).is_err() {
                    return;
                }
            }
        });
        // Every other thread, this one and those it starts (the client's), blocks them:
        // a signal handled on a thread interrupts its blocking call, and a Redis read with a
        // timeout then fails with EINTR whatever SA_RESTART says. A child inherits the
        // mask: the guard unblocks them before it starts the command.
        pthread_sigmask(SigmaskHow::SIG_BLOCK, Some(&caught_set()), None)
            .map_err(|e| Error::Thread(std::io::Error::from(e)))?;
        Ok(Catcher {
            signals,
            handle,
            phase,
            cancel,
        })
    }

    /// What the acquisition waits with: cancelled by a signal.
    pub(crate) fn cancel(&self) -> &CancellationToken {
        &self.cancel
    }

    /// The acquisition returned: the signal that arrived while it ran, if any (later ones
    /// come through `signals`).
    pub(crate) fn settle(&self) -> Option<u8> {
        let (lock, settled) = &*self.phase;
        let mut phase = lock.lock().unwrap_or_else(PoisonError::into_inner);
        let first = match *phase {
            Phase::Acquiring(first) => first,
            Phase::Settled => None,
        };
        *phase = Phase::Settled;
        settled.notify_all();
        first.map(|sig| 128u8.wrapping_add(sig as u8))
    }
}

impl Drop for Catcher {
    fn drop(&mut self) {
        self.handle.close();
    }
}
