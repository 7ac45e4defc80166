//! `LockName`: the byte-string-like values that can name a lock.

use std::borrow::Cow;

/// A value that can name a lock: any string or byte string, borrowed or owned.
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
