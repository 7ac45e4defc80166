//! Acquiring, for every kind: the one slow path behind every public acquisition of a
//! `Lock<K>` (the `Wait` state machine and each attempt's script call and settlement) and
//! of a `MultiLock` (its rounds over the member locks).

pub(crate) mod attempt;
pub(crate) mod multi_wait;
pub(crate) mod wait;
