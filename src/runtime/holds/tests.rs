//! The table's unit tests.

use super::hold::{remove_hold, ByToken, Hold, Holds, Level, FEW_HOLDERS};
use super::*;
use crate::runtime::holds::lease::PICKUP;
use crate::runtime::keys::Object;
use crate::runtime::scripting::scripts;

fn hold(keys: &Arc<LockKeys>, level: u64) -> Hold {
    let mut hold = Hold::new(keys, "c:1", Some(1), Loss::new(keys, "Lock", 0, None));
    hold.levels.push(Level {
        id: level,
        lease: Lease::Watchdog,
        ends: None,
    });
    hold
}

/// Many threads of one process holding one lock (readers) move the holds from the short
/// list to a map; every operation finds the same holds either way.
#[test]
fn the_holds_of_one_lock_are_found_in_the_list_and_in_the_map() {
    let keys = Arc::new(LockKeys::new(
        b"p:",
        b"n".to_vec(),
        "c",
        Object::Lock,
        &scripts::PLAIN,
    ));
    let mut by_token = ByToken::default();
    let n = 3 * FEW_HOLDERS as u64;
    for token in 0..n {
        assert!(matches!(by_token, ByToken::Few(_)) == (token <= FEW_HOLDERS as u64));
        by_token.or_insert_with(token, || hold(&keys, 100 + token));
        // Asking again for a token held gives that hold, not a new one.
        let again = by_token.or_insert_with(token, || hold(&keys, 0));
        assert_eq!(again.levels[0].id, 100 + token);
    }
    assert!(matches!(by_token, ByToken::Many(_)));
    assert_eq!(by_token.values().count(), n as usize);
    for token in 0..n {
        assert_eq!(
            by_token.get(&token).map(|h| h.levels[0].id),
            Some(100 + token)
        );
    }
    for (token, h) in by_token.iter_mut() {
        assert_eq!(h.levels[0].id, 100 + token);
        h.renewing = true;
    }
    assert!(by_token.values().all(|h| h.renewing));
    by_token.retain(|token, _| token % 2 == 0);
    assert_eq!(by_token.values().count(), (n / 2) as usize);
    assert!(by_token.get(&1).is_none() && by_token.get(&2).is_some());
    for token in (0..n).step_by(2) {
        assert_eq!(
            by_token.remove(&token).map(|h| h.levels[0].id),
            Some(100 + token)
        );
        assert!(by_token.remove(&token).is_none());
    }
    assert!(by_token.is_empty());

    let mut few = ByToken::default();
    few.or_insert_with(7, || hold(&keys, 1));
    few.or_insert_with(8, || hold(&keys, 2));
    assert!(matches!(few, ByToken::Few(_)));
    assert_eq!(few.get_mut(&8).map(|h| h.levels[0].id), Some(2));
    assert_eq!(few.remove(&7).map(|h| h.levels[0].id), Some(1));
    assert_eq!(few.values().count(), 1);
    few.retain(|_, _| false);
    assert!(few.is_empty());
}

/// The table is keyed by the hold's keys and looked up by name.
#[test]
#[allow(clippy::mutable_key_type)]
fn a_hold_key_is_found_by_its_name() {
    let keys = Arc::new(LockKeys::new(
        b"p:",
        b"n".to_vec(),
        "c",
        Object::Lock,
        &scripts::PLAIN,
    ));
    let mut holds = Holds::new();
    holds
        .entry(HoldKey(keys.clone()))
        .or_default()
        .or_insert_with(1, || hold(&keys, 1));
    assert!(holds.contains_key(keys.hold()));
    assert!(!holds.contains_key(&b"xp:{other}"[..]));
    assert_eq!(
        remove_hold(&mut holds, keys.hold(), 1).map(|h| h.levels[0].id),
        Some(1)
    );
    assert!(holds.is_empty());
}

const ACQ: Acquisition = Acquisition {
    kind: "Lock",
    generation: 0,
    max_hold: None,
    thread: Some(1),
};

fn keys_of(name: &str) -> Arc<LockKeys> {
    Arc::new(LockKeys::new(
        b"p:",
        name.as_bytes().to_vec(),
        "c",
        Object::Lock,
        &scripts::PLAIN,
    ))
}

