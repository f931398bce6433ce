//! State shared by the client handles and the connection task: the table of pending
//! requests and the connection's state.
//!
//! **Epochs.** Every connection (the first and each reconnection) has an epoch. A
//! request registers its waiter under the epoch it saw `Up`, and tags its frame with it;
//! losing the connection bumps the epoch and fails every waiter in the same critical
//! section. So a waiter can never be left behind in a table whose connection is gone, and
//! the writer of the next connection drops frames tagged with an old epoch instead of
//! sending requests whose callers were already told `Closed`.
//!
//! **Moves.** When the gate drains, the client moves to another gate without failing
//! anything: the new connection gets the next epoch, and the waiters of the old one stay
//! in the table, counted as *retiring* under their epoch, until their answers arrive on
//! the old socket. The connection task closes that socket once its count is zero
//! ([`Shared::retired`] wakes it).
//!
//! **Resumes.** A lost connection whose session can be resumed keeps its waiters, each
//! with its request's frame, while the task redials; if the session is resumed they wait
//! on the new connection and the task sends their frames again ([`Shared::up`]), else
//! they fail as after any loss. Keeping the frame costs a reference count, not a copy.
//!
//! The table is a plain mutex: each request takes it twice (insert, then the reader's
//! remove), never across an `.await`, and only this connection's callers contend on it.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};

use bytes::Bytes;
use proto::client::Response;
use rustc_hash::FxHashMap;
use tokio::sync::{Notify, oneshot, watch};

use super::error::SdkError;

/// Where a request's answer goes: the response, or why there will be none.
pub(crate) type Waiter = oneshot::Sender<Result<Response, SdkError>>;

/// The connection as requests see it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum State {
    /// Connected and handshaken; requests register under this epoch.
    Up { epoch: u64 },
    /// Lost; the connection task is reconnecting. Requests wait (within their timeout).
    Reconnecting,
    /// For good: closed by the client, kicked, or lost without reconnect.
    Closed { reason: String },
}

/// Why a waiter was not registered.
pub(crate) enum Refused {
    /// The epoch moved on since the caller looked: wait for the next `Up`.
    Stale(Waiter),
    Closed(String),
}

/// A request waiting for its answer.
struct Pending {
    /// The epoch it registered in.
    epoch: u64,
    waiter: Waiter,
    /// Its frame, to send again if its session is resumed on a new connection.
    frame: Bytes,
}

struct Table {
    epoch: u64,
    closed: Option<String>,
    /// By request id.
    waiters: FxHashMap<u64, Pending>,
    /// Connections moved away from but still open: their epoch and how many of the
    /// waiters are theirs. Empty except during a move.
    retiring: FxHashMap<u64, usize>,
}

impl Table {
    /// Takes request `id`'s waiter out, counting it off its retiring connection.
    fn take(&mut self, id: u64) -> Option<Waiter> {
        let pending = self.waiters.remove(&id)?;
        if pending.epoch != self.epoch
            && let Some(count) = self.retiring.get_mut(&pending.epoch)
        {
            *count = count.saturating_sub(1);
        }
        Some(pending.waiter)
    }
}

pub(crate) struct Shared {
    table: Mutex<Table>,
    state: watch::Sender<State>,
    session_id: AtomicU64,
    pushes_dropped: AtomicU64,
    reconnects: AtomicU64,
    resumes: AtomicU64,
    /// The last reconnection's `resume_code`.
    resume_code: AtomicU32,
    moves: AtomicU64,
    /// Woken when a retiring connection's last waiter is answered or forgotten.
    retired: Notify,
}

/// The first connection's epoch.
pub(crate) const FIRST_EPOCH: u64 = 1;

impl Shared {
    pub(crate) fn new(session_id: u64) -> Self {
        Shared {
            table: Mutex::new(Table {
                epoch: FIRST_EPOCH,
                closed: None,
                waiters: FxHashMap::default(),
                retiring: FxHashMap::default(),
            }),
            state: watch::Sender::new(State::Up { epoch: FIRST_EPOCH }),
            session_id: AtomicU64::new(session_id),
            pushes_dropped: AtomicU64::new(0),
            reconnects: AtomicU64::new(0),
            resumes: AtomicU64::new(0),
            resume_code: AtomicU32::new(0),
            moves: AtomicU64::new(0),
            retired: Notify::new(),
        }
    }

    fn table(&self) -> MutexGuard<'_, Table> {
        // Nothing panics while holding the lock; if something did, the table is still
        // consistent (each operation is a single map call), so carry on.
        self.table.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub(crate) fn state(&self) -> &watch::Sender<State> {
        &self.state
    }

    /// Registers `waiter` for request `id`, sent as `frame`, if the connection is still
    /// at `epoch`.
    pub(crate) fn insert(
        &self,
        epoch: u64,
        id: u64,
        waiter: Waiter,
        frame: &Bytes,
    ) -> Result<(), Refused> {
        let mut table = self.table();
        if let Some(reason) = &table.closed {
            return Err(Refused::Closed(reason.clone()));
        }
        if table.epoch != epoch {
            return Err(Refused::Stale(waiter));
        }
        let frame = frame.clone();
        table.waiters.insert(
            id,
            Pending {
                epoch,
                waiter,
                frame,
            },
        );
        Ok(())
    }

