//! `redmutex run`: a command run while the lock is held, through `__guard`, a small
//! process in between that puts the command in a process group of its own and kills that
//! group when redmutex dies, however it dies.

use std::ffi::OsString;
use std::io::ErrorKind;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::process::{Command, ExitStatus};
use std::str::FromStr;
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::thread;
use std::time::{Duration, Instant};

use clap::Args;
use crossbeam_channel::{
    bounded, never, select, unbounded, Receiver, RecvTimeoutError, Sender, TryRecvError,
};
use nix::errno::Errno;
use nix::sys::prctl::set_pdeathsig;
use nix::sys::signal::{kill, killpg, pthread_sigmask, SigSet, SigmaskHow, Signal};
use nix::sys::wait::{waitid, Id, WaitPidFlag};
use nix::unistd::{getpgrp, getpid, getppid, Pid};
use redmutex::{
    CancellationToken, Client, Error, Fair, FencedGuard, Kind, Lock, LockGuard, LockOptions,
    Permit, ReadGuard, WriteGuard,
};
use signal_hook::consts::{FORBIDDEN, SIGCONT, SIGHUP, SIGINT, SIGQUIT, SIGTERM, SIGTSTP};
use signal_hook::iterator::{Handle, Signals};

use crate::{connect, duration, fail, lease, warn, Connection, LEASE_LOST, NOT_ACQUIRED};

/// The signals redmutex answers (passing them on once the command runs).
const CAUGHT: [i32; 4] = [SIGINT, SIGTERM, SIGHUP, SIGQUIT];
/// How long a signal that arrives while the lock is being taken waits for the call to
/// return before redmutex exits. The signal cancels the wait, which then returns within a
/// round trip (or two: leaving the queue); a round trip under way ends well within it, and
/// if it took the lock, the lock is given back at once instead of staying held for a lease.
const ACQUIRE_GRACE: Duration = Duration::from_secs(1);

/// How to take the lock: shared by `run` and `hold`.
#[derive(Args)]
pub(crate) struct TakeArgs {
    /// The lock name (with -n, the semaphore's; with --shared or -x, the read-write
    /// lock's). A name is one kind at a time: one held as another kind is refused (exit 65).
    name: String,
    /// Wait at most this long for the lock, then exit 75; default: as long as it takes.
    #[arg(short, long, value_parser = duration, conflicts_with = "no_wait")]
    wait: Option<Duration>,
    /// Do not wait: exit 75 at once if the lock is held.
    #[arg(long)]
    no_wait: bool,
    /// How long the lock outlives a redmutex that died; renewed every third of it while
    /// held (at least 3ms).
    #[arg(short, long, value_parser = lease, default_value = "30s")]
    lease: Duration,
    /// First come, first served: wait in line behind every earlier waiter.
    #[arg(long, conflicts_with_all = ["semaphore", "shared", "exclusive"])]
    fair: bool,
    /// Hold one of N permits of the semaphore NAME instead of the lock: up to N holders
    /// at once. N sets its number of permits when the semaphore does not exist yet.
    #[arg(short = 'n', long, value_name = "N", conflicts_with_all = ["shared", "exclusive"],
          value_parser = clap::value_parser!(u32).range(1..))]
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

#[derive(Args)]
pub(crate) struct RunArgs {
    #[command(flatten)]
    take: TakeArgs,
    /// Pass the hold's fencing token (a number larger than any earlier holder's) to the
    /// command in this environment variable.
    #[arg(long, value_name = "VAR",
          conflicts_with_all = ["fair", "semaphore", "shared", "exclusive"])]
    token_env: Option<String>,
    /// The signal the command gets if the lease is lost while it runs (TERM, KILL, INT,
    /// HUP, USR1, …), or `none` to let it run on.
    #[arg(long, value_name = "SIGNAL", default_value = "TERM", value_parser = on_lost)]
    on_lost: Lost,
    /// The command and its arguments: everything after the lock name (or after `--`).
    #[arg(
        required = true,
        trailing_var_arg = true,
        allow_hyphen_values = true,
        value_name = "COMMAND"
    )]
    command: Vec<OsString>,
}

#[derive(Args)]
pub(crate) struct HoldArgs {
    #[command(flatten)]
    take: TakeArgs,
}

/// What to do to the command when the lease is lost.
#[derive(Clone, Copy)]
pub(crate) struct Lost(Option<Signal>);