/// Pending extensions are found through their own index, not by walking every hold:
/// the earliest due, only the due ones in a partial round, none once their holds are
/// gone, and every one in a full round.
#[test]
fn pending_extensions_are_found_without_walking_every_hold() {
    let watchdog = HoldTable::new(None);
    let now = Instant::now();
    let watchdog_lease = (Lease::Watchdog, 30_000);
    let plain = keys_of("plain");
    let past = keys_of("due");
    let later = keys_of("later");
    for i in 0..1_000 {
        // Holds with nothing pending: what a client holding many locks has most of.
        let keys = keys_of(&format!("idle{i}"));
        watchdog.acquired(&keys, 1, "c:1", 1, watchdog_lease, (now, false), &ACQ);
    }
    watchdog.acquired(&plain, 1, "c:1", 1, watchdog_lease, (now, false), &ACQ);
    assert_eq!(watchdog.next_due(), None);
    assert!(watchdog.extending.lock().is_empty());

    // Handed over: extended a third of the way into the pickup window.
    let sent = now.checked_sub(PICKUP).expect("an instant a second ago");
    watchdog.acquired(&past, 2, "c:2", 1, watchdog_lease, (sent, true), &ACQ);
    let r = watchdog.acquired(&later, 3, "c:3", 1, watchdog_lease, (now, true), &ACQ);
    assert_eq!(watchdog.extending.lock().len(), 2);
    assert_eq!(watchdog.next_due(), Some(sent + PICKUP / 3));

    let round = watchdog.watched(RoundKind::Due, 30_000);
    let names: Vec<&[u8]> = round.iter().map(|w| w.keys.key()).collect();
    assert_eq!(names, [past.key()], "only the extension due");
    assert!(round[0].extension);
    watchdog.renewed(&round);
    assert_eq!(watchdog.next_due(), Some(now + PICKUP / 3));

    // Released before its extension: its entry goes with it.
    assert!(watchdog
        .releasing(later.hold(), 3, r.level, 30_000)
        .is_some());
    assert_eq!(watchdog.next_due(), None);
    assert!(watchdog.extending.lock().is_empty());

    let r = watchdog.acquired(&later, 3, "c:3", 1, watchdog_lease, (now, true), &ACQ);
    let round = watchdog.watched(RoundKind::Full, 30_000);
    assert_eq!(round.len(), 1_000 + 3, "a full round renews every hold");
    assert!(round
        .iter()
        .any(|w| w.keys.key() == later.key() && w.extension));
    watchdog.renewed(&round);
    assert!(watchdog.extending.lock().is_empty());
    assert_eq!(watchdog.next_due(), None);
    assert!(watchdog
        .releasing(later.hold(), 3, r.level, 30_000)
        .is_some());
}

/// A hold re-entered many times keeps one timer for its loss, not one per level.
#[test]
fn a_hold_keeps_one_loss_timer_however_often_it_is_re_entered() {
    let hook: Hook = Arc::new(|_: &crate::LostLease| {});
    let watchdog = HoldTable::new(Some(hook));
    let keys = keys_of("reentered");
    let now = Instant::now();
    let lease = (Lease::Watchdog, 30_000);
    let mut levels = Vec::new();
    for count in 1..=100 {
        let r = watchdog.acquired(&keys, 1, "c:1", count, lease, (now, false), &ACQ);
        levels.push(r);
    }
    assert_eq!(watchdog.notifier.timers(), 1);
    // A fixed level ending sooner than the watchdog lease does not make it nearer
    // (the watchdog level keeps the hold), nor does a second hold share its timer.
    let fixed = (Lease::Fixed(1_000), 1_000);
    watchdog.acquired(&keys, 1, "c:1", 101, fixed, (now, false), &ACQ);
    assert_eq!(watchdog.notifier.timers(), 1);
    watchdog.acquired(&keys_of("other"), 2, "c:2", 1, fixed, (now, false), &ACQ);
    assert_eq!(watchdog.notifier.timers(), 2);
}

