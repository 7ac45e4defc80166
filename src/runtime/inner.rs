//! `Inner`, what every clone of a `Client` shares and every part of the runtime reaches: the
//! executor, the subscriber, the table of what this process holds and its watchdog, and the
//! count of live handles; and what each background thread may ask of it (`watchdog::Owner`,
//! `loss::LossSource`, `subscriber::ForceUnlocked`), each thread holding it by a `Weak`.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Instant;

use crate::runtime::config::Config;
use crate::runtime::connection::executor::Executor;
use crate::runtime::connection::target::Target;
use crate::runtime::holds::loss::{Loss, LossSource, Notifier};
use crate::runtime::holds::watchdog::{self, Watchdog};
use crate::runtime::holds::{lease, HoldTable};
use crate::runtime::keys::LockKeys;
use crate::runtime::subscriber::{ForceUnlocked, Subscriber};

/// The shared state behind a `Client` and its guards.
pub(crate) struct Inner {
    // Runs the calls: the pool, the deployment, the settings (see `Executor`).
    pub(crate) exec: Executor,
    pub(crate) subscriber: Subscriber,
    // What this process holds: its levels, leases, doubts, waits and losses.
    pub(crate) holds: HoldTable,
    // The thread that renews `holds` (started when first needed).
    pub(crate) watchdog: Watchdog,
    // Live `Client` values, the ones inside `Lock`s included. At zero nobody can take a
    // lock any more, and the watchdog stops renewing.
    pub(super) handles: AtomicUsize,
}

impl Inner {
    /// The shared state of a new client with `id`, counting one handle (the `Client` about
    /// to be made); no connection is opened and no thread started.
    pub(super) fn new(id: String, target: Target, config: Config) -> Inner {
        let holds = HoldTable::new(config.on_lease_lost.clone());
        let exec = Executor::new(id, target, config);
        let subscriber = Subscriber::new(exec.manager(), &exec.config.key_prefix, &exec.id);
        Inner {
            exec,
            subscriber,
            holds,
            watchdog: Watchdog::new(),
            handles: AtomicUsize::new(1),
        }
    }

    /// Whether any `Client` (or `Lock`) of this client is still alive.
    pub(crate) fn has_handles(&self) -> bool {
        self.handles.load(Ordering::Acquire) > 0
    }
}

impl LossSource for Inner {
    fn notifier(&self) -> &Notifier {
        &self.holds.notifier
    }

    fn check_loss(
        &self,
        keys: &LockKeys,
        token: u64,
        loss: &Arc<Loss>,
        popped: Option<Instant>,
    ) -> Option<Instant> {
        self.holds.check_loss(keys, token, loss, popped)
    }
}

impl watchdog::Owner for Inner {
    fn executor(&self) -> &Executor {
        &self.exec
    }

    fn holds(&self) -> &HoldTable {
        &self.holds
    }

    fn watchdog(&self) -> &Watchdog {
        &self.watchdog
    }

    fn recheck(&self, channel: &[u8], token: u64) {
        self.subscriber.recheck(channel, token);
    }

    fn has_handles(&self) -> bool {
        Inner::has_handles(self)
    }
}

impl ForceUnlocked for Inner {
    fn force_unlocked(&self, key: &[u8], token: u64) {
        // A notice that finds no hold is kept for a grant still on its way: its reply comes
        // within the command timeout (twice: a WAIT of sync_replicas may follow it), a
        // handed-over hold is taken within its pickup window.
        let keep = 2 * self.exec.config.command_timeout + lease::PICKUP;
        self.holds.force_unlocked(key, token, keep);
    }

    fn unheard(self: Arc<Self>) {
        self.watchdog.check_holds(&self);
    }
}
