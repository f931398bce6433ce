//! The profiles a worker holds: in memory for reads, written through the store before a
//! set is answered, and loaded from it when a partition is taken.
//!
//! - A **partition** is held loaded, or loading: a request for one loading waits
//!   (deferred) and is served when the load ends; a load that fails answers them 503
//!   and leaves the partition unloaded, so the next request loads it again.
//! - A **set** is written with the store's group commit ([`Context::wait_on`]) and
//!   answered when the store has it: 200 and memory changed, or 503 (408 past the
//!   request's deadline) and memory unchanged. Sets in flight for one player build on
//!   each other (the newest asked is the base of the next), and are numbered, so a
//!   result that comes back out of order never puts an older profile over a newer one.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use bytes::Bytes;
use futures::FutureExt as _;
use proto::Message as _;
use proto::code;
use proto::profile::{Profile, Profiles, SetRequest};

use super::{default_profile, partition_of_uid};
use crate::context::{CallResult, Context, Deferred};
use crate::handler_error::HandlerError;
use crate::store::Store;

/// A player's set profile (the uid is its key).
#[derive(Debug, Clone)]
struct Set {
    display: String,
    color: String,
}

/// Sets of one player asked and not yet stored.
struct Writing {
    /// The newest asked: the base of the next set.
    latest: Set,
    in_flight: u32,
}

/// A request waiting for its partition's load.
struct Waiter {
    deferred: Deferred,
    uid: String,
    /// A set's request; `None` for a get.
    set: Option<SetRequest>,
}

enum Partition {
    Loading(Vec<Waiter>),
    Loaded,
}

#[derive(Default)]
struct State {
    /// Profiles set and stored, by uid, with the number of the set that stored each
    /// (0: loaded or handed over).
    set: HashMap<String, (Set, u64)>,
    writing: HashMap<String, Writing>,
    /// The partitions held (absent: not held, or a load failed).
    partitions: HashMap<u32, Partition>,
    next_seq: u64,
}

/// The handle the service's handlers share.
#[derive(Clone)]
pub(super) struct Held {
    state: Arc<Mutex<State>>,
    store: Store,
    max_profiles: usize,
}

/// The store's key of `uid`'s profile: `profile.p<partition>.<uid>`, so a partition is
/// a prefix; a uid with characters a JetStream key does not take goes as `=` and its
/// bytes in hex.
pub(super) fn store_key(uid: &str) -> String {
    let plain = |c: char| c.is_ascii_alphanumeric() || c == '-' || c == '_';
    let partition = partition_prefix(partition_of_uid(uid));
    if !uid.is_empty() && uid.chars().all(plain) {
        format!("{partition}{uid}")
    } else {
        let hex: String = uid.bytes().map(|b| format!("{b:02x}")).collect();
        format!("{partition}={hex}")
    }
}

fn partition_prefix(partition: u32) -> String {
    format!("profile.p{partition}.")
}

fn profile(uid: &str, set: &Set) -> Profile {
    Profile {
        uid: uid.to_owned(),
        display: set.display.clone(),
        color: set.color.clone(),
    }
}

impl State {
    fn profile_of(&self, uid: &str) -> Profile {
        match self.set.get(uid) {
            Some((set, _)) => profile(uid, set),
            None => default_profile(uid),
        }
    }

    fn loaded(&self, partition: u32) -> bool {
        matches!(self.partitions.get(&partition), Some(Partition::Loaded))
    }

    /// What memory holds of `partition`.
    fn profiles(&self, partition: u32) -> Vec<Profile> {
        (self.set.iter())
            .filter(|(uid, _)| partition_of_uid(uid) == partition)
            .map(|(uid, (set, _))| profile(uid, set))
            .collect()
    }

    /// Forgets what memory holds of `partition`, returning it.
    fn clear(&mut self, partition: u32) -> Vec<Profile> {
        let profiles = self.profiles(partition);
        self.set.retain(|uid, _| partition_of_uid(uid) != partition);
        profiles
    }
}

