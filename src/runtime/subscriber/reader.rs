//! The reader thread: owns the client's classic pub/sub connection, (re)connects it,
//! subscribes the channels waiters asked for and hands every message it reads to the
//! dispatch (`dispatch.rs`); it ends once the client is gone.

use std::collections::VecDeque;
use std::mem::ManuallyDrop;
use std::sync::Weak;
use std::thread;
use std::time::{Duration, Instant};

use super::dispatch::Shared;
use super::{
    HEALTH_CHECK_AFTER, IDLE_READ_TICK, MAX_RECONNECT_BACKOFF, PRIMARY_CHECK, READ_TICK,
    UNNUDGED_READ_TICK,
};
use crate::runtime::connection::pool;

/// The reader thread's body: a session per connection, reconnecting with a backoff, until
/// the client is gone.
pub(super) fn run(shared: Weak<Shared>) {
    let mut backoff = Duration::from_millis(10);
    let mut reconnect = false;
    loop {
        let Some(strong) = shared.upgrade() else {
            return;
        };
        let con = strong.manager.connect();
        drop(strong);
        match con {
            Ok((mut con, generation)) => {
                let began = Instant::now();
                match session(&shared, &mut con, generation, reconnect) {
                    Ok(()) => return,
                    Err(e) => {
                        tracing::warn!(
                            target: "redmutex",
                            error = %e,
                            "redmutex: pub/sub connection lost, reconnecting"
                        )
                    }
                }
                reconnect = true;
                if let Some(strong) = shared.upgrade() {
                    // Before the next session delivers a message: a grant it brings may
                    // come from another server than the one its waiter queued on.
                    strong.manager.topology.changed();
                    strong.disconnected();
                    strong.not_listening();
                }
                if began.elapsed() < MAX_RECONNECT_BACKOFF {
                    // A session that failed as soon as it began (the server refusing it
                    // something) would fail again: back off as for a failed connect,
                    // never reconnect in a tight loop.
                    thread::sleep(backoff);
                    backoff = (backoff * 2).min(MAX_RECONNECT_BACKOFF);
                } else {
                    backoff = Duration::from_millis(10);
                }
            }
            Err(e) => {
                tracing::warn!(
                    target: "redmutex",
                    error = %e,
                    "redmutex: pub/sub connection failed, retrying in {backoff:?}"
                );
                if let Some(strong) = shared.upgrade() {
                    strong.not_listening();
                }
                thread::sleep(backoff);
                backoff = (backoff * 2).min(MAX_RECONNECT_BACKOFF);
            }
        }
    }
}

/// The reader's connection, spoken to by hand: redis-rs's `PubSub::subscribe` drops the
/// server's reply, so a SUBSCRIBE the ACL refused would pass for a confirmed one, and its
/// waiters would wait for messages that can never come.
struct Link<'a> {
    con: &'a mut redis::Connection,
    // Messages that arrived while a reply was awaited, delivered first.
    early: VecDeque<redis::Msg>,
    // The socket's read timeout now: a reply is given `READ_TICK`, a wait for a message
    // the tick of the moment.
    timeout: Duration,
}

impl Link<'_> {
    /// Sends `cmd` and returns its reply (a server error as a value), keeping the messages
    /// that arrive before it. `Err`: the connection failed.
    fn request(&mut self, cmd: &redis::Cmd) -> redis::RedisResult<redis::Value> {
        self.read_timeout(READ_TICK)?;
        self.con.send_packed_command(&cmd.get_packed_command())?;
        loop {
            let reply = self.con.recv_response()?;
            match redis::Msg::from_value(&reply) {
                Some(msg) => self.early.push_back(msg),
                None => return Ok(reply),
            }
        }
    }

    /// Subscribes `channel`: `Ok(Err(e))` when the server's ACL refused it (`NOPERM`),
    /// `Err` when the connection failed or the server answered another error.
    fn subscribe(&mut self, channel: &[u8]) -> redis::RedisResult<Result<(), redis::RedisError>> {
        match self
            .request(redis::cmd("SUBSCRIBE").arg(channel))?
            .extract_error()
        {
            Ok(_) => Ok(Ok(())),
            Err(e) if crate::error::is_no_permission(&e) => Ok(Err(e)),
            Err(e) => Err(e),
        }
    }

    fn unsubscribe(&mut self, channel: &[u8]) -> redis::RedisResult<()> {
        if let Err(e) = self
            .request(redis::cmd("UNSUBSCRIBE").arg(channel))?
            .extract_error()
        {
            // Still subscribed: its messages find no waiter and are dropped.
            tracing::debug!(target: "redmutex", "redmutex: the server refused an UNSUBSCRIBE: {e}");
        }
        Ok(())
    }

    /// A PING: any reply, a refusal too, shows the connection alive.
    fn ping(&mut self) -> redis::RedisResult<()> {
        self.request(&redis::cmd("PING")).map(drop)
    }

    fn read_timeout(&mut self, timeout: Duration) -> redis::RedisResult<()> {
        if self.timeout != timeout {
            self.con.set_read_timeout(Some(timeout))?;
            self.timeout = timeout;
        }
        Ok(())
    }

    /// The next message, waiting at most `tick`.
    fn next_message(&mut self, tick: Duration) -> redis::RedisResult<redis::Msg> {
        if let Some(msg) = self.early.pop_front() {
            return Ok(msg);
        }
        self.read_timeout(tick)?;
        // A `PubSub` only to read a message without taking it for a reply (a timed-out
        // reply read would make redis-rs skip the next value). Never dropped: its drop
        // would UNSUBSCRIBE every channel; it owns nothing else.
        ManuallyDrop::new(self.con.as_pubsub()).get_message()
    }
}

