//! The fake gate's side of resuming: the sessions it keeps for resuming, and a resumable
//! session's numbered frames (see the parent module for what it does differently from a
//! real gate, on purpose).

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use proto::client::{Packet, packet::Kind};
use tokio_tungstenite::tungstenite::Message;

use super::State;

/// The sessions a resuming gate keeps for resuming, by token; and the count its tokens
/// are made from.
#[derive(Clone, Default)]
pub(super) struct Kept {
    sessions: Arc<Mutex<HashMap<String, State>>>,
    tokens: Arc<AtomicU64>,
}

impl Kept {
    pub(super) fn take(&self, token: &str) -> Option<State> {
        self.sessions.lock().unwrap().remove(token)
    }

    pub(super) fn keep(&self, token: String, state: State) {
        self.sessions.lock().unwrap().insert(token, state);
    }

    pub(super) fn token(&self) -> String {
        format!("token-{}", self.tokens.fetch_add(1, Ordering::SeqCst))
    }
}

/// A resumable session's numbered frames.
#[derive(Default)]
pub(super) struct Numbered {
    /// The last `seq` given.
    pub(super) last: u64,
    /// The frames not acknowledged yet (and the last one acknowledged), by `seq`.
    kept: VecDeque<(u64, Message)>,
    /// Every answer given, by request id, as sent.
    answers: HashMap<u64, Message>,
}

impl Numbered {
    /// A push or response numbered, kept, and as a frame in either encoding.
    pub(super) fn number(&mut self, mut kind: Kind, text: bool) -> Message {
        self.last += 1;
        let seq = self.last;
        let answered = match &mut kind {
            Kind::Push(push) => {
                push.seq = seq;
                None
            }
            Kind::Response(response) => {
                response.seq = seq;
                Some(response.id)
            }
            other => panic!("only pushes and responses are numbered, not {other:?}"),
        };
        let message = crate::frame::encode(&Packet::new(kind), text);
        self.kept.push_back((seq, message.clone()));
        if let Some(id) = answered {
            self.answers.insert(id, message.clone());
        }
        message
    }

    /// The answer given to request `id`, the same frame again.
    pub(super) fn answer(&self, id: u64) -> Option<Message> {
        self.answers.get(&id).cloned()
    }

    /// The frames kept from `seq` on: a replay for a client whose `last_seq` is `seq`,
    /// with the repeat of that one.
    pub(super) fn from(&self, seq: u64) -> impl Iterator<Item = &(u64, Message)> {
        self.kept.iter().filter(move |(s, _)| *s >= seq)
    }

    /// Lets go of frames before `seq`; the one at `seq` stays, for the replay's repeat.
    pub(super) fn acked(&mut self, seq: u64) {
        while self.kept.front().is_some_and(|(s, _)| *s < seq) {
            self.kept.pop_front();
        }
    }
}