    /// Forgets request `id` (its caller timed out or went away).
    pub(crate) fn remove(&self, id: u64) {
        self.take(id);
    }

    /// Hands a response to its waiter. A response nobody waits for (timed out, or an
    /// id the client never sent) is dropped.
    pub(crate) fn complete(&self, response: Response) {
        if let Some(waiter) = self.take(response.id) {
            // The caller may have given up since; that is its business.
            let _ = waiter.send(Ok(response));
        }
    }

    fn take(&self, id: u64) -> Option<Waiter> {
        let mut table = self.table();
        let retiring = table.retiring.len();
        let waiter = table.take(id);
        // Only during a move: wake the task when a retiring connection has nothing left.
        if retiring > 0 && table.retiring.values().any(|&count| count == 0) {
            self.retired.notify_one();
        }
        waiter
    }

    /// The client moved to a new connection: requests register under the next epoch
    /// from now on, while the current one's waiters stay, retiring. Returns the new
    /// epoch.
    pub(crate) fn moved(&self, session_id: u64) -> u64 {
        let epoch = {
            let mut table = self.table();
            let old = table.epoch;
            let pending = table.waiters.values().filter(|p| p.epoch == old).count();
            table.retiring.insert(old, pending);
            table.epoch += 1;
            table.epoch
        };
        self.session_id.store(session_id, Ordering::Relaxed);
        self.moves.fetch_add(1, Ordering::Relaxed);
        self.state.send_replace(State::Up { epoch });
        self.retired.notify_one();
        epoch
    }

    /// Waits until a retiring connection may have nothing left (check with
    /// [`Shared::retiring_done`]).
    pub(crate) async fn retired(&self) {
        self.retired.notified().await;
    }

    /// Whether retiring connection `epoch` has no waiter left.
    pub(crate) fn retiring_done(&self, epoch: u64) -> bool {
        self.table()
            .retiring
            .get(&epoch)
            .is_none_or(|&count| count == 0)
    }

    /// Retiring connection `epoch` is gone: fail what still waits on it (`reason`) and
    /// stop counting it.
    pub(crate) fn retire(&self, epoch: u64, reason: &str) {
        let waiters = {
            let mut table = self.table();
            table.retiring.remove(&epoch);
            take_epoch(&mut table.waiters, epoch)
        };
        fail_all(waiters, reason);
    }

    /// The connection was lost and will be re-established: start a new epoch and fail
    /// every pending request, except, when `resuming`, those of the lost connection,
    /// which wait for [`Shared::up`]. Returns the new epoch.
    pub(crate) fn lose(&self, reason: &str, resuming: bool) -> u64 {
        let (epoch, failed) = {
            let mut table = self.table();
            let lost = table.epoch;
            table.epoch += 1;
            table.retiring.clear();
            let kept = if resuming {
                take_epoch(&mut table.waiters, lost)
            } else {
                FxHashMap::default()
            };
            let failed = std::mem::replace(&mut table.waiters, kept);
            (table.epoch, failed)
        };
        fail_all(failed, reason);
        self.state.send_replace(State::Reconnecting);
        epoch
    }

    /// A reconnection at `epoch` finished its handshake; `resume_code` is the ack's (0:
    /// no resume asked). Resumed (200): the requests kept at the loss now wait on this
    /// connection, and their frames are returned, in the order of their ids, to be sent
    /// again. Otherwise they fail with `reason`.
    pub(crate) fn up(
        &self,
        epoch: u64,
        session_id: u64,
        resume_code: u32,
        reason: &str,
    ) -> Vec<Bytes> {
        let resumed = resume_code == proto::code::OK;
        let (resend, failed) = {
            let mut table = self.table();
            if resumed {
                let mut resend: Vec<(u64, Bytes)> = table
                    .waiters
                    .iter_mut()
                    .map(|(&id, pending)| {
                        pending.epoch = epoch;
                        (id, pending.frame.clone())
                    })
                    .collect();
                // Ids count up: in their order, the requests go out as they were made.
                resend.sort_unstable_by_key(|&(id, _)| id);
                (resend, FxHashMap::default())
            } else {
                (Vec::new(), std::mem::take(&mut table.waiters))
            }
        };
        fail_all(failed, reason);
        self.session_id.store(session_id, Ordering::Relaxed);
        self.resume_code.store(resume_code, Ordering::Release);
        if resumed {
            self.resumes.fetch_add(1, Ordering::Release);
        }
        // Last, so a caller that sees the count grow sees the code and resumes with it.
        self.reconnects.fetch_add(1, Ordering::Release);
        self.state.send_replace(State::Up { epoch });
        resend.into_iter().map(|(_, frame)| frame).collect()
    }

