//! `LockKind`: which kind of object a `LockInfo` describes.

use std::fmt;

/// Which kind of object a [`LockInfo`](crate::LockInfo) describes: one name is at most one
/// of each, and each kind has keys of its own. `Display` writes the names the `redmutex`
/// command and [`Client::force_unlock`](crate::Client::force_unlock) use (`lock`,
/// `read-write lock`, `semaphore`, `count-down latch`, `foreign`).
///
/// ```no_run
/// use redmutex::LockKind;
///
/// # let client = redmutex::Client::open("redis://127.0.0.1/")?;
/// for info in client.inspect("nightly-report")? {
///     match info.kind {
///         LockKind::Foreign => println!("{}: someone else's key", info.key),
///         kind => println!("{kind} {}: held by {:?}", info.name, info.holders),
///     }
/// }
/// # Ok::<(), redmutex::Error>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum LockKind {
    /// A lock: plain, fair and fenced locks are one object.
    Lock,
    /// A read-write lock: its readers, its upgradeable reader and its writer.
    ReadWrite,
    /// A semaphore.
    Semaphore,
    /// A count-down latch.
    CountDownLatch,
    /// The object's key holds data that is not a redmutex object (someone else's key).
    Foreign,
}

impl LockKind {
    /// The kind's name, as `Display` writes it.
    pub fn as_str(self) -> &'static str {
        match self {
            LockKind::Lock => "lock",
            LockKind::ReadWrite => "read-write lock",
            LockKind::Semaphore => "semaphore",
            LockKind::CountDownLatch => "count-down latch",
            LockKind::Foreign => "foreign",
        }
    }
}

impl fmt::Display for LockKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // `pad`, not `write_str`: widths and alignment apply, as they did to the names.
        f.pad(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::LockKind;

    #[test]
    fn display_writes_the_names_and_honours_widths() {
        let all = [
            (LockKind::Lock, "lock"),
            (LockKind::ReadWrite, "read-write lock"),
            (LockKind::Semaphore, "semaphore"),
            (LockKind::CountDownLatch, "count-down latch"),
            (LockKind::Foreign, "foreign"),
        ];
        for (kind, name) in all {
            assert_eq!(kind.to_string(), name);
            assert_eq!(format!("{kind:>20}|"), format!("{name:>20}|"));
        }
    }
}