/// A check round (after the client's pub/sub connection was down) takes every hold: a
/// watchdog hold to renew as a full round would, a hold of fixed leases to check only
/// (a lease of 0: never extended), and none whose leases are all over (lost by the clock).
#[test]
fn a_check_round_takes_fixed_holds_too_without_extending_them() {
    let table = HoldTable::new(None);
    let now = Instant::now();
    let (watched, fixed, over) = (keys_of("watched"), keys_of("fixed"), keys_of("over"));
    table.acquired(
        &watched,
        1,
        "c:1",
        1,
        (Lease::Watchdog, 30_000),
        (now, false),
        &ACQ,
    );
    table.acquired(
        &fixed,
        1,
        "c:1",
        1,
        (Lease::Fixed(20_000), 20_000),
        (now, false),
        &ACQ,
    );
    let long_ago = now.checked_sub(Duration::from_secs(2)).expect("2 s ago");
    table.acquired(
        &over,
        1,
        "c:1",
        1,
        (Lease::Fixed(1_000), 1_000),
        (long_ago, false),
        &ACQ,
    );
    assert!(table.holds_any());

    let full = table.watched(RoundKind::Full, 30_000);
    let names: Vec<&[u8]> = full.iter().map(|w| w.keys.key()).collect();
    assert_eq!(
        names,
        [watched.key()],
        "a full round renews the watchdog hold alone"
    );
    table.renewed(&full);

    let mut check = table.watched(RoundKind::Check, 30_000);
    check.sort_by_key(|w| w.keys.key().to_vec());
    let taken: Vec<(&[u8], u64)> = check.iter().map(|w| (w.keys.key(), w.lease_ms)).collect();
    assert_eq!(taken, [(fixed.key(), 0), (watched.key(), 30_000)]);
    assert!(check.iter().all(|w| !w.extension));
    table.renewed(&check);
}

/// A `force_unlock` notice that finds no hold of its token is kept for the registration
/// of a grant still on its way, which is then lost at once; it touches no hold under
/// another token, is taken by the one registration, is dropped when its time is over, and
/// the table keeps at most `FORCED_KEPT` of them. A notice that finds the hold marks that
/// hold, not a new one the same thread registers after it (a re-entry the server granted
/// as a new hold, its force_unlock having run before).
#[test]
fn a_force_unlock_notice_before_the_registration_marks_the_hold_lost() {
    let table = HoldTable::new(None);
    let now = Instant::now();
    let keys = keys_of("n");
    let keep = Duration::from_secs(60);
    let lease = (Lease::Watchdog, 30_000);
    table.force_unlocked(keys.key(), 7, keep);
    let other = table.acquired(&keys, 8, "c:8", 1, lease, (now, false), &ACQ);
    assert!(!other.lost.is_lost(), "another token's hold is not touched");
    let forced = table.acquired(&keys, 7, "c:7", 1, lease, (now, false), &ACQ);
    assert!(forced.lost.is_lost(), "registered after its notice: lost");
    // Taken by that registration: nothing is left for the side of a plain lock.
    assert!(!table.forced_before(keys.hold(), 7));

    // A notice that found its hold is not kept for that side.
    let held = table.acquired(&keys, 9, "c:9", 1, lease, (now, false), &ACQ);
    table.force_unlocked(keys.key(), 9, keep);
    assert!(held.lost.is_lost());
    let again = table.acquired(&keys, 9, "c:9", 1, lease, (now, false), &ACQ);
    assert!(
        !again.lost.is_lost(),
        "a new hold granted after the force_unlock"
    );

    // Over its time: dropped.
    table.force_unlocked(keys.key(), 10, Duration::ZERO);
    assert!(!table.forced_before(keys.hold(), 10));

    // Bounded: the oldest go first.
    for token in 100..100 + FORCED_KEPT as u64 {
        table.force_unlocked(keys.key(), token, keep);
    }
    assert_eq!(table.forced.lock().len(), FORCED_KEPT);
    assert!(!table.forced_before(keys.hold(), 100));
    assert!(table.forced_before(keys.hold(), 99 + FORCED_KEPT as u64));
}
