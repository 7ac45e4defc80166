//! `HolderMetadata`: what a hold records of who took it (`ClientBuilder::metadata`) and when.

use std::time::SystemTime;

/// What one current hold records beside its holder id: the text of the client that took
/// it ([`ClientBuilder::metadata`]) and the server's time when it was taken. Part of
/// [`LockInfo::metadata`]; only holds taken by a client with metadata have one.
///
/// ```no_run
/// # let client = redmutex::Client::open("redis://127.0.0.1/")?;
/// for info in client.inspect("nightly-report")? {
///     for m in &info.metadata {
///         let held_for = m.since.elapsed().unwrap_or_default();
///         println!("{} ({}) has held it for {held_for:?}", m.holder, m.text);
///     }
/// }
/// # Ok::<(), redmutex::Error>(())
/// ```
///
/// [`ClientBuilder::metadata`]: crate::ClientBuilder::metadata
/// [`LockInfo::metadata`]: crate::LockInfo::metadata
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct HolderMetadata {
    /// The holder id, as in [`LockInfo::holders`](crate::LockInfo::holders) (`r:<id>`,
    /// `u:<id>`, `w:<id>` for a read-write lock's holds).
    pub holder: String,
    /// The text the holder's client was built with.
    pub text: String,
    /// The server's clock (Redis `TIME`) when the hold was taken: its outermost level,
    /// or the handoff that made the holder; re-entries keep it.
    pub since: SystemTime,
}
