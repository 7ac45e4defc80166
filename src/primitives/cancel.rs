//! `CancellationToken`: a way for another thread to stop a blocked acquisition.

use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

use crossbeam_channel::{Receiver, Sender};
use parking_lot::Mutex;

/// Stops blocked acquisitions from another thread: shutdown, a user pressing cancel.
///
/// Give the token to an acquisition through [`LockOptions::cancellable`](crate::LockOptions::cancellable)
/// (every lock-like type's `try_lock_with` / `try_acquire_with` takes it: the locks of
/// every kind, their owned forms, a [`MultiLock`](crate::MultiLock), a
/// [`Semaphore`](crate::Semaphore)), and call [`cancel`](CancellationToken::cancel) from anywhere. Every call waiting
/// with the token wakes at once (the token is one of the things its thread sleeps on; no
/// polling), leaves the lock's queue in one script, and returns
/// [`Error::Cancelled`](crate::Error::Cancelled). A call given a token that is already
/// cancelled returns `Cancelled` without sending anything.
///
/// `Err(Cancelled)` always means the call holds nothing: if the lock was handed to the
/// waiter just as it was cancelled, the same script that takes it out of the queue gives
/// the hold back and hands the lock on to the next waiter. A cancel that comes while the
/// call's own attempt is on its way may be too late: the call then returns the guard, as
/// it would without the cancel (release it if it is no longer wanted). A round trip under
/// way is not interrupted: a cancel takes effect when it returns, within the command
/// timeout at the worst.
///
/// The token is cheap to clone (clones share the state), `Send` and `Sync`, and once
/// cancelled stays cancelled: use a new token for the next wait. One token may be given
/// to any number of calls, on any threads; one `cancel` stops them all.
///
/// ```no_run
/// use redmutex::{CancellationToken, Error, LockOptions};
///
/// let client = redmutex::Client::open("redis://127.0.0.1/")?;
/// let lock = client.lock("jobs");
/// let token = CancellationToken::new();
/// let waiter = {
///     let (lock, options) = (lock.clone(), LockOptions::new().cancellable(&token));
///     std::thread::spawn(move || match lock.try_lock_with(options) {
///         Ok(Some(guard)) => guard.unlock(),
///         Ok(None) => unreachable!("no wait bound was set"),
///         Err(Error::Cancelled { .. }) => Ok(()), // nothing held, out of the queue
///         Err(e) => Err(e),
///     })
/// };
/// // ... on shutdown:
/// token.cancel();
/// waiter.join().unwrap()?;
/// # Ok::<(), redmutex::Error>(())
/// ```
#[derive(Clone)]
pub struct CancellationToken {
    shared: Arc<Shared>,
}

struct Shared {
    cancelled: AtomicBool,
    // Never sent on: dropped by `cancel`, which disconnects `signal` and so wakes every
    // thread selecting on it, however many, at once.
    trigger: Mutex<Option<Sender<()>>>,
    signal: Receiver<()>,
}

impl CancellationToken {
    /// A token not cancelled yet.
    ///
    /// ```no_run
    /// let token = redmutex::CancellationToken::new();
    /// assert!(!token.is_cancelled());
    /// ```
    pub fn new() -> CancellationToken {
        let (trigger, signal) = crossbeam_channel::bounded(0);
        CancellationToken {
            shared: Arc::new(Shared {
                cancelled: AtomicBool::new(false),
                trigger: Mutex::new(Some(trigger)),
                signal,
            }),
        }
    }

    /// Cancels every call waiting with this token (or a clone of it), now and later.
    /// Calling it again changes nothing.
    ///
    /// ```no_run
    /// let token = redmutex::CancellationToken::new();
    /// let for_ctrl_c = token.clone();
    /// // e.g. in a signal handler's thread:
    /// for_ctrl_c.cancel();
    /// assert!(token.is_cancelled());
    /// ```
    pub fn cancel(&self) {
        // The flag first: a thread woken by the signal must find it set.
        self.shared.cancelled.store(true, Ordering::SeqCst);
        self.shared.trigger.lock().take();
    }

    /// Whether [`cancel`](CancellationToken::cancel) was called on this token or a clone of it.
    ///
    /// ```no_run
    /// # let token = redmutex::CancellationToken::new();
    /// while !token.is_cancelled() {
    ///     // ... one more round of work ...
    /// #   break;
    /// }
    /// ```
    pub fn is_cancelled(&self) -> bool {
        self.shared.cancelled.load(Ordering::SeqCst)
    }

    /// Ready (disconnected) once the token is cancelled: for a waiting thread to select on
    /// beside its own messages.
    pub(crate) fn signal(&self) -> &Receiver<()> {
        &self.shared.signal
    }

    /// Sleeps until `until` or the cancel, whichever comes first.
    pub(crate) fn sleep_until(&self, until: Instant) {
        let _ = self.shared.signal.recv_deadline(until);
    }
}

impl Default for CancellationToken {
    fn default() -> Self {
        CancellationToken::new()
    }
}

impl fmt::Debug for CancellationToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CancellationToken")
            .field("cancelled", &self.is_cancelled())
            .finish()
    }
}

/// Whether the call given `cancel` (if any) was cancelled.
pub(crate) fn is_cancelled(cancel: Option<&CancellationToken>) -> bool {
    cancel.is_some_and(CancellationToken::is_cancelled)
}

/// Sleeps until `until`, or until `cancel` (if any) is cancelled.
pub(crate) fn sleep_until(until: Instant, cancel: Option<&CancellationToken>) {
    match cancel {
        Some(c) => c.sleep_until(until),
        None => std::thread::sleep(until.saturating_duration_since(Instant::now())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn a_cancel_wakes_every_sleeper_at_once() {
        let token = CancellationToken::new();
        assert!(!token.is_cancelled());
        let far = Instant::now() + Duration::from_secs(30);
        let sleepers: Vec<_> = (0..3)
            .map(|_| {
                let t = token.clone();
                std::thread::spawn(move || {
                    t.sleep_until(far);
                    (Instant::now(), t.is_cancelled())
                })
            })
            .collect();
        token.cancel();
        token.cancel();
        for s in sleepers {
            let (woke, seen) = s.join().unwrap();
            assert!(seen);
            assert!(woke < far - Duration::from_secs(20));
        }
        assert!(token.is_cancelled());
        // Already cancelled: no sleep at all.
        let before = Instant::now();
        sleep_until(Instant::now() + Duration::from_secs(30), Some(&token));
        assert!(before.elapsed() < Duration::from_secs(5));
    }
}
