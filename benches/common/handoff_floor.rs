//! The handoff floor: what Redis and the machine allow a handoff, with raw commands.

use std::time::Instant;

use super::{connect, mono_ns, parse_u64, us_between};
use crate::support::child::{say, ChildProc};

/// Floor samples before any is kept.
pub const FLOOR_WARMUP: usize = 50;
pub const FLOOR_SAMPLES: usize = 1_000;
/// Samples of the 1 ms hold itself.
pub const SLEEP_SAMPLES: usize = 300;

/// What Redis and the machine allow a handoff, measured with raw commands in the same run.
pub struct Floor {
    /// PUBLISH sent (parent) -> message read by a subscriber in another process, µs.
    pub delivery: Vec<f64>,
    /// The same plus one EVALSHA round trip by that process, µs.
    pub delivery_rtt: Vec<f64>,
    /// EVALSHA round trips alone, µs.
    pub rtt: Vec<f64>,
    /// The 1 ms hold as it really lasts here, µs.
    pub sleep: Vec<f64>,
}

/// The parent's side of the floor: `child`, running [`serve_floor`] on `channel`, is sent
/// one message per sample and answers with when it read it and when its EVALSHA returned;
/// it is told to quit and waited for at the end.
pub fn measure_floor(url: &str, channel: &str, child: ChildProc, hold: impl Fn()) -> Floor {
    let mut con = connect(url);
    let mut out = Floor {
        delivery: Vec::new(),
        delivery_rtt: Vec::new(),
        rtt: Vec::new(),
        sleep: Vec::new(),
    };
    for i in 0..FLOOR_WARMUP + FLOOR_SAMPLES {
        // The same idle pattern as the loops it is the floor of: a 1 ms hold, then the
        // handoff. (Back to back, on a warm CPU and a warm Redis, the figures are about
        // half: that is not what a handoff after a critical section meets.)
        hold();
        let t0 = mono_ns();
        let receivers: u64 = redis::cmd("PUBLISH")
            .arg(channel)
            .arg(i)
            .query(&mut con)
            .expect("PUBLISH");
        assert_eq!(receivers, 1, "the floor child is not subscribed");
        let line = child.next_line();
        let (t1, t2) = line
            .split_once(' ')
            .map(|(a, b)| (parse_u64(a), parse_u64(b)))
            .expect("`t1 t2` from the floor child");
        if i >= FLOOR_WARMUP {
            out.delivery.push(us_between(t0, t1));
            out.delivery_rtt.push(us_between(t0, t2));
            out.rtt.push(us_between(t1, t2));
        }
    }
    let _: u64 = redis::cmd("PUBLISH")
        .arg(channel)
        .arg("quit")
        .query(&mut con)
        .expect("PUBLISH quit");
    child.wait_success();
    for _ in 0..SLEEP_SAMPLES {
        let t = Instant::now();
        hold();
        out.sleep.push(t.elapsed().as_secs_f64() * 1e6);
    }
    out
}

/// The floor child's side: subscribes to `channel`, says "ready", then answers each
/// message with `<read at> <rtt done at>` after one `rtt` round trip, until "quit".
pub fn serve_floor(url: &str, channel: &str, mut rtt: impl FnMut(&mut redis::Connection)) {
    let mut sub = connect(url);
    let mut con = connect(url);
    rtt(&mut con);
    let mut pubsub = sub.as_pubsub();
    pubsub.subscribe(channel).expect("SUBSCRIBE");
    say("ready");
    loop {
        let msg = pubsub.get_message().expect("floor message");
        let t1 = mono_ns();
        let payload: String = msg.get_payload().expect("payload");
        if payload == "quit" {
            break;
        }
        rtt(&mut con);
        let t2 = mono_ns();
        say(&format!("{t1} {t2}"));
    }
}
