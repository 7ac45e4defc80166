//! Taking the lock that `run`, `hold` and `wait` ask for: of which kind, how long to wait,
//! and what to say when it is not taken.

use std::thread;
use std::time::{Duration, Instant};

use clap::Args;
use crossbeam_channel::{bounded, Receiver, RecvTimeoutError, Sender, TryRecvError};
use redmutex::{
    CancellationToken, Client, Error, Fair, FencedGuard, Kind, Lock, LockGuard, LockKind,
    LockOptions, LostLease, Permit, ReadGuard, WriteGuard,
};

use crate::output::{fail, refused_as_not_a_lock, warn, NOT_ACQUIRED};
use crate::parse::{duration, lease, permits};
use crate::show;

/// How to take the lock: shared by `run` and `hold`.
#[derive(Args)]
pub(crate) struct TakeArgs {
    /// The lock name (with -n, the semaphore's; with --shared or -x, the read-write
    /// lock's). A name is one kind at a time: one held as another kind is refused (exit 65).
    pub(crate) name: String,
    /// Wait at most this long for the lock, then exit 75; default: as long as it takes.
    #[arg(short, long, value_parser = duration, conflicts_with = "no_wait")]
    wait: Option<Duration>,
    /// Do not wait: exit 75 at once if the lock is held (flock's -n; -n here is the
    /// semaphore's number of permits).
    #[arg(long)]
    no_wait: bool,
    /// The exit code when the lock is not acquired (--no-wait, or --wait ran out), as
    /// flock's -E: flock(1) exits 1 then, redmutex 75 (EX_TEMPFAIL) unless told.
    #[arg(short = 'E', long, value_name = "N", default_value_t = NOT_ACQUIRED)]
    pub(crate) conflict_exit_code: u8,
    /// How long the lock outlives a redmutex that died; renewed every third of it while
    /// held (at least 3ms).
    #[arg(short, long, value_parser = lease, default_value = "30s")]
    pub(crate) lease: Duration,
    /// First come, first served: wait in line behind every earlier waiter.
    #[arg(long, conflicts_with_all = ["semaphore", "shared", "exclusive"])]
    fair: bool,
    /// Hold one of N permits of the semaphore NAME instead of the lock: up to N holders
    /// at once. N sets its number of permits when the semaphore does not exist yet.
    #[arg(short = 'n', long, value_name = "N", conflicts_with_all = ["shared", "exclusive"],
          value_parser = permits)]
    semaphore: Option<u32>,
    /// Hold the read side of the read-write lock NAME: any number of --shared holders at
    /// once, while no writer (-x) holds it.
    #[arg(short = 's', long)]
    shared: bool,
    /// Hold the write side of the read-write lock NAME: alone, while no --shared holder
    /// holds it (flock's -x against -s).
    #[arg(short = 'x', long, conflicts_with = "shared")]
    exclusive: bool,
}

/// A held lock of any kind the command can be run under.
pub(crate) enum Held {
    Plain(LockGuard),
    Fair(LockGuard<Fair>),
    Fenced(FencedGuard),
    Shared(ReadGuard),
    Exclusive(WriteGuard),
    Permit(Permit),
}

impl Held {
    /// Told once the lease is lost (closed once the lock is released).
    pub(crate) fn lost(&self) -> Receiver<LostLease> {
        match self {
            Held::Plain(g) => g.lost(),
            Held::Fair(g) => g.lost(),
            Held::Fenced(g) => g.lost(),
            Held::Shared(g) => g.lost(),
            Held::Exclusive(g) => g.lost(),
            Held::Permit(p) => p.lost(),
        }
    }

    pub(crate) fn unlock(self) -> Result<(), Error> {
        match self {
            Held::Plain(g) => g.unlock(),
            Held::Fair(g) => g.unlock(),
            Held::Fenced(g) => g.unlock(),
            Held::Shared(g) => g.unlock(),
            Held::Exclusive(g) => g.unlock(),
            Held::Permit(p) => p.release(),
        }
    }
}

/// The deadline of a wait of `wait` (`--wait`), `None` when it is too long to have one
/// (then it waits as long as it takes).
pub(crate) fn deadline(wait: Duration) -> Option<Instant> {
    Instant::now().checked_add(wait)
}

