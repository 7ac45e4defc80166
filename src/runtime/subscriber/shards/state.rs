//! What the subscriber's shared state keeps of its sharded links: the map of which
//! primary serves which slot, and each primary's link.

use std::collections::HashMap;

use crate::runtime::connection::con::NodeAddr;

/// Which primary serves which slots, as `CLUSTER SLOTS` said, patched by `MOVED`s.
#[derive(Default)]
pub(in crate::runtime::subscriber) struct SlotMap {
    ranges: Vec<(u16, u16, NodeAddr)>,
    moved: HashMap<u16, NodeAddr>,
}

impl SlotMap {
    pub(in crate::runtime::subscriber) fn new(ranges: Vec<(u16, u16, NodeAddr)>) -> SlotMap {
        SlotMap {
            ranges,
            moved: HashMap::new(),
        }
    }

    /// Records that `slot` moved to `node` (a `MOVED` said so).
    pub(in crate::runtime::subscriber) fn moved(&mut self, slot: u16, node: NodeAddr) {
        self.moved.insert(slot, node);
    }

    pub(in crate::runtime::subscriber) fn owner(&self, slot: u16) -> Option<&NodeAddr> {
        self.moved.get(&slot).or_else(|| {
            self.ranges
                .iter()
                .find(|(start, end, _)| (*start..=*end).contains(&slot))
                .map(|(_, _, node)| node)
        })
    }
}

/// One primary's link, as the subscriber's state keeps it.
#[derive(Default)]
pub(in crate::runtime::subscriber) struct LinkState {
    // Channels to SSUBSCRIBE in the current session.
    pub(in crate::runtime::subscriber) pending: Vec<Vec<u8>>,
    // Channels nobody waits on any more, to SUNSUBSCRIBE.
    pub(in crate::runtime::subscriber) idle: Vec<Vec<u8>>,
    pub(in crate::runtime::subscriber) connected: bool,
    // A channel this link has confirmed: a waiter that routes a new channel here
    // publishes to it to make the reader, blocked on its socket, come back (`SPUBLISH`
    // goes to the channel's slot, this node, and to no other).
    pub(in crate::runtime::subscriber) nudge: Option<Vec<u8>>,
}
