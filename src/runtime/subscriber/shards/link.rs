//! One sharded link's thread: its connection to one primary (RESP3, spoken to by hand),
//! the session that subscribes the channels routed to it and hands what it hears to
//! `Shards` (`shards/mod.rs`), and the reconnection after a failure.

use std::sync::mpsc;
use std::sync::Weak;
use std::thread;
use std::time::{Duration, Instant};

use redis::{PushInfo, PushKind, Value};

use super::{parse_addr, refuses_command, Answer, Shards, LINK_READ_TICK};
use crate::runtime::connection::con::NodeAddr;
use crate::runtime::subscriber::dispatch::Shared;
use crate::runtime::subscriber::{HEALTH_CHECK_AFTER, MAX_RECONNECT_BACKOFF, READ_TICK};

/// Starts `node`'s link thread.
pub(super) fn start(shared: Weak<Shared>, node: NodeAddr) {
    let name = format!("redmutex-pubsub-{}:{}", node.0, node.1);
    if let Err(e) = thread::Builder::new()
        .name(name)
        .spawn(move || run(shared, node))
    {
        // Its waiters go by their lease timers; the next channel routed here tries again.
        tracing::warn!(
            target: "redmutex",
            error = %e,
            "redmutex: cannot start a pub/sub thread"
        );
    }
}

fn run(shared: Weak<Shared>, node: NodeAddr) {
    let mut backoff = Duration::from_millis(10);
    loop {
        let Some(strong) = shared.upgrade() else {
            return;
        };
        if !Shards::of(&strong).link_wanted(&node) {
            return;
        }
        let manager = &strong.manager;
        let con =
            manager
                .target
                .connect_node(&node, manager.connect_timeout, manager.command_timeout);
        drop(strong);
        let began = Instant::now();
        let failure = match con {
            Ok(mut con) => match session(&shared, &mut con, &node) {
                Ok(()) => return,
                Err(e) => e,
            },
            Err(e) => e,
        };
        tracing::debug!(
            target: "redmutex",
            error = %failure,
            node = %format!("{}:{}", node.0, node.1),
            "redmutex: sharded pub/sub link lost"
        );
        let Some(strong) = shared.upgrade() else {
            return;
        };
        strong.manager.topology.changed();
        Shards::of(&strong).link_lost(&node);
        drop(strong);
        if began.elapsed() < MAX_RECONNECT_BACKOFF {
            thread::sleep(backoff);
            backoff = (backoff * 2).min(MAX_RECONNECT_BACKOFF);
        } else {
            backoff = Duration::from_millis(10);
        }
    }
}

/// A link's connection, spoken to by hand as the classic `Link` is (see there).
struct ShardLink<'a> {
    con: &'a mut redis::Connection,
    // Every push the connection reads, whichever call read it.
    pushes: mpsc::Receiver<PushInfo>,
    timeout: Duration,
}