/// The options `args` say: at once (`--no-wait`, one attempt), within `--wait`, or as
/// long as it takes; a wait ends early with `Error::Cancelled` once `cancel` is.
fn options(args: &TakeArgs, cancel: &CancellationToken) -> LockOptions {
    if args.no_wait {
        return LockOptions::new().wait_for(Duration::ZERO);
    }
    let options = LockOptions::new().cancellable(cancel);
    match args.wait.and_then(deadline) {
        Some(until) => options.wait_until(until),
        None => options,
    }
}

/// Takes `lock` as `args` say (see [`options`]).
fn take<K: Kind>(
    lock: Lock<K>,
    args: &TakeArgs,
    cancel: &CancellationToken,
) -> Result<Option<LockGuard<K>>, Error> {
    lock.try_lock_with(options(args, cancel))
}

/// Takes what `args` ask for (`fenced`: a fenced lock, for --token-env); `cancel` ends
/// a wait, as in [`take`].
pub(crate) fn acquire(
    client: &Client,
    args: &TakeArgs,
    fenced: bool,
    cancel: &CancellationToken,
) -> Result<Option<Held>, Error> {
    let name = args.name.as_str();
    if let Some(permits) = args.semaphore {
        return client
            .semaphore(name, permits)
            .try_acquire_with(options(args, cancel))
            .map(|p| p.map(Held::Permit));
    }
    if args.shared {
        take(client.read_write_lock(name).read_lock(), args, cancel).map(|h| h.map(Held::Shared))
    } else if args.exclusive {
        take(client.read_write_lock(name).write_lock(), args, cancel)
            .map(|h| h.map(Held::Exclusive))
    } else if fenced {
        take(client.fenced_lock(name), args, cancel).map(|h| h.map(Held::Fenced))
    } else if args.fair {
        take(client.fair_lock(name), args, cancel).map(|h| h.map(Held::Fair))
    } else {
        take(client.lock(name), args, cancel).map(|h| h.map(Held::Plain))
    }
}

/// The kind `status` reports for what `args` take.
pub(crate) fn kind_of(args: &TakeArgs) -> LockKind {
    if args.semaphore.is_some() {
        LockKind::Semaphore
    } else if args.shared || args.exclusive {
        LockKind::ReadWrite
    } else {
        LockKind::Lock
    }
}

/// How long before redmutex says whom it waits for.
const NOTICE_AFTER: Duration = Duration::from_secs(1);

/// Says once on standard error whom `name` waits for, if the acquisition has not
/// returned after [`NOTICE_AFTER`] (the returned sender, dropped, says it returned).
pub(crate) fn notice(client: &Client, name: &str, kind: LockKind, quiet: bool) -> Sender<()> {
    let (done_tx, done) = bounded::<()>(0);
    if quiet {
        return done_tx;
    }
    let (client, name) = (client.clone(), name.to_owned());
    thread::spawn(move || {
        if done.recv_timeout(NOTICE_AFTER) != Err(RecvTimeoutError::Timeout) {
            return;
        }
        let found = client.inspect(name.as_str()).unwrap_or_default();
        let line = show::waiting_for(&name, kind, &found);
        // Not if the acquisition returned meanwhile: the note would be stale.
        if done.try_recv() == Err(TryRecvError::Empty) {
            warn(format_args!("{line}"));
        }
    });
    done_tx
}

/// Reports a failed acquisition of `name` and returns the exit code.
pub(crate) fn failed(client: &Client, name: &str, e: &Error) -> u8 {
    refused_as_not_a_lock(client, name, e).unwrap_or_else(|| fail(e))
}

/// Says that a signal (exit code `code`, 128 + n) ended the wait for `name`; the exit code.
pub(crate) fn stopped(name: &str, code: u8) -> u8 {
    warn(format_args!(
        "redmutex: signal {} while waiting for {name}; not acquired",
        code.wrapping_sub(128)
    ));
    code
}

/// Says that the lock was not acquired in time; the exit code.
pub(crate) fn not_acquired(take: &TakeArgs) -> u8 {
    let within = match take.wait {
        Some(wait) => format!("within {}", humantime::format_duration(wait)),
        None => "at once (--no-wait)".to_owned(),
    };
    let name = &take.name;
    // What is in the way, as the kind taken sees it.
    let held = if take.semaphore.is_some() {
        format!("all permits of {name} are in use")
    } else if take.shared {
        format!("{name} is held for writing, or a writer waits its turn")
    } else if take.exclusive {
        format!("{name} is held by readers or a writer")
    } else {
        format!("{name} is held by another")
    };
    warn(format_args!("redmutex: {held}; not acquired {within}"));
    take.conflict_exit_code
}
