//! How a call refused by a deployment that settles waits it out: a slot mid-migration, a
//! failover under way (the slot's primary dead and its replica not yet promoted: its
//! connections refused, or CLUSTERDOWN). Its pauses grow, and it gives up past as long as
//! a connection to a new primary would be waited for, or past its deadline.

use std::time::{Duration, Instant};

use crate::Error;

/// The first pause before a command refused by a settling cluster is sent again; it
/// doubles up to `MAX_SETTLE_PAUSE`.
const SETTLE_PAUSE: Duration = Duration::from_millis(2);
const MAX_SETTLE_PAUSE: Duration = Duration::from_millis(100);

/// The same for a cluster node that refuses connections (killed, its replica not yet
/// promoted): a failover takes seconds, so the pauses start and end longer.
const DOWN_PAUSE: Duration = Duration::from_millis(10);
const MAX_DOWN_PAUSE: Duration = Duration::from_millis(200);

/// A call's wait for a settling deployment: since when it waits, and its next pause.
pub(crate) struct Settling {
    began: Instant,
    pause: Duration,
}

/// Decides whether a call refused with `e` waits for another try, with a growing pause
/// (`settling`: `None` at its first refusal), or gives up (`Err`): past as long as a
/// connection to a new primary would be waited for (`connect_timeout`), or past its
/// deadline `until` (then a `Timeout`: a call stopped by its deadline says so). `down`:
/// the refusal is a node's that is down, with since when its outage lasts as of an
/// instant. Runs `meanwhile` before it pauses.
pub(crate) fn wait_out(
    settling: &mut Option<Settling>,
    e: redis::RedisError,
    down: Option<&dyn Fn(Instant) -> Instant>,
    connect_timeout: Duration,
    until: Option<Instant>,
    meanwhile: &mut Option<&mut dyn FnMut()>,
) -> Result<(), Error> {
    let Settling { began, pause } = settling.get_or_insert_with(|| {
        let first = if down.is_some() {
            DOWN_PAUSE
        } else {
            SETTLE_PAUSE
        };
        Settling {
            began: Instant::now(),
            pause: first,
        }
    });
    let now = Instant::now();
    let give_up = match down {
        // Past the outage's bound a call still gets a few quick tries: a refusal may come
        // from a slot-map refresh on the way to a node that is up.
        Some(outage) => (*began + connect_timeout)
            .min(outage(now) + connect_timeout)
            .max(*began + DOWN_PAUSE * 7),
        None => *began + connect_timeout,
    };
    if now + *pause >= give_up {
        return Err(e.into());
    }
    if until.is_some_and(|u| now + *pause >= u) {
        return Err(Error::timeout(e));
    }
    tracing::debug!(
        target: "redmutex",
        error = %e,
        "redmutex: retrying in {pause:?}"
    );
    if let Some(meanwhile) = meanwhile.as_mut() {
        meanwhile();
    }
    std::thread::sleep((now + *pause).saturating_duration_since(Instant::now()));
    let most = if down.is_some() {
        MAX_DOWN_PAUSE
    } else {
        MAX_SETTLE_PAUSE
    };
    *pause = (*pause * 2).min(most).max(*pause);
    Ok(())
}
