//! Redisson-style distributed locks on Redis, with a blocking API.
//!
//! A [`Lock`] is a named mutex shared by every thread and process that talks to the same
//! Redis. It is reentrant per thread (nested critical sections may take it again), its
//! lease is kept alive by a watchdog while held and runs out if the holder crashes, and
//! waiting threads sleep until Redis pub/sub tells them the lock was released: no polling.
//!
//! ```no_run
//! use std::time::Duration;
//!
//! let client = redmutex::Client::open("redis://127.0.0.1:6379/")?;
//! let lock = client.lock("accounts:42");
//!
//! {
//!     let _guard = lock.lock()?;                   // blocks until held
//!     let _nested = lock.lock()?;                  // same thread: re-enters
//! }                                                // both levels released here
//!
//! match lock.try_lock_for(Duration::from_millis(500))? {
//!     Some(guard) => guard.unlock()?,              // unlock() reports release errors
//!     None => println!("busy, try later"),
//! }
//! # Ok::<(), redmutex::Error>(())
//! ```
//!
//! [`Client::open`] takes every default; [`Client::builder`] gives a [`ClientBuilder`] for
//! the client's other settings, each with its default: the server (or a Sentinel service,
//! or a Cluster), the key prefix, the watchdog's lease, the text every hold records for
//! operators, a hook told of every lost hold, timeouts and TLS. What one acquisition asks
//! beyond the default (a fixed lease, a bound on the wait, a [`CancellationToken`]) travels
//! as one [`LockOptions`] value:
//!
//! ```no_run
//! use std::time::Duration;
//! use redmutex::{CancellationToken, Client, LockOptions};
//!
//! let client = Client::builder()
//!     .url("redis://127.0.0.1:6379/")
//!     .watchdog_timeout(Duration::from_secs(10)) // a crashed holder's locks free within 10 s
//!     .metadata("nightly-billing")                // recorded with each hold, for operators
//!     .build()?;
//! let token = CancellationToken::new();             // token.cancel() stops the wait
//! let options = LockOptions::new()
//!     .wait_for(Duration::from_secs(5))
//!     .cancellable(&token);
//! if let Some(guard) = client.lock("accounts:42").try_lock_with(options)? {
//!     guard.unlock()?;
//! }
//! # Ok::<(), redmutex::Error>(())
//! ```
//!
//! Every check-and-write runs inside one Lua script on the server, so a lock can never be
//! granted to two holders. The [`guide`] holds the rest of the reference: the guarantees
//! and failure modes, how waiting and the watchdog work, the Redis layout, Sentinel,
//! Cluster and RedLock, security, tracing and metrics, and the benchmarks.
//!
//! The family: a [`FairLock`] hands the lock to its waiters strictly in the order they
//! asked; a [`FencedLock`]'s guards carry fencing tokens; a [`ReadWriteLock`] lets many
//! readers or one writer in, and never starves a waiting writer (beside its readers, one
//! upgradeable reader may [`upgrade`](UpgradeableGuard::upgrade) to writing without
//! letting a writer in between); a [`Semaphore`] caps how
//! many hold it at once, each [`Permit`] with an owner and a lease, so a crashed holder's
//! permits come back; a [`CountDownLatch`] lets threads and processes wait until a count
//! of events has happened. A [`MultiLock`] holds a lock over several servers: RedLock
//! across independent masters (held on a majority), or several locks all at once. A
//! plain [`Lock`] lets a running thread barge past sleeping waiters only while the first
//! of them has waited less than 2 ms, so nobody starves.
//! The locks are one generic type, [`Lock<K>`](Lock) over the [`Kind`]s [`Plain`] (the
//! default), [`Fair`], [`Fenced`], [`Read`], [`Write`] and [`Upgradeable`]: `FairLock`
//! is `Lock<Fair>`, and a read-write lock's sides are a `Lock<Read>`, a `Lock<Write>` and
//! a `Lock<Upgradeable>`, with the very same surface and guards.
//!
//! The library logs through `tracing` alone, under the target `redmutex`: a lost lease is
//! one WARN event per hold (`lease lost`: lock name, kind, reason); without a `tracing`
//! subscriber its events go to the `log` logger instead (tracing's `log` feature).
//! What the locks do can be watched: with feature `tracing` (on by default) every
//! acquisition is also a `redmutex.acquire` span (lock name, kind, holder, outcome, time
//! waited, handoff or not) and each release a `released` event, at DEBUG; with feature
//! `metrics`, counters and histograms named `redmutex_*`
//! (acquisitions, waits, wait and hold times, handoffs, renewals, renewal failures, lost
//! leases) go to the recorder of the `metrics` facade. Without a subscriber or recorder
//! they cost next to nothing. [`guide::observability`] lists every name.

#![forbid(unsafe_code)]
#![deny(missing_docs)]

#[cfg(feature = "conformance")]
#[doc(hidden)]
#[path = "conformance.rs"]
pub mod __conformance;
mod error;
mod name;
mod primitives;
mod runtime;

pub use crate::{
    error::Error,
    name::{LockName, MAX_NAME_LEN},
    primitives::cancel::CancellationToken,
    primitives::guard::{FencedGuard, LockGuard},
    primitives::holder_metadata::HolderMetadata,
    primitives::info::LockInfo,
    primitives::kind::{Fair, Fenced, Kind, Plain, Read, Upgradeable, Write},
    primitives::latch::{CountDownLatch, LatchOptions},
    primitives::lock::{FairLock, FencedLock, Lock},
    primitives::lock_kind::LockKind,
    primitives::multi_guard::MultiLockGuard,
    primitives::multilock::MultiLock,
    primitives::options::LockOptions,
    primitives::owned_guard::OwnedGuard,
    primitives::owned_lock::OwnedLock,
    primitives::permit::Permit,
    primitives::rwlock::{
        ReadGuard, ReadLock, ReadWriteLock, UpgradeableLock, WriteGuard, WriteLock,
    },
    primitives::semaphore::{Semaphore, MAX_PERMITS},
    primitives::upgradeable::UpgradeableGuard,
    runtime::builder::ClientBuilder,
    runtime::client::Client,
    runtime::holds::loss::{LossReason, LostLease},
};

// Compiles the README's examples with the doctests, so they cannot rot.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;

/// The reference beyond each type's page: the files of the repository's `docs/`, shown
/// here so that docs.rs carries them, and compiled with the doctests so that their
/// examples cannot rot. Links between them point at the repository's files.
pub mod guide {
    #[doc = include_str!("../docs/api.md")]
    pub mod api {}
    #[doc = include_str!("../docs/guarantees-and-failure-modes.md")]
    pub mod guarantees {}
    #[doc = include_str!("../docs/how-it-works.md")]
    pub mod how_it_works {}
    #[doc = include_str!("../docs/holds.md")]
    pub mod holds {}
    #[doc = include_str!("../docs/family.md")]
    pub mod family {}
    #[doc = include_str!("../docs/topologies.md")]
    pub mod topologies {}
    #[doc = include_str!("../docs/redis-layout.md")]
    pub mod redis_layout {}
    #[doc = include_str!("../docs/security.md")]
    pub mod security {}
    #[doc = include_str!("../docs/observability.md")]
    pub mod observability {}
    #[doc = include_str!("../docs/benchmarks.md")]
    pub mod benchmarks {}
    #[doc = include_str!("../docs/comparison.md")]
    pub mod comparison {}
    #[doc = include_str!("../docs/cli.md")]
    pub mod cli {}
    #[doc = include_str!("../docs/servers.md")]
    pub mod servers {}
    #[doc = include_str!("../docs/development.md")]
    pub mod development {}
}