impl ShardLink<'_> {
    /// Sends `cmd` and returns its reply: the first value that is not a push, or the push
    /// `confirms` (its kind and channel) names. Every push also reaches `pushes`.
    fn request(
        &mut self,
        cmd: &redis::Cmd,
        confirms: Option<(PushKind, &[u8])>,
    ) -> redis::RedisResult<Value> {
        self.read_timeout(READ_TICK)?;
        self.con.send_packed_command(&cmd.get_packed_command())?;
        loop {
            let reply = self.con.recv_response()?;
            let Value::Push { kind, data } = &reply else {
                return Ok(reply);
            };
            if let Some((want, channel)) = &confirms {
                if kind == want
                    && matches!(data.first(), Some(Value::BulkString(c)) if c == channel)
                {
                    return Ok(reply);
                }
            }
        }
    }

    fn ssubscribe(&mut self, channel: &[u8]) -> redis::RedisResult<Answer> {
        let reply = self.request(
            redis::cmd("SSUBSCRIBE").arg(channel),
            Some((PushKind::SSubscribe, channel)),
        )?;
        match reply.extract_error() {
            Ok(_) => Ok(Answer::Confirmed),
            Err(e) => {
                if let Some(owner) = e.redirect_node().and_then(|(addr, _)| parse_addr(addr)) {
                    Ok(Answer::Moved(owner))
                } else if refuses_command(&e) {
                    Ok(Answer::Unsupported)
                } else if crate::error::is_no_permission(&e) {
                    Ok(Answer::Refused(e))
                } else {
                    Err(e)
                }
            }
        }
    }

    /// Listens on `channel`: its sharded messages, and once they are confirmed its
    /// classic ones too (see the module's comment).
    fn listen(&mut self, channel: &[u8]) -> redis::RedisResult<Answer> {
        let answer = self.ssubscribe(channel)?;
        if let Answer::Confirmed = answer {
            self.classic(channel, true)?;
        }
        Ok(answer)
    }

    /// Stops listening on `channel`, both ways.
    fn unlisten(&mut self, channel: &[u8]) -> redis::RedisResult<()> {
        let reply = self.request(
            redis::cmd("SUNSUBSCRIBE").arg(channel),
            Some((PushKind::SUnsubscribe, channel)),
        )?;
        if let Err(e) = reply.extract_error() {
            tracing::debug!(target: "redmutex", "redmutex: the server refused an SUNSUBSCRIBE: {e}");
        }
        self.classic(channel, false)
    }

    /// `SUBSCRIBE` (`on`) or `UNSUBSCRIBE` `channel`'s classic messages: a refusal only
    /// leaves the migration gap to the waiters' looking again, and is told at DEBUG.
    fn classic(&mut self, channel: &[u8], on: bool) -> redis::RedisResult<()> {
        let (command, kind) = if on {
            ("SUBSCRIBE", PushKind::Subscribe)
        } else {
            ("UNSUBSCRIBE", PushKind::Unsubscribe)
        };
        let reply = self.request(redis::cmd(command).arg(channel), Some((kind, channel)))?;
        if let Err(e) = reply.extract_error() {
            tracing::debug!(target: "redmutex", "redmutex: the server refused a {command}: {e}");
        }
        Ok(())
    }

    fn ping(&mut self) -> redis::RedisResult<()> {
        self.request(&redis::cmd("PING"), None).map(drop)
    }

    fn read_timeout(&mut self, timeout: Duration) -> redis::RedisResult<()> {
        if self.timeout != timeout {
            self.con.set_read_timeout(Some(timeout))?;
            self.timeout = timeout;
        }
        Ok(())
    }

    /// Waits at most `tick` for something to arrive (it reaches `pushes`). A read that
    /// times out here leaves redis-rs's reply accounting alone (unlike `recv_response`).
    fn wait(&mut self, tick: Duration) -> redis::RedisResult<()> {
        self.read_timeout(tick)?;
        match std::mem::ManuallyDrop::new(self.con.as_pubsub()).get_message() {
            Ok(_) => Ok(()),
            Err(e) if e.is_timeout() || crate::runtime::connection::pool::is_interrupted(&e) => {
                Ok(())
            }
            Err(e) => Err(e),
        }
    }
}

/// Serves `node`'s link on `con` until it fails (`Err`), or the client or the link's last
/// channel is gone (`Ok`).
fn session(
    shared: &Weak<Shared>,
    con: &mut redis::Connection,
    node: &NodeAddr,
) -> redis::RedisResult<()> {
    let (tx, pushes) = mpsc::channel();
    con.set_push_sender(tx);
    let mut link = ShardLink {
        con,
        pushes,
        timeout: Duration::ZERO,
    };
    let channels = {
        let Some(strong) = shared.upgrade() else {
            return Ok(());
        };
        Shards::of(&strong).begin_link_session(node)
    };
    let mut queue = channels;
    let mut last_heard = Instant::now();
    // When the link last looked whether it still has channels: a look through all the
    // client's channels (a link of one lock among 10,000 lingering channels: ~34 µs in a
    // release build, under the state's lock), made once per read tick rather than once per
    // message (one per handoff of a busy lock: ~205 µs each). A link whose last channel
    // went keeps its connection a tick longer at most.
    let mut looked = Instant::now();
    loop {
        for channel in queue.drain(..) {
            let answer = link.listen(&channel)?;
            if let Answer::Moved(_) = answer {
                // It may have been listened to here before its slot moved.
                link.classic(&channel, false)?;
            }
            let Some(strong) = shared.upgrade() else {
                return Ok(());
            };
            Shards::of(&strong).shard_answered(node, &channel, answer);
        }
        let Some(strong) = shared.upgrade() else {
            return Ok(());
        };
        for push in link.pushes.try_iter() {
            last_heard = Instant::now();
            Shards::of(&strong).pushed(node, push);
        }
        if looked.elapsed() >= LINK_READ_TICK {
            if !Shards::of(&strong).link_wanted(node) {
                return Ok(());
            }
            looked = Instant::now();
        }
        for channel in Shards::of(&strong).take_link_idle(node) {
            link.unlisten(&channel)?;
        }
        queue = Shards::of(&strong).take_link_pending(node);
        if !queue.is_empty() {
            continue;
        }
        // Never block on the socket holding a strong reference.
        drop(strong);
        link.wait(LINK_READ_TICK)?;
        if last_heard.elapsed() >= HEALTH_CHECK_AFTER {
            link.ping()?;
            last_heard = Instant::now();
        }
    }
}