fn on_lost(s: &str) -> Result<Lost, String> {
    if s.eq_ignore_ascii_case("none") {
        return Ok(Lost(None));
    }
    let name = s.to_ascii_uppercase();
    let name = if name.starts_with("SIG") {
        name
    } else {
        format!("SIG{name}")
    };
    Signal::from_str(&name)
        .map(|sig| Lost(Some(sig)))
        .map_err(|_| format!("{s:?} is not a signal name (TERM, KILL, INT, HUP, USR1, …) or none"))
}

/// A held lock of any kind the command can be run under.
enum Held {
    Plain(LockGuard),
    Fair(LockGuard<Fair>),
    Fenced(FencedGuard),
    Shared(ReadGuard),
    Exclusive(WriteGuard),
    Permit(Permit),
}

impl Held {
    /// Ready once the lease is lost (or the lock released).
    fn lost(&self) -> Receiver<()> {
        match self {
            Held::Plain(g) => g.lost(),
            Held::Fair(g) => g.lost(),
            Held::Fenced(g) => g.lost(),
            Held::Shared(g) => g.lost(),
            Held::Exclusive(g) => g.lost(),
            Held::Permit(p) => p.lost(),
        }
    }

    fn unlock(self) -> Result<(), Error> {
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
fn deadline(wait: Duration) -> Option<Instant> {
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
fn acquire(
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
fn kind_of(args: &TakeArgs) -> &'static str {
    if args.semaphore.is_some() {
        "semaphore"
    } else if args.shared || args.exclusive {
        "read-write lock"
    } else {
        "lock"
    }
}

/// How long before redmutex says whom it waits for.
const NOTICE_AFTER: Duration = Duration::from_secs(1);

/// Says once on standard error whom `name` waits for, if the acquisition has not
/// returned after [`NOTICE_AFTER`] (the returned sender, dropped, says it returned).
fn notice(client: &Client, name: &str, kind: &'static str, quiet: bool) -> Sender<()> {
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
        let line = crate::show::waiting_for(&name, kind, &found);
        // Not if the acquisition returned meanwhile: the note would be stale.
        if done.try_recv() == Err(TryRecvError::Empty) {
            warn(format_args!("{line}"));
        }
    });
    done_tx
}

/// Reports a failed acquisition of `name` and returns the exit code.
fn failed(client: &Client, name: &str, e: &Error) -> u8 {
    crate::refused_as_not_a_lock(client, name, e).unwrap_or_else(|| fail(e))
}

/// Job control from the terminal (Ctrl-Z, `fg`, `bg`), which the command's group would
/// not see: passed on while the command runs.
const JOB: [i32; 2] = [SIGTSTP, SIGCONT];

/// The signals blocked in every thread of redmutex but the one that catches them:
/// [`CAUGHT`] and [`JOB`].
fn caught_set() -> SigSet {
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
    signals: Receiver<i32>,
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

pub(crate) fn run(connection: &Connection, args: RunArgs, quiet: bool) -> Result<u8, Error> {
    let take = &args.take;
    // Caught before the lock is taken: a signal that arrives as it is taken must find
    // redmutex able to give it back, not end it with the lock held for a lease.
    let catcher = Catcher::install(&take.name, (take.lease / 3).min(ACQUIRE_GRACE))?;
    let client = connect(connection, Some(take.lease))?;
    let name = take.name.as_str();
    let waiting = notice(&client, name, kind_of(take), quiet);
    let held = acquire(&client, take, args.token_env.is_some(), catcher.cancel());
    drop(waiting);
    let signalled = catcher.settle();
    let held = match (held, signalled) {
        (Err(Error::Cancelled), Some(code)) => return Ok(stopped(name, code)),
        (Ok(held), _) => held,
        (Err(e), _) => return Ok(failed(&client, name, &e)),
    };
    let Some(held) = held else {
        if let Some(code) = signalled {
            return Ok(code);
        }
        return Ok(not_acquired(take));
    };
    if let Some(code) = signalled {
        warn(format_args!(
            "redmutex: a signal arrived as {name} was acquired; released, the command not run"
        ));
        if let Err(e) = held.unlock() {
            fail(&e);
        }
        return Ok(code);
    }
    // From here on a signal is passed on to the command, and redmutex waits for it.
    let outcome = supervise(&args, &held, &catcher.signals);
    drop(catcher);
    let released = held.unlock();
    let code = match outcome {
        Ok(code) => code,
        Err(not_started) => {
            // The lock was held for nothing, and is free again.
            if let Err(e) = released {
                fail(&e);
            }
            return Ok(not_started);
        }
    };
    match released {
        Ok(()) => Ok(code),
        Err(Error::LeaseLost { .. } | Error::NotHeld { .. }) => Ok(LEASE_LOST),
        Err(e) => {
            // The command ran under the lock; only the release failed (it ends with its
            // lease): the command's status still tells what happened.
            warn(format_args!("redmutex: releasing {name} failed: {e}"));
            Ok(code)
        }
    }
}

/// Says that a signal (exit code `code`, 128 + n) ended the wait for `name`; the exit code.
fn stopped(name: &str, code: u8) -> u8 {
    warn(format_args!(
        "redmutex: signal {} while waiting for {name}; not acquired",
        code.wrapping_sub(128)
    ));
    code
}

/// Says that the lock was not acquired in time; the exit code.
fn not_acquired(take: &TakeArgs) -> u8 {
    let within = match take.wait {
        Some(wait) => format!("within {}", humantime::format_duration(wait)),
        None => "at once (--no-wait)".to_owned(),
    };
    warn(format_args!(
        "redmutex: {} is held by another; not acquired {within}",
        take.name
    ));
    NOT_ACQUIRED
}

/// `redmutex hold`: takes the lock, says `held NAME`, and keeps it until a signal (then
/// releases it: exit 0) or until its lease is lost (exit 76).
pub(crate) fn hold(connection: &Connection, args: HoldArgs, quiet: bool) -> Result<u8, Error> {
    let take = &args.take;
    let catcher = Catcher::install(&take.name, (take.lease / 3).min(ACQUIRE_GRACE))?;
    let client = connect(connection, Some(take.lease))?;
    let name = take.name.as_str();
    let waiting = notice(&client, name, kind_of(take), quiet);
    let held = acquire(&client, take, false, catcher.cancel());
    drop(waiting);
    let signalled = catcher.settle();
    let held = match (held, signalled) {
        (Err(Error::Cancelled), Some(code)) => return Ok(stopped(name, code)),
        (Ok(Some(held)), _) => held,
        (Ok(None), _) => return Ok(signalled.unwrap_or_else(|| not_acquired(take))),
        (Err(e), _) => return Ok(failed(&client, name, &e)),
    };
    if let Some(code) = signalled {
        // Asked to stop as it was taken: given back at once, as `run` does.
        if let Err(e) = held.unlock() {
            fail(&e);
        }
        return Ok(code);
    }
    let said = crate::print(&format!("held {name}\n"));
    if said != 0 {
        // Nobody reads what it says: released rather than held unseen.
        let _ = held.unlock();
        return Ok(said);
    }
    let lost = held.lost();
    select! {
        recv(catcher.signals) -> _ => {}
        recv(lost) -> _ => {}
    }
    drop(catcher);
    match held.unlock() {
        Ok(()) => Ok(0),
        Err(Error::LeaseLost { .. } | Error::NotHeld { .. }) => {
            warn(format_args!(
                "redmutex: the lease of {name} was lost while held; another holder may have it now"
            ));
            Ok(LEASE_LOST)
        }
        Err(e) => Ok(fail(&e)),
    }
}

/// `redmutex wait`: takes the lock and gives it back at once, with signals caught around
/// the acquisition as `run` does, so that a Ctrl-C never leaves the lock held.
pub(crate) fn wait(
    connection: &Connection,
    name: &str,
    wait: Option<Duration>,
    quiet: bool,
) -> Result<u8, Error> {
    let catcher = Catcher::install(name, ACQUIRE_GRACE)?;
    let client = connect(connection, None)?;
    let lock = client.lock(name);
    let waiting = notice(&client, name, "lock", quiet);
    let options = LockOptions::new().cancellable(catcher.cancel());
    let guard = lock.try_lock_with(match wait.and_then(deadline) {
        Some(until) => options.wait_until(until),
        None => options,
    });
    drop(waiting);
    let signalled = catcher.settle();
    let guard = match (guard, signalled) {
        (Err(Error::Cancelled), Some(code)) => return Ok(stopped(name, code)),
        (Ok(guard), _) => guard,
        (Err(e), _) => return Ok(failed(&client, name, &e)),
    };
    match guard {
        Some(guard) => {
            guard.unlock()?;
            Ok(signalled.unwrap_or(0))
        }
        None => {
            if let Some(code) = signalled {
                return Ok(code);
            }
            warn(format_args!(
                "redmutex: {name} was still held after {}",
                humantime::format_duration(wait.unwrap_or_default())
            ));
            Ok(NOT_ACQUIRED)
        }
    }
}

/// Starts the command (through `__guard`) and waits for it, passing signals on and
/// watching the lease. The exit code, or `Err(code)` when it was not started.
///
/// Runs on the main thread: the guard's parent-death signal fires when the thread that
/// started it ends, and only the main thread lives as long as redmutex.
fn supervise(args: &RunArgs, held: &Held, signals: &Receiver<i32>) -> Result<u8, u8> {
    if let Ok(sig) = signals.try_recv() {
        // Asked to stop before the command started: it never will.
        warn(format_args!(
            "redmutex: signal {sig} before the command started"
        ));
        return Err(128u8.wrapping_add(sig as u8));
    }
    // Ctrl-Z stops redmutex's group, the terminal's foreground job, and not the
    // command's: it is passed on, then redmutex stops itself (and so stops renewing, as
    // a stopped `flock` would not, but the command is stopped too); `fg` or `bg`
    // continues redmutex, which continues the command.
    let (job_tx, job) = unbounded();
    let mut job_signals = Signals::new(JOB).map_err(|e| {
        warn(format_args!("redmutex: cannot catch job control: {e}"));
        71u8
    })?;
    let job_handle = job_signals.handle();
    thread::spawn(move || {
        for sig in job_signals.forever() {
            if job_tx.send(sig).is_err() {
                return;
            }
        }
    });
    let _closes_job = Closes(job_handle);
    // /proc/self/exe, not a path: the very binary running, even if replaced on disk since.
    let mut command = Command::new("/proc/self/exe");
    command
        .arg0("redmutex")
        .arg("__guard")
        .arg("--parent")
        .arg(std::process::id().to_string());
    if let Lost(Some(sig)) = args.on_lost {
        command.arg("--catch").arg(sig.as_str());
    }
    command.arg("--").args(&args.command).process_group(0);
    if let (Some(var), Held::Fenced(guard)) = (&args.token_env, held) {
        command.env(var, guard.token().to_string());
    }
    let mut guard = match command.spawn() {
        Ok(child) => child,
        Err(e) => {
            warn(format_args!("redmutex: cannot start the command: {e}"));
            return Err(126);
        }
    };
    // The guard leads the command's process group: its pid is the group's id.
    let group = Pid::from_raw(guard.id() as i32);
    let (done_tx, done) = bounded(1);
    thread::spawn(move || loop {
        // Waits without reaping: until the loop below reaps it, after its last signal,
        // the guard's pid (the group's id) cannot be given to another process.
        match waitid(Id::Pid(group), WaitPidFlag::WEXITED | WaitPidFlag::WNOWAIT) {
            Err(Errno::EINTR) => continue,
            _ => {
                let _ = done_tx.send(());
                return;
            }
        }
    });
    // Told by the client the moment the lease is lost: no polling. (The lock is only
    // released after this loop, so the channel is ready for a loss alone.)
    let mut lease = held.lost();
    let mut lost = false;
    loop {
        select! {
            recv(done) -> _ => {
                // The one place that reaps: no signal is sent from here on.
                let code = match guard.wait() {
                    Ok(status) => code_of(status),
                    Err(e) => {
                        warn(format_args!("redmutex: waiting for the command failed: {e}"));
                        1
                    }
                };
                if lost {
                    warn(format_args!(
                        "redmutex: the command exited with {code} after the lease was lost"
                    ));
                    return Ok(LEASE_LOST);
                }
                return Ok(code);
            }
            recv(signals) -> sig => {
                // The command is not in the terminal's foreground group, so a Ctrl-C
                // reaches only redmutex: every signal caught is passed on.
                if let Ok(Ok(sig)) = sig.map(Signal::try_from) {
                    signal(group, sig);
                }
            }
            recv(job) -> sig => {
                if sig == Ok(SIGTSTP) {
                    signal(group, Signal::SIGTSTP);
                    let _ = kill(getpid(), Signal::SIGSTOP);
                } else {
                    signal(group, Signal::SIGCONT);
                }
            }
            recv(lease) -> _ => {
                // Ready for good once lost: looked at once.
                lease = never();
                if !lost {
                    lost = true;
                    warn(format_args!(
                        "redmutex: the lease of {} was lost while the command ran; another \
                         holder may run now",
                        args.take.name
                    ));
                    if let Lost(Some(sig)) = args.on_lost {
                        signal(group, sig);
                    }
                }
            }
        }
    }
}

/// Closes a signal iterator when dropped, ending the thread that reads it.
struct Closes(Handle);

impl Drop for Closes {
    fn drop(&mut self) {
        self.0.close();
    }
}

/// Sends `sig` to the command's process group (the command, what it started, and the
/// guard, which survives the signals it is told of).
fn signal(group: Pid, sig: Signal) {
    if let Err(e) = killpg(group, sig) {
        if e != Errno::ESRCH {
            warn(format_args!(
                "redmutex: could not send {sig} to the command: {e}"
            ));
        }
    }
}

/// `redmutex __guard`: started by `run` as the leader of a new process group; runs the
/// command in that group and exits with its status.
#[derive(Args)]
pub(crate) struct GuardArgs {
    /// The pid of the redmutex that started it.
    #[arg(long)]
    parent: i32,
    /// A signal besides INT, TERM, HUP and QUIT that redmutex may send the group (its
    /// --on-lost), which the guard must survive.
    #[arg(long, value_parser = on_lost)]
    catch: Option<Lost>,
    /// The command and its arguments.
    #[arg(required = true, last = true)]
    command: Vec<OsString>,
}

/// The guard: the command must not outlive the redmutex that holds its lock, since once
/// the lock's lease ends another run may start. redmutex's death, whatever killed it,
/// reaches the guard as its parent-death signal (SIGTERM; the kernel sends it), and the
/// guard then SIGKILLs the whole group, itself included: the command and every process it
/// started in it (a shell's pipeline). SIGKILL, not a polite signal, because nothing is
/// left to wait for a command that lingers: the lock is already running out, and a
/// command that outlived it would run beside the next holder.
pub(crate) fn guard(args: GuardArgs) -> u8 {
    let mut caught = CAUGHT.to_vec();
    if let Some(Lost(Some(sig))) = args.catch {
        let sig = sig as i32;
        if !FORBIDDEN.contains(&sig) && !caught.contains(&sig) {
            caught.push(sig);
        }
    }
    // Caught, not ignored: a signal redmutex sends the group reaches the command and
    // leaves the guard in place, while the command starts with the default actions (exec
    // resets caught signals, not ignored ones).
    let mut signals = match Signals::new(&caught) {
        Ok(signals) => signals,
        Err(e) => {
            warn(format_args!("redmutex: cannot catch signals: {e}"));
            return 71;
        }
    };
    // Blocked in redmutex's threads (see Catcher::install), and so here: unblocked, for
    // the guard to get them and the command to start as if run from a shell.
    if let Err(e) = pthread_sigmask(SigmaskHow::SIG_UNBLOCK, Some(&caught_set()), None) {
        warn(format_args!("redmutex: cannot unblock signals: {e}"));
        return 71;
    }
    if let Err(e) = set_pdeathsig(Signal::SIGTERM) {
        warn(format_args!(
            "redmutex: cannot watch for redmutex's death: {e}"
        ));
        return 71;
    }
    let parent = Pid::from_raw(args.parent);
    if getppid() != parent {
        // redmutex died before the line above, so the signal will never come: the
        // command must not start.
        return 128 + 9;
    }
    if let Some(sig) = signals.pending().next() {
        // redmutex passed a signal on before the command started: it never will.
        return 128u8.wrapping_add(sig as u8);
    }
    let (program, rest) = args.command.split_first().expect("clap requires a command");
    let mut child = match Command::new(program).args(rest).spawn() {
        Ok(child) => child,
        Err(e) => {
            warn(format_args!(
                "redmutex: cannot run {}: {e}",
                program.to_string_lossy()
            ));
            // As shells do: 127 not found, 126 found but not runnable.
            return if e.kind() == ErrorKind::NotFound {
                127
            } else {
                126
            };
        }
    };
    let (done_tx, done) = bounded(1);
    thread::spawn(move || {
        let _ = done_tx.send(child.wait());
    });
    let (signal_tx, caught) = unbounded();
    let handle = signals.handle();
    thread::spawn(move || {
        for sig in signals.forever() {
            if signal_tx.send(sig).is_err() {
                return;
            }
        }
    });
    loop {
        select! {
            recv(done) -> status => {
                handle.close();
                return match status.expect("the waiting thread sends once") {
                    Ok(status) => code_of(status),
                    Err(e) => {
                        warn(format_args!("redmutex: waiting for the command failed: {e}"));
                        1
                    }
                };
            }
            recv(caught) -> _ => {
                // Passed on by redmutex (the command has it too, and decides), unless
                // redmutex is gone: then its parent is another process now.
                if getppid() != parent {
                    let _ = killpg(getpgrp(), Signal::SIGKILL);
                }
            }
        }
    }
}

/// A shell's exit code for `status`: the code, or 128 + the signal that ended it.
fn code_of(status: ExitStatus) -> u8 {
    match (status.code(), status.signal()) {
        (Some(code), _) => code as u8,
        (None, Some(sig)) => 128u8.wrapping_add(sig as u8),
        (None, None) => 1,
    }
}