/// Serves one connection until it fails (`Err`) or the client is gone (`Ok`).
fn session(
    shared: &Weak<Shared>,
    con: &mut redis::Connection,
    generation: u64,
    reconnect: bool,
) -> redis::RedisResult<()> {
    con.set_read_timeout(Some(READ_TICK))?;
    let mut link = Link {
        con,
        early: VecDeque::new(),
        timeout: READ_TICK,
    };
    // While the server refuses the client's own channel: when to ask again, and the
    // pause after that (doubling as for a failed connect).
    let Some(mut control_retry) = subscribe_all(shared, &mut link, reconnect)? else {
        return Ok(());
    };
    let mut last_heard = Instant::now();
    let mut primary_checked = Instant::now();
    loop {
        let Some(strong) = shared.upgrade() else {
            return Ok(());
        };
        check_primary(&strong, generation, &mut primary_checked)?;
        update_subscriptions(&strong, &mut link, &mut control_retry)?;
        let tick = if control_retry.is_some() {
            UNNUDGED_READ_TICK
        } else {
            IDLE_READ_TICK
        };
        // Never block on the socket holding a strong reference: the client must be able
        // to go away meanwhile.
        drop(strong);
        match link.next_message(tick) {
            Ok(msg) => {
                last_heard = Instant::now();
                let channel: Vec<u8> = msg.get_channel()?;
                if let Some(strong) = shared.upgrade() {
                    strong.deliver(&channel, msg.get_payload_bytes());
                }
            }
            // A read interrupted by a signal (EINTR: on Linux a process stopped and
            // continued gets it even without handlers) broke nothing: the connection and
            // the parser's partial reply are intact, as after a read tick. Reconnecting
            // would resubscribe, and a release meanwhile would drop the waiters as dead.
            Err(e) if e.is_timeout() || pool::is_interrupted(&e) => {
                if last_heard.elapsed() >= HEALTH_CHECK_AFTER {
                    link.ping()?;
                    last_heard = Instant::now();
                }
            }
            Err(e) => return Err(e),
        }
    }
}

/// While the server refuses the client's own channel: when to ask again, and the pause
/// after that (doubling as for a failed connect).
type ControlRetry = Option<(Instant, Duration)>;

/// Subscribes, on a new connection, the client's own channel and then every channel
/// wanted; returns when to ask again for the own channel if the server refused it, or
/// `None` if the client is gone.
///
/// One channel per SUBSCRIBE and UNSUBSCRIBE: each reply says whether its one channel was
/// refused. One each costs a round trip per channel, on this thread.
fn subscribe_all(
    shared: &Weak<Shared>,
    link: &mut Link<'_>,
    reconnect: bool,
) -> redis::RedisResult<Option<ControlRetry>> {
    let Some(strong) = shared.upgrade() else {
        return Ok(None);
    };
    let answer = link.subscribe(strong.control.as_slice())?;
    let control_retry = strong.control_answered(answer, None);
    let channels = strong.begin_session();
    drop(strong);
    for channel in channels {
        let answer = link.subscribe(channel.as_slice())?;
        let Some(strong) = shared.upgrade() else {
            return Ok(None);
        };
        strong.answered(&channel, answer, reconnect);
    }
    Ok(Some(control_retry))
}

/// Under Sentinel, asks the sentinels which node is the primary (every `PRIMARY_CHECK`);
/// fails the session (`Err`) once the primary is not the one this connection reached.
fn check_primary(
    strong: &Shared,
    generation: u64,
    primary_checked: &mut Instant,
) -> redis::RedisResult<()> {
    let target = &strong.manager.target;
    if target.is_sentinel() && primary_checked.elapsed() >= PRIMARY_CHECK {
        target.refresh(strong.manager.connect_timeout);
        *primary_checked = Instant::now();
    }
    if target.generation() != generation {
        // Releases are published on the new primary now; the reconnect re-subscribes
        // there and has every waiter look again.
        return Err(redis::RedisError::from((
            redis::ErrorKind::Io,
            "the sentinels name a new primary",
        )));
    }
    Ok(())
}

/// Asks again for the client's own channel when it is time, subscribes the channels
/// waiters asked for since, and unsubscribes those nobody waits on any more.
fn update_subscriptions(
    strong: &Shared,
    link: &mut Link<'_>,
    control_retry: &mut ControlRetry,
) -> redis::RedisResult<()> {
    if control_retry.is_some_and(|(at, _)| Instant::now() >= at) {
        let answer = link.subscribe(strong.control.as_slice())?;
        *control_retry = strong.control_answered(answer, *control_retry);
    }
    for channel in strong.take_pending() {
        let answer = link.subscribe(channel.as_slice())?;
        strong.answered(&channel, answer, false);
    }
    for channel in strong.take_idle() {
        link.unsubscribe(channel.as_slice())?;
    }
    Ok(())
}
