//! `LockName`: the byte-string-like values that can name a lock.

use std::borrow::Cow;

use crate::Error;

/// The longest name of a lock (or read-write lock, semaphore, latch), in bytes: 4 KiB.
/// A longer name fails every operation with [`Error::InvalidName`], before anything is
/// sent. Every call carries the name several times (the object's key, its queue's and
/// other auxiliary keys, its channel), each key adding the client's `key_prefix` and a
/// few dozen bytes of its own, so a name of megabytes would be sent megabytes at a time
/// on every call, renewal and release.
pub const MAX_NAME_LEN: usize = 4096;

/// The refusal of a name longer than [`MAX_NAME_LEN`] (the number is spelled out, which a
/// `&'static str` cannot take from the constant: a test keeps them equal).
const TOO_LONG: &str = "names must be at most 4096 bytes long (MAX_NAME_LEN)";

/// Whether `name` can name an object: [`Error::InvalidName`] for an empty one (`empty`
/// says so, for its kind of object) and for one longer than [`MAX_NAME_LEN`].
pub(crate) fn check(name: &[u8], empty: &'static str) -> Result<(), Error> {
    if name.is_empty() {
        return Err(Error::InvalidName(empty));
    }
    if name.len() > MAX_NAME_LEN {
        return Err(Error::InvalidName(TOO_LONG));
    }
    Ok(())
}

/// A value that can name a lock: any string or byte string, borrowed or owned, from 1 to
/// [`MAX_NAME_LEN`] bytes long (the handle of any other is made, and each of its
/// operations fails with [`Error::InvalidName`]).
///
/// Implemented for references to anything that is `AsRef<[u8]>` (`&str`, `&String`,
/// `&[u8]`, `&Vec<u8>`, `&[u8; N]`, …) and for the owned `String`, `Vec<u8>`, `Box<str>`,
/// `Box<[u8]>`, `[u8; N]`, `Cow<str>` and `Cow<[u8]>`, which are moved in without a copy
/// where possible. Names are compared as bytes: `"a"` and `b"a"` are the same lock.
///
/// ```no_run
/// # use std::borrow::Cow;
/// # let client = redmutex::Client::open("redis://127.0.0.1/")?;
/// let id = String::from("order:7");
/// let a = client.lock(&id);                       // borrowed: `id` stays usable
/// let b = client.lock(Cow::Borrowed("order:7"));
/// let c = client.lock(id.as_bytes().to_vec());
/// assert_eq!(a.name(), c.name());
/// # drop(b);
/// # Ok::<(), redmutex::Error>(())
/// ```
pub trait LockName {
    /// The name's bytes.
    fn into_name(self) -> Vec<u8>;
}

impl<T: AsRef<[u8]> + ?Sized> LockName for &T {
    fn into_name(self) -> Vec<u8> {
        self.as_ref().to_vec()
    }
}

impl LockName for String {
    fn into_name(self) -> Vec<u8> {
        self.into_bytes()
    }
}

impl LockName for Vec<u8> {
    fn into_name(self) -> Vec<u8> {
        self
    }
}

impl LockName for Box<str> {
    fn into_name(self) -> Vec<u8> {
        self.into_string().into_bytes()
    }
}

impl LockName for Box<[u8]> {
    fn into_name(self) -> Vec<u8> {
        self.into_vec()
    }
}

impl<const N: usize> LockName for [u8; N] {
    fn into_name(self) -> Vec<u8> {
        self.to_vec()
    }
}

impl LockName for Cow<'_, str> {
    fn into_name(self) -> Vec<u8> {
        self.into_owned().into_bytes()
    }
}

impl LockName for Cow<'_, [u8]> {
    fn into_name(self) -> Vec<u8> {
        self.into_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_refusal_names_the_maximum() {
        assert!(
            TOO_LONG.contains(&format!(" {MAX_NAME_LEN} ")),
            "{TOO_LONG}"
        );
        assert!(check(&[b'n'; MAX_NAME_LEN], "empty").is_ok());
        assert!(matches!(
            check(&[b'n'; MAX_NAME_LEN + 1], "empty"),
            Err(Error::InvalidName(TOO_LONG))
        ));
        assert!(matches!(
            check(b"", "empty"),
            Err(Error::InvalidName("empty"))
        ));
    }
}