    /// Closes for good. Idempotent: the first reason stays.
    pub(crate) fn finish(&self, reason: &str) {
        let waiters = {
            let mut table = self.table();
            if table.closed.is_some() {
                return;
            }
            table.closed = Some(reason.to_owned());
            table.epoch += 1;
            table.retiring.clear();
            std::mem::take(&mut table.waiters)
        };
        fail_all(waiters, reason);
        self.state.send_replace(State::Closed {
            reason: reason.to_owned(),
        });
    }

    /// The error for a request that found the connection closed.
    pub(crate) fn closed_error(&self) -> SdkError {
        let reason = self.table().closed.clone();
        SdkError::closed(reason.unwrap_or_else(|| "connection task ended".to_owned()))
    }

    pub(crate) fn session_id(&self) -> u64 {
        self.session_id.load(Ordering::Relaxed)
    }

    /// Counts a push dropped because the push queue was full; true for the first one.
    pub(crate) fn push_dropped(&self) -> bool {
        self.pushes_dropped.fetch_add(1, Ordering::Relaxed) == 0
    }

    pub(crate) fn pushes_dropped(&self) -> u64 {
        self.pushes_dropped.load(Ordering::Relaxed)
    }

    pub(crate) fn reconnects(&self) -> u64 {
        self.reconnects.load(Ordering::Acquire)
    }

    pub(crate) fn resumes(&self) -> u64 {
        self.resumes.load(Ordering::Acquire)
    }

    pub(crate) fn resume_code(&self) -> u32 {
        self.resume_code.load(Ordering::Acquire)
    }

    pub(crate) fn moves(&self) -> u64 {
        self.moves.load(Ordering::Relaxed)
    }

    #[cfg(test)]
    pub(crate) fn pending(&self) -> usize {
        self.table().waiters.len()
    }
}

/// Takes the waiters registered in `epoch` out of `waiters`.
fn take_epoch(waiters: &mut FxHashMap<u64, Pending>, epoch: u64) -> FxHashMap<u64, Pending> {
    let ids: Vec<u64> = waiters
        .iter()
        .filter(|(_, p)| p.epoch == epoch)
        .map(|(&id, _)| id)
        .collect();
    ids.into_iter()
        .filter_map(|id| waiters.remove(&id).map(|p| (id, p)))
        .collect()
}

fn fail_all(waiters: FxHashMap<u64, Pending>, reason: &str) {
    for (_, pending) in waiters {
        let _ = pending.waiter.send(Err(SdkError::closed(reason)));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ErrorKind;

    /// `shared` with requests `ids` registered in the first epoch, each sent as
    /// `frame <id>`; their answers, in the same order.
    fn registered(
        shared: &Shared,
        ids: &[u64],
    ) -> Vec<oneshot::Receiver<Result<Response, SdkError>>> {
        let mut answers = Vec::new();
        for &id in ids {
            let (waiter, answer) = oneshot::channel();
            let frame = Bytes::from(format!("frame {id}"));
            assert!(shared.insert(FIRST_EPOCH, id, waiter, &frame).is_ok());
            answers.push(answer);
        }
        answers
    }

    #[test]
    fn a_resume_keeps_the_requests_in_flight_and_gives_their_frames_in_order() {
        let shared = Shared::new(1);
        let mut answers = registered(&shared, &[3, 1, 2]);
        let epoch = shared.lose("lost", true);
        assert_eq!(*shared.state().borrow(), State::Reconnecting);
        assert_eq!(shared.pending(), 3);
        let resend = shared.up(epoch, 7, proto::code::OK, "unused");
        assert_eq!(resend, ["frame 1", "frame 2", "frame 3"]);
        assert_eq!(*shared.state().borrow(), State::Up { epoch });
        // Still waiting, now on the new connection: their answers get through.
        shared.complete(Response {
            id: 1,
            ..Response::default()
        });
        assert_eq!(answers[1].try_recv().unwrap().unwrap().id, 1);
        assert!(answers[0].try_recv().is_err(), "request 3 still waits");
        assert_eq!(
            (shared.reconnects(), shared.resumes(), shared.resume_code()),
            (1, 1, 200)
        );
        assert_eq!(shared.session_id(), 7);
    }

    #[test]
    fn a_refused_resume_fails_the_requests_kept_for_it() {
        let shared = Shared::new(1);
        let mut answers = registered(&shared, &[1, 2]);
        let epoch = shared.lose("lost", true);
        assert!(shared.up(epoch, 2, 404, "not resumed").is_empty());
        for answer in &mut answers {
            let e = answer.try_recv().unwrap().unwrap_err();
            assert_eq!(
                e.kind(),
                &ErrorKind::Closed {
                    reason: "not resumed".into()
                }
            );
        }
        assert_eq!(shared.pending(), 0);
        assert_eq!(
            (shared.reconnects(), shared.resumes(), shared.resume_code()),
            (1, 0, 404)
        );
    }

    #[test]
    fn without_a_resume_a_loss_fails_everything_at_once() {
        let shared = Shared::new(1);
        let mut answers = registered(&shared, &[1]);
        shared.lose("lost", false);
        assert!(answers[0].try_recv().unwrap().is_err());
        assert_eq!(shared.pending(), 0);
    }
}
