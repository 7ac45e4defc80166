//! The waiter queue's parameters and its scripts' messages (its rules are `lua/queue.lua`;
//! the typed calls of its scripts, and the key layout they share, are `calls.rs`).

use std::time::{Duration, Instant};

/// The longest wait whose grant is placed on this machine's clock by the server's own
/// times (see [`grant_seen_from`]): beyond it, a server clock running fast could move the
/// grant later than it was by more than the margin allows for.
const SERVER_SPAN_MAX_MS: u64 = 60_000;

/// The earliest moment, by this machine's clock, at which a grant made at the server time
/// `at` (ms) can have been made, for a waiter whose queued attempt was sent at `sent` and
/// ran at the server time `queued_at`: the attempt ran after it was sent, and the grant
/// `at - queued_at` later by the server's clock. Less TIME's millisecond rounding and a
/// server clock running up to 0.1 % fast; `sent` when either time is unknown, the server's
/// clock went back, or the wait was too long to place this way.
pub(crate) fn grant_seen_from(sent: Instant, queued_at: Option<u64>, at: Option<u64>) -> Instant {
    match (queued_at, at) {
        (Some(queued), Some(at)) if at >= queued && at - queued <= SERVER_SPAN_MAX_MS => {
            let span = Duration::from_millis(at - queued);
            sent + span.saturating_sub(Duration::from_millis(1) + span / 1000)
        }
        _ => sent,
    }
}

/// What a script told a waiting thread of its turn.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Notice {
    /// The thread was made the holder (one level, a lease of at most [`PICKUP`](crate::runtime::holds::lease::PICKUP) from the
    /// release, to be confirmed); `fence` is the hold's fencing token, 0 when the waiter
    /// is not fenced; `at` the server's time of the handoff in ms (`None` from a script
    /// that does not say).
    Granted {
        ticket: u64,
        fence: u64,
        at: Option<u64>,
    },
    /// The lock is free and it is this thread's turn to try.
    Wake { ticket: u64 },
    /// The client's view may have missed a message (a reconnect, a dropped entry): try.
    Recheck,
}

/// Parses a message of the scripts: the thread token it is for, and the notice.
pub(crate) fn parse(payload: &[u8]) -> Option<(u64, Notice)> {
    let text = std::str::from_utf8(payload).ok()?;
    let mut parts = text.split(' ');
    let kind = parts.next()?;
    let token = parts.next()?.parse().ok()?;
    let ticket = parts.next()?.parse().ok()?;
    let notice = match kind {
        "g" => Notice::Granted {
            ticket,
            fence: parts.next()?.parse().ok()?,
            at: match parts.next() {
                Some(at) => Some(at.parse().ok()?),
                None => None,
            },
        },
        "w" => Notice::Wake { ticket },
        _ => return None,
    };
    Some((token, notice))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_grant_is_placed_no_later_than_it_can_have_been_made() {
        let sent = Instant::now();
        let at = |ms: u64| grant_seen_from(sent, Some(1_000_000), Some(1_000_000 + ms));
        assert_eq!(at(0), sent);
        // 2 s of the server's clock: no more than 2 s less 1 ms rounding and 2 ms drift.
        assert_eq!(at(2_000), sent + Duration::from_millis(1_997));
        assert_eq!(at(SERVER_SPAN_MAX_MS + 1), sent);
        assert_eq!(grant_seen_from(sent, Some(5), Some(4)), sent);
        assert_eq!(grant_seen_from(sent, None, Some(4)), sent);
        assert_eq!(grant_seen_from(sent, Some(4), None), sent);
    }

    #[test]
    fn messages_parse() {
        assert_eq!(
            parse(b"g 7 12 0"),
            Some((
                7,
                Notice::Granted {
                    ticket: 12,
                    fence: 0,
                    at: None
                }
            ))
        );
        assert_eq!(
            parse(b"g 7 12 0 1795608952791"),
            Some((
                7,
                Notice::Granted {
                    ticket: 12,
                    fence: 0,
                    at: Some(1_795_608_952_791)
                }
            ))
        );
        assert_eq!(parse(b"g 7 12 0 1.7e+12"), None);
        assert_eq!(parse(b"w 7 12"), Some((7, Notice::Wake { ticket: 12 })));
        // Tokens as the scripts write them: exact decimal text, however large.
        assert_eq!(
            parse(b"g 7 12 9223372036854775797"),
            Some((
                7,
                Notice::Granted {
                    ticket: 12,
                    fence: 9_223_372_036_854_775_797,
                    at: None
                }
            ))
        );
        // What Lua's `..` used to write from 10^14 on: not a token.
        assert_eq!(parse(b"g 7 12 1e+14"), None);
        assert_eq!(parse(b"x 7 12"), None);
        assert_eq!(parse(b"g 7"), None);
        assert_eq!(parse(b"s"), None);
    }
}
