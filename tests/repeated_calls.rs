//! Calls the client sends again after a lost reply (issue 17, item 10): the repeat must
//! answer what the first run did, never the opposite. Each reply is lost for real: a proxy
//! lets the request reach Redis, then swallows the answer and closes the connection.

mod support;

use redmutex::{Client, Error};
use support::keys::{Keys, DEFAULT_PREFIX};
use support::{FaultProxy, RedisServer};

/// A server; a holder talking to it directly; an admin talking through a proxy that can
/// lose replies; and the name of `script`'s function, the marker of its calls.
struct Lossy {
    server: RedisServer,
    proxy: FaultProxy,
    holder: Client,
    admin: Client,
    sha: String,
}

impl Lossy {
    fn new(script: &str) -> Lossy {
        let server = RedisServer::new();
        let proxy = FaultProxy::new(server.port());
        let holder = Client::open(server.url()).unwrap();
        let admin = Client::open(proxy.url()).unwrap();
        // Loads the scripts (so that the fault hits the real call, not a load round).
        let sha = support::function_name(&server.url(), script);
        Lossy {
            server,
            proxy,
            holder,
            admin,
            sha,
        }
    }

    /// The admin's force-unlock `r` lost its first reply, was repeated, and answered that it
    /// freed `key`, which is gone.
    fn assert_repeated_and_freed(&self, r: Result<bool, Error>, key: &str) {
        assert_eq!(self.proxy.lost_replies(), 1, "the fault was injected");
        assert!(self.proxy.seen(&self.sha) >= 2, "the call was repeated");
        assert!(r.unwrap(), "the repeat answers that the lock was freed");
        assert!(
            !support::exists(&mut self.server.connection(), key),
            "freed"
        );
    }
}

/// `force_unlock` of a held lock whose reply is lost: the repeat finds the lock already
/// gone, and still answers `true` (it freed it), so the CLI does not say "nothing
/// removed" after removing a hold. A later call on the free lock answers `false`.
#[test]
fn a_force_unlock_whose_reply_is_lost_answers_that_it_freed_the_lock() {
    let lossy = Lossy::new("force_unlock");
    let (proxy, holder, admin, sha) = (&lossy.proxy, &lossy.holder, &lossy.admin, &lossy.sha);

    let guard = holder.lock("held").lock().unwrap();
    proxy.lose_next_reply_to(sha);
    let r = admin.lock("held").force_unlock();
    lossy.assert_repeated_and_freed(r, &Keys::lock(DEFAULT_PREFIX, "held").key());
    assert!(matches!(
        guard.unlock(),
        Err(Error::NotHeld { .. } | Error::LeaseLost { .. })
    ));
    assert!(
        !admin.lock("held").force_unlock().unwrap(),
        "a new call on the free lock"
    );

    // A lock that was free when the first run came answers false on the repeat too.
    proxy.lose_next_reply_to(sha);
    assert!(!admin.lock("free").force_unlock().unwrap());
    assert_eq!(proxy.lost_replies(), 2);
}

/// The same for a read-write lock held by readers.
#[test]
fn a_read_write_force_unlock_whose_reply_is_lost_answers_that_it_freed_the_lock() {
    let lossy = Lossy::new("rw_force_unlock");
    let (proxy, holder, admin, sha) = (&lossy.proxy, &lossy.holder, &lossy.admin, &lossy.sha);

    let rw = holder.read_write_lock("shared");
    let read = rw.read_lock().lock().unwrap();
    proxy.lose_next_reply_to(sha);
    let r = admin.read_write_lock("shared").write_lock().force_unlock();
    lossy.assert_repeated_and_freed(r, &Keys::rw(DEFAULT_PREFIX, "shared").key());
    assert!(read.unlock().is_err(), "the reader's hold is gone");
}
