mod support;

use std::sync::mpsc;
use std::thread;
use std::time::Duration;

use redmutex::{Client, Error};
use support::RedisServer;

fn client(url: &str) -> Client {
    Client::builder().url(url).key_prefix("s:").build().unwrap()
}

#[test]
fn rw_basics() {
    let server = RedisServer::new();
    let c = client(&server.url());
    let rw = c.read_write_lock("cfg");
    let r1 = rw.read().lock().unwrap();
    let r2 = rw.read().lock().unwrap();
    assert_eq!(rw.read().hold_count().unwrap(), 2);
    // Another thread reads too, but cannot write.
    let rw2 = rw.clone();
    thread::spawn(move || {
        assert!(rw2.write().try_lock().unwrap().is_none());
        let g = rw2.read().try_lock().unwrap().expect("readers share");
        g.unlock().unwrap();
    })
    .join()
    .unwrap();
    // Upgrade is refused at once.
    assert!(matches!(
        rw.write().try_lock_for(Duration::from_secs(5)),
        Err(Error::WouldDeadlock)
    ));
    drop(r2);
    r1.unlock().unwrap();
    assert!(!rw.is_locked_any());
}

trait AnyLocked {
    fn is_locked_any(&self) -> bool;
}
impl AnyLocked for redmutex::ReadWriteLock {
    fn is_locked_any(&self) -> bool {
        self.read().is_locked().unwrap()
    }
}

#[test]
fn rw_writer_waits_and_downgrades() {
    let server = RedisServer::new();
    let c = client(&server.url());
    let rw = c.read_write_lock("cfg");
    let r = rw.read().lock().unwrap();
    let (tx, rx) = mpsc::channel();
    let rw2 = rw.clone();
    let writer = thread::spawn(move || {
        let w = rw2.write().lock().unwrap();
        tx.send("wrote").unwrap();
        let rd = rw2.read().lock().unwrap(); // downgrade
        w.unlock().unwrap();
        tx.send("downgraded").unwrap();
        thread::sleep(Duration::from_millis(300));
        rd.unlock().unwrap();
    });
    thread::sleep(Duration::from_millis(300));
    // A new reader queues behind the waiting writer.
    let rw3 = rw.clone();
    let late = thread::spawn(move || {
        let t = std::time::Instant::now();
        assert!(rw3
            .read()
            .try_lock_for(Duration::from_millis(200))
            .unwrap()
            .is_none());
        t.elapsed()
    });
    assert!(late.join().unwrap() >= Duration::from_millis(190));
    assert!(rx.try_recv().is_err());
    r.unlock().unwrap();
    assert_eq!(rx.recv_timeout(Duration::from_secs(2)).unwrap(), "wrote");
    assert_eq!(
        rx.recv_timeout(Duration::from_secs(2)).unwrap(),
        "downgraded"
    );
    // Downgraded: others read again.
    let g = rw
        .read()
        .try_lock_for(Duration::from_secs(2))
        .unwrap()
        .expect("read after downgrade");
    drop(g);
    writer.join().unwrap();
}

#[test]
fn semaphore_basics() {
    let server = RedisServer::new();
    let c = client(&server.url());
    let s = c.semaphore("api", 2);
    let p1 = s.acquire().unwrap();
    assert_eq!(s.available_permits().unwrap(), 1);
    let p2 = s.try_acquire().unwrap().expect("second");
    assert!(s.try_acquire().unwrap().is_none());
    let s2 = s.clone();
    let waiter = thread::spawn(move || s2.acquire_many(2).unwrap());
    thread::sleep(Duration::from_millis(200));
    p1.release().unwrap();
    thread::sleep(Duration::from_millis(100));
    assert_eq!(
        s.available_permits().unwrap(),
        1,
        "one free, the waiter needs two"
    );
    let p = thread::spawn(move || p2.release().unwrap());
    p.join().unwrap();
    let got = waiter.join().unwrap();
    assert_eq!(got.permits(), 2);
    assert_eq!(s.available_permits().unwrap(), 0);
    assert_eq!(s.add_permits(3).unwrap(), 5);
    assert_eq!(s.available_permits().unwrap(), 3);
    assert!(matches!(
        s.reduce_permits(9),
        Err(Error::InvalidArgument(_))
    ));
    assert!(matches!(s.acquire_many(0), Err(Error::InvalidArgument(_))));
    drop(got);
    assert_eq!(s.available_permits().unwrap(), 5);
}
