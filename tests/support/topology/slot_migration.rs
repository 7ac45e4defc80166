//! A slot moving between two primaries ([`SlotMigration`]).

use super::{key_slot, poll, Cluster, READY_TIMEOUT};

/// A slot half-way between two primaries ([`Cluster::begin_migration`]): keys move with
/// [`move_keys`](Self::move_keys)/[`move_key`](Self::move_key), and
/// [`finish`](Self::finish) hands the slot over. Dropping it unfinished leaves the slot
/// migrating.
#[must_use = "the slot stays MIGRATING/IMPORTING until finish()"]
pub struct SlotMigration<'a> {
    pub(super) cluster: &'a Cluster,
    pub(super) slot: u16,
    pub(super) from: usize,
    pub(super) to: usize,
}

impl SlotMigration<'_> {
    pub fn slot(&self) -> u16 {
        self.slot
    }

    /// Keys of the slot still on the source (`CLUSTER COUNTKEYSINSLOT`).
    pub fn keys_left(&self) -> usize {
        let mut con = self.cluster.nodes[self.from].connection();
        redis::cmd("CLUSTER")
            .arg("COUNTKEYSINSLOT")
            .arg(self.slot)
            .query(&mut con)
            .unwrap_or_else(|e| self.cluster.fail(&format!("COUNTKEYSINSLOT: {e}")))
    }

    /// MIGRATEs up to `max` of the slot's keys to the target (TTLs kept); returns how
    /// many moved.
    pub fn move_keys(&self, max: usize) -> usize {
        let mut con = self.cluster.nodes[self.from].connection();
        let keys: Vec<Vec<u8>> = redis::cmd("CLUSTER")
            .arg("GETKEYSINSLOT")
            .arg(self.slot)
            .arg(max)
            .query(&mut con)
            .unwrap_or_else(|e| self.cluster.fail(&format!("GETKEYSINSLOT: {e}")));
        if keys.is_empty() {
            return 0;
        }
        self.migrate(&mut con, &keys);
        keys.len()
    }

    /// MIGRATEs one key (of this slot) to the target; false when the source did not
    /// have it.
    pub fn move_key(&self, key: impl AsRef<[u8]>) -> bool {
        let key = key.as_ref();
        assert_eq!(
            key_slot(key),
            self.slot,
            "the key is not in slot {}",
            self.slot
        );
        let mut con = self.cluster.nodes[self.from].connection();
        self.migrate(&mut con, &[key.to_vec()])
    }

    fn migrate(&self, con: &mut redis::Connection, keys: &[Vec<u8>]) -> bool {
        let reply: String = redis::cmd("MIGRATE")
            .arg("127.0.0.1")
            .arg(self.cluster.nodes[self.to].port())
            .arg("")
            .arg(0)
            .arg(5000)
            .arg("KEYS")
            .arg(keys)
            .query(con)
            .unwrap_or_else(|e| self.cluster.fail(&format!("MIGRATE: {e}")));
        reply == "OK"
    }

    /// Moves the remaining keys, then assigns the slot to the target (`SETSLOT NODE` on
    /// the target, the source, then every other running primary, as redis-cli does)
    /// and waits until every running node sees the new owner. Afterwards the source
    /// answers MOVED for the slot.
    pub fn finish(self) {
        while self.move_keys(100) > 0 {}
        let cluster = self.cluster;
        let order = [self.to, self.from].into_iter().chain(
            cluster
                .primaries()
                .into_iter()
                .filter(|&p| p != self.to && p != self.from),
        );
        for node in order {
            let mut con = cluster.nodes[node].connection();
            redis::cmd("CLUSTER")
                .arg("SETSLOT")
                .arg(self.slot)
                .arg("NODE")
                .arg(&cluster.nodes[self.to].id)
                .exec(&mut con)
                .unwrap_or_else(|e| {
                    cluster.fail(&format!("node {node}: SETSLOT {} NODE: {e}", self.slot))
                });
        }
        let target = cluster.nodes[self.to].id.clone();
        let agreed = poll(READY_TIMEOUT, || {
            for i in cluster.running() {
                let view = cluster.view(i)?;
                let owner = view.iter().find(|e| e.is_primary() && e.serves(self.slot));
                if owner.map(|e| &e.id) != Some(&target) {
                    return Err(format!("node {i} does not see the new owner yet"));
                }
            }
            Ok(())
        });
        if let Err(why) = agreed {
            cluster.fail(&format!("slot {} migration: {why}", self.slot));
        }
    }
}
