//! The model's server alone, one script call at a time, for the conformance test
//! (tests/model_conformance.rs in the library): the same functions the checker runs
//! (`acquire`, `release`, `hand_on`, ...) applied to one server's [`Records`] at a fixed
//! instant [`NOW`], with the calls' replies and the messages they publish. Time is the
//! test's to move: a hold's or an entry's end is a step of its own ([`Server::expire_hold`],
//! [`Server::expire_entry`]), and so is a waiter's passing the starvation bound
//! ([`Server::age_entry`]).

use crate::STARVE;
use crate::{Config, Holder, Msg, Op, ProtocolModel, Records, Reply, State, Tick};

/// The instant every step runs at: far enough from 0 that "waited past the starvation
/// bound" is a time before it.
pub const NOW: Tick = 10;

/// One server's records and the model that steps them.
pub struct Server {
    model: ProtocolModel,
    state: State,
}

/// What one call did: its reply (`None` for the calls the model gives no reply of its
/// own: kick, force_unlock, a queue entry's refresh) and the messages it published.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Outcome {
    /// The reply.
    pub reply: Option<Reply>,
    /// Grants, wake-ups and control notices, sorted.
    pub published: Vec<Msg>,
}

impl Server {
    /// A server with no records, for `clients` clients (all listening).
    pub fn new(clients: u8) -> Server {
        let model = ProtocolModel {
            cfg: Config {
                clients,
                ..Config::base("conformance")
            },
        };
        let n = clients as usize;
        let state = State {
            now: NOW,
            ..State::initial(n)
        };
        Server { model, state }
    }

    /// The records now.
    pub fn records(&self) -> &Records {
        &self.state.primary
    }

    /// Whether client `c` listens on its inbox (a `PUBLISH` to it reaches someone).
    pub fn set_listening(&mut self, c: u8, listening: bool) {
        self.state.deaf[c as usize] = !listening;
    }

    fn run(&mut self, f: impl FnOnce(&ProtocolModel, &mut State) -> Option<Reply>) -> Outcome {
        self.state.net.clear();
        let reply = f(&self.model, &mut self.state);
        let mut published: Vec<Msg> = self
            .state
            .net
            .drain(..)
            .filter(|m| !matches!(m, Msg::Request(..) | Msg::Reply(..)))
            .collect();
        published.sort();
        Outcome { reply, published }
    }

    fn serve(&mut self, h: Holder, op: Op, fair: bool, fenced: bool) -> Outcome {
        // The model reads a call's kind from its client's number (odd clients fair, all
        // but client 1 fenced) when the configuration has that kind.
        assert!(!fair || h.0 % 2 == 1, "a fair call from an odd client only");
        assert!(
            !fenced || h.0 != 1,
            "a fenced call from a client other than 1"
        );
        self.model.cfg.fair = fair;
        self.model.cfg.fenced = fenced;
        self.run(|m, s| {
            m.serve(s, h, op);
            let reply = s.net.iter().find_map(|x| match x {
                Msg::Reply(_, r) => Some(r.clone()),
                _ => None,
            });
            reply
        })
    }

    /// `acquire.lua` for `h`, which believes it holds `expected` levels; `queue`: it
    /// queues with `ticket` when not granted.
    pub fn acquire(
        &mut self,
        h: Holder,
        fair: bool,
        fenced: bool,
        expected: u8,
        queue: bool,
        ticket: u8,
    ) -> Outcome {
        let op = Op::Acquire {
            expected,
            queue,
            ticket,
        };
        self.serve(h, op, fair, fenced)
    }

    /// `release.lua` of one level of `expected`.
    pub fn release(&mut self, h: Holder, expected: u8) -> Outcome {
        self.serve(h, Op::Release { expected }, false, false)
    }

    /// `renew.lua` for `h`'s hold.
    pub fn renew(&mut self, h: Holder) -> Outcome {
        self.serve(h, Op::Renew, false, false)
    }

    /// `cancel.lua` with no level expected, none kept.
    pub fn cancel(&mut self, h: Holder) -> Outcome {
        self.serve(h, Op::Cancel, false, false)
    }

    /// `renew.lua`'s queue part for `h`'s entry: whether it was still queued (refreshed).
    pub fn refresh(&mut self, h: Holder) -> bool {
        ProtocolModel::refresh_entry(&mut self.state, h)
    }

    /// `kick.lua`.
    pub fn kick(&mut self) -> Outcome {
        self.run(|m, s| {
            m.hand_on(s, false, None, false, false);
            None
        })
    }

    /// `force_unlock.lua` as the call numbered `id` (from 1).
    pub fn force_unlock(&mut self, id: u8) -> Outcome {
        self.run(|m, s| {
            s.used[3] = id - 1;
            m.force_unlock(s);
            None
        })
    }

    /// The hold's lease ends (its key expires).
    pub fn expire_hold(&mut self) {
        self.state.primary.hold = None;
    }

    /// `h`'s queue entry lapses (its call stopped refreshing it).
    pub fn expire_entry(&mut self, h: Holder) {
        let now = self.state.now;
        for e in self
            .state
            .primary
            .queue
            .iter_mut()
            .filter(|e| e.holder == h)
        {
            e.expiry = now;
        }
    }

    /// `h`'s entry has waited past the starvation bound.
    pub fn age_entry(&mut self, h: Holder) {
        let now = self.state.now;
        for e in self
            .state
            .primary
            .queue
            .iter_mut()
            .filter(|e| e.holder == h)
        {
            e.since = now - STARVE;
        }
    }
}