impl Held {
    pub fn new(store: Store, max_profiles: usize) -> Held {
        Held {
            state: Arc::default(),
            store,
            max_profiles,
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // Changes are made whole under the lock: a poisoned one's data is still whole.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// `profile.get`: answered now from memory, or once the partition is loaded.
    pub fn get(&self, ctx: &mut Context, uid: String) -> Result<Profile, HandlerError> {
        let mut state = self.lock();
        if state.loaded(partition_of_uid(&uid)) {
            return Ok(state.profile_of(&uid));
        }
        let deferred = ctx.defer();
        self.wait(ctx, &mut state, deferred, uid, None);
        Ok(Profile::default())
    }

    /// `profile.set` (checked): deferred until the store has it.
    pub fn set(&self, ctx: &mut Context, uid: String, req: SetRequest) -> Result<(), HandlerError> {
        let deferred = ctx.defer();
        let mut state = self.lock();
        if state.loaded(partition_of_uid(&uid)) {
            self.write(ctx, &mut state, deferred, uid, req);
        } else {
            self.wait(ctx, &mut state, deferred, uid, Some(req));
        }
        Ok(())
    }

    /// Queues `uid`'s request (`set`, or a get) for its partition's load, starting one
    /// if none is running.
    fn wait(
        &self,
        ctx: &mut Context,
        state: &mut State,
        deferred: Deferred,
        uid: String,
        set: Option<SetRequest>,
    ) {
        let partition = partition_of_uid(&uid);
        let waiter = Waiter { deferred, uid, set };
        match state.partitions.get_mut(&partition) {
            Some(Partition::Loading(waiting)) => waiting.push(waiter),
            _ => {
                state
                    .partitions
                    .insert(partition, Partition::Loading(vec![waiter]));
                self.load(ctx, partition);
            }
        }
    }

    /// Writes a set through the store, answering `deferred` when it is stored.
    fn write(
        &self,
        ctx: &mut Context,
        state: &mut State,
        deferred: Deferred,
        uid: String,
        req: SetRequest,
    ) {
        let current = (state.writing.get(&uid).map(|w| w.latest.clone()))
            .or_else(|| state.set.get(&uid).map(|(set, _)| set.clone()));
        if current.is_none() && state.set.len() + state.writing.len() >= self.max_profiles {
            let max = self.max_profiles;
            let full = format!("this worker holds {max} profiles already");
            ctx.answer(
                deferred,
                Err(HandlerError::with_code(code::UNAVAILABLE, full)),
            );
            return;
        }
        let base = current.map_or_else(|| default_profile(&uid), |set| profile(&uid, &set));
        let keep = |new: String, old: String| if new.is_empty() { old } else { new };
        let set = Set {
            display: keep(req.display, base.display),
            color: keep(req.color, base.color),
        };
        state.next_seq += 1;
        let seq = state.next_seq;
        let writing = state.writing.entry(uid.clone()).or_insert(Writing {
            latest: set.clone(),
            in_flight: 0,
        });
        writing.latest = set.clone();
        writing.in_flight += 1;
        let value: Bytes = profile(&uid, &set).encode_to_vec().into();
        let (store, key, held) = (self.store.clone(), store_key(&uid), self.clone());
        let job = move || {
            let stored = store.put(key, value);
            async move {
                match stored.await {
                    Ok(_) => CallResult::error(code::OK, ""),
                    Err(error) => CallResult::error(code::UNAVAILABLE, error.to_string()),
                }
            }
            .boxed()
        };
        ctx.wait_on("profile.store", job, move |ctx, result| {
            held.written(ctx, deferred, seq, uid, set, result);
        });
    }

    /// A set's write came back: memory takes it if it is the newest stored, and the
    /// set is answered.
    fn written(
        &self,
        ctx: &mut Context,
        deferred: Deferred,
        seq: u64,
        uid: String,
        set: Set,
        result: CallResult,
    ) {
        let mut state = self.lock();
        if let Some(writing) = state.writing.get_mut(&uid) {
            writing.in_flight -= 1;
            if writing.in_flight == 0 {
                state.writing.remove(&uid);
            }
        }
        if !result.is_ok() {
            let message = match result.code {
                code::TIMEOUT => {
                    "the store did not confirm the profile in time: it may be stored".to_owned()
                }
                _ => format!("the profile was not stored: {}", result.message),
            };
            ctx.answer(deferred, Err(HandlerError::with_code(result.code, message)));
            return;
        }
        let answer = profile(&uid, &set);
        let newer = state.set.get(&uid).is_none_or(|(_, stored)| *stored < seq);
        // A partition handed away meanwhile is its new owner's: it loads the set.
        let partition = partition_of_uid(&uid);
        if newer && state.loaded(partition) {
            state.set.insert(uid, (set, seq));
            // Its standby holds it before the 200 leaves.
            ctx.changed(partition);
        }
        ctx.answer(deferred, Ok(answer.encode_to_vec().into()));
    }

    /// Loads `partition`'s profiles from the store, then serves its waiters.
    fn load(&self, ctx: &mut Context, partition: u32) {
        let (store, held) = (self.store.clone(), self.clone());
        let job = move || {
            async move {
                match store.load(partition_prefix(partition)).await {
                    Ok(entries) => {
                        let profiles = (entries.into_iter())
                            .filter_map(|(key, entry)| match Profile::decode(entry.value) {
                                Ok(profile) => Some(profile),
                                Err(error) => {
                                    tracing::warn!(key, %error, "a stored profile does not decode: skipped");
                                    None
                                }
                            })
                            .collect();
                    let body = Profiles { profiles }.encode_to_vec().into();
                        CallResult {
                            body,
                            ..CallResult::error(code::OK, "")
                        }
                    }
                    Err(error) => CallResult::error(code::UNAVAILABLE, error.to_string()),
                }
            }
            .boxed()
        };
        ctx.wait_on("profile.load", job, move |ctx, result| {
            held.loaded(ctx, partition, result);
        });
    }

    fn loaded(&self, ctx: &mut Context, partition: u32, result: CallResult) {
        let mut state = self.lock();
        let Some(Partition::Loading(waiting)) = state.partitions.remove(&partition) else {
            // Handed away meanwhile: its waiters were answered then.
            return;
        };
        let profiles = match result.decode::<Profiles>() {
            Ok(loaded) => loaded.profiles,
            Err(error) => {
                tracing::warn!(partition, error = error.message(), "profiles not loaded");
                let message = format!(
                    "this player's profiles could not be loaded: {}",
                    error.message()
                );
                for waiter in waiting {
                    let refused = HandlerError::with_code(code::UNAVAILABLE, message.clone());
                    ctx.answer(waiter.deferred, Err(refused));
                }
                return;
            }
        };
        // What a hand-over gave is as new as the store or newer: it stays.
        let lost = self.keep(&mut state, profiles, false);
        if lost > 0 {
            tracing::warn!(
                lost,
                partition,
                max = self.max_profiles,
                "stored profiles past the worker's limit are not held (served as defaults)"
            );
        }
        state.partitions.insert(partition, Partition::Loaded);
        ctx.changed(partition);
        for waiter in waiting {
            match waiter.set {
                Some(req) => self.write(ctx, &mut state, waiter.deferred, waiter.uid, req),
                None => {
                    let profile = state.profile_of(&waiter.uid);
                    ctx.answer(waiter.deferred, Ok(profile.encode_to_vec().into()));
                }
            }
        }
    }

    /// Puts `profiles` in memory within the limit (over those held when `replace`),
    /// returning how many did not fit.
    fn keep(&self, state: &mut State, profiles: Vec<Profile>, replace: bool) -> usize {
        let mut lost = 0;
        for p in profiles {
            let held = state.set.contains_key(&p.uid);
            if held && !replace {
                continue;
            }
            if !held && state.set.len() >= self.max_profiles {
                lost += 1;
                continue;
            }
            let set = Set {
                display: p.display,
                color: p.color,
            };
            state.set.insert(p.uid, (set, 0));
        }
        lost
    }

    /// The profiles of `partition`, handed over (and forgotten here), each as its newest
    /// set asked; requests waiting for its load are answered 503, to be sent again to
    /// the new owner.
    pub fn give(&self, ctx: &mut Context, partition: u32) -> Bytes {
        let mut state = self.lock();
        if let Some(Partition::Loading(waiting)) = state.partitions.remove(&partition) {
            for waiter in waiting {
                let moved = HandlerError::with_code(
                    code::UNAVAILABLE,
                    "this player's profiles moved to another worker: try again",
                );
                ctx.answer(waiter.deferred, Err(moved));
            }
        }
        let mut handed = state.clear(partition);
        // A set still being written goes as asked: the old owner answers it once the
        // store has it (or 503), and the new owner, whose load may come before that
        // write lands, must not serve the profile from before it.
        for (uid, writing) in &state.writing {
            if partition_of_uid(uid) == partition {
                handed.retain(|held| held.uid != *uid);
                handed.push(profile(uid, &writing.latest));
            }
        }
        Profiles { profiles: handed }.encode_to_vec().into()
    }

    /// The profiles of `partition` held now, for its standby (kept here).
    pub fn copy(&self, partition: u32) -> Bytes {
        let profiles = self.lock().profiles(partition);
        Profiles { profiles }.encode_to_vec().into()
    }

    /// A partition taken: what its old owner handed over (if it could) is held at
    /// once, and the store's profiles are loaded beside it.
    pub fn take(&self, ctx: &mut Context, partition: u32, handed: Option<Bytes>) {
        let mut state = self.lock();
        // A partition held before, and lost without a hand-over, may be stale.
        state.clear(partition);
        if let Some(handed) = handed {
            match Profiles::decode(handed) {
                Ok(handed) => {
                    let lost = self.keep(&mut state, handed.profiles, true);
                    if lost > 0 {
                        tracing::warn!(
                            lost,
                            max = self.max_profiles,
                            "profiles handed over past the worker's limit are not held (served as defaults)"
                        );
                    }
                }
                Err(error) => {
                    tracing::error!(%error, "a hand-over's profiles do not decode: the store's are loaded")
                }
            }
        }
        if !matches!(
            state.partitions.get(&partition),
            Some(Partition::Loading(_))
        ) {
            state
                .partitions
                .insert(partition, Partition::Loading(Vec::new()));
            self.load(ctx, partition);
        }
    }
}
