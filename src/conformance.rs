//! The typed script calls, for the conformance test only (feature `conformance`, off by
//! default; docs/protocol.md): tests/model_conformance.rs drives the very calls the library
//! sends (`calls.rs`'s keys and arguments, `Scripting`'s FCALL or EVALSHA with its library
//! and script loading) on a `redis::Connection` of its own, and compares what the server
//! then records with the protocol model's prediction. Hidden: not part of the API, and
//! nothing here is kept stable.

use redis::{RedisResult, Value};

use crate::runtime::connection::con::Con;
use crate::runtime::keys::{LockKeys, Object};
use crate::runtime::scripting::calls::{self, Acquire};
use crate::runtime::scripting::scripts::{self, Scripting};
use crate::runtime::subscriber::own_channel_prefix;

/// Which lock handle's calls: its flags and scripts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// `Lock`.
    Plain,
    /// `FairLock`.
    Fair,
    /// `FencedLock`.
    Fenced,
}

/// The Redis names of one lock, as a client of id `client_id` makes them.
pub struct Keys(LockKeys);

impl Keys {
    /// The keys of the lock `name` under `prefix`, as the handle of `kind` of the client
    /// `client_id` names them.
    pub fn new(prefix: &str, name: &str, client_id: &str, kind: Kind) -> Keys {
        let ops = match kind {
            Kind::Plain => &scripts::PLAIN,
            Kind::Fair => &scripts::FAIR,
            Kind::Fenced => &scripts::FENCED,
        };
        Keys(LockKeys::new(
            prefix.as_bytes(),
            name.as_bytes().to_vec(),
            client_id,
            Object::Lock,
            ops,
        ))
    }

    /// The lock hash.
    pub fn key(&self) -> Vec<u8> {
        self.0.key().to_vec()
    }

    /// The fencing-token counter.
    pub fn fence(&self) -> Vec<u8> {
        self.0.fence()
    }

    /// The queue (a LIST of holder ids).
    pub fn queue(&self) -> Vec<u8> {
        self.0.queue()
    }

    /// The waiters hash (holder id -> entry).
    pub fn waiters(&self) -> Vec<u8> {
        self.0.waiters()
    }

    /// The key `force_unlock.lua` remembers its call id in.
    pub fn forced(&self) -> Vec<u8> {
        self.0.forced()
    }

    /// This client's inbox channel (grants and wake-ups).
    pub fn inbox(&self) -> Vec<u8> {
        self.0.channel().to_vec()
    }
}

/// The control channel (`force_unlock`'s notices) of the client `client_id` under `prefix`.
pub fn control_channel(prefix: &str, client_id: &str) -> Vec<u8> {
    [
        own_channel_prefix(prefix.as_bytes()),
        client_id.as_bytes().to_vec(),
    ]
    .concat()
}

/// The channel-name prefix `force_unlock.lua` is given (the client id follows it).
pub fn control_prefix(prefix: &str) -> Vec<u8> {
    own_channel_prefix(prefix.as_bytes())
}

/// Runs the bundled scripts on one connection as a client does: as FCALLs of the library
/// (`functions`), falling back to EVALSHA where the server has none, loading either when
/// the server lacks it.
pub struct Scripts {
    scripting: Scripting,
    con: Con,
}

impl Scripts {
    /// Scripts run on `con`; `functions: false` is `use_functions(false)`.
    pub fn new(con: redis::Connection, functions: bool) -> Scripts {
        Scripts {
            scripting: Scripting::new(functions),
            con: Con::Single(con),
        }
    }

    /// Whether calls go as FCALLs now.
    pub fn uses_functions(&self) -> bool {
        self.scripting.uses_functions()
    }

    /// The connection, for reads between calls.
    pub fn connection(&mut self) -> &mut redis::Connection {
        match &mut self.con {
            Con::Single(c) => c,
            Con::Cluster(_) => unreachable!("made from one connection"),
        }
    }

    /// `acquire.lua` (after `acquire_fast.lua`): `holder` believes it holds `held` levels;
    /// `join`: the ticket and the entry's lifetime in ms to queue with.
    pub fn acquire(
        &mut self,
        keys: &Keys,
        holder: &str,
        lease_ms: u64,
        held: usize,
        join: Option<(u64, u64)>,
    ) -> RedisResult<Value> {
        let call = calls::acquire(
            &keys.0,
            &Acquire {
                holder,
                lease_ms,
                held,
                flags: keys.0.ops.flags,
                join,
                amount: None,
                metadata: None,
            },
        );
        self.scripting.run(&mut self.con, &call)
    }

    /// `release.lua`: one level of `holder`'s `held`, leaving `need` ms to the rest.
    pub fn release(
        &mut self,
        keys: &Keys,
        holder: &str,
        need: u64,
        held: usize,
    ) -> RedisResult<Value> {
        let call = calls::release(&keys.0, holder, need, held);
        self.scripting.run(&mut self.con, &call)
    }

    /// `renew.lua` for one hold (a watchdog round, or a pick-up's confirmation).
    pub fn renew(&mut self, keys: &Keys, holder: &str, lease_ms: u64) -> RedisResult<Value> {
        let call = calls::renew(&[(&keys.0, holder, lease_ms)], std::iter::empty());
        self.scripting.run(&mut self.con, &call)
    }

    /// `renew.lua` keeping one queue entry alive for `ttl_ms`.
    pub fn refresh(&mut self, keys: &Keys, holder: &str, ttl_ms: u64) -> RedisResult<Value> {
        let call = calls::renew(&[], std::iter::once((&keys.0, holder, ttl_ms)));
        self.scripting.run(&mut self.con, &call)
    }

    /// `cancel.lua`.
    pub fn cancel(
        &mut self,
        keys: &Keys,
        holder: &str,
        expected: usize,
        need: u64,
        keep: bool,
    ) -> RedisResult<Value> {
        let call = calls::cancel(keys.0.ops, &keys.0, holder, expected, need, keep);
        self.scripting.run(&mut self.con, &call)
    }

    /// `kick.lua`.
    pub fn kick(&mut self, keys: &Keys) -> RedisResult<Value> {
        let call = calls::kick(&keys.0);
        self.scripting.run(&mut self.con, &call)
    }

    /// `force_unlock.lua` as the call `call_id`, remembered `memory_ms`; notices go to
    /// the channels `control_prefix(prefix)` + client id.
    pub fn force_unlock(
        &mut self,
        keys: &Keys,
        call_id: &str,
        memory_ms: u64,
        prefix: &str,
    ) -> RedisResult<Value> {
        let call = calls::force_unlock(
            &keys.0,
            call_id,
            std::time::Duration::from_millis(memory_ms),
            &control_prefix(prefix),
        );
        self.scripting.run(&mut self.con, &call)
    }
}
