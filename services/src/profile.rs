//! The profile service: each player's display name and colour, held by the one worker
//! that owns the player's partition (a keyed service, keyed by uid; docs/workers.md,
//! "Keyed services"). `chat.login` calls `profile.get` for them (docs/workers.md,
//! "Calling other services"); docs/chat.md, "Profiles", is the player's view.
//!
//! - `profile.get{}`: the profile of the player the request is keyed by (a caller names
//!   the player as the key; a client's request routes by its own uid): the one set,
//!   else its default: display name the uid, colour one of [`PALETTE`] by the uid's
//!   FNV-1a hash, so a player has a stable colour before setting one.
//! - `profile.set{display, color}`: sets the session's own profile (401 without a uid,
//!   403 for a key other than the uid); an empty field keeps what it was. A display
//!   name is 1 to [`MAX_DISPLAY_LEN`] bytes without control characters, a colour
//!   `#rrggbb` in lowercase hex.
//!
//! Profiles live in memory: they move with their partition when workers come and go,
//! and a worker that dies loses those it held (their players are back to defaults). At
//! most [`MAX_PROFILES`] set profiles per worker: past it a set is answered 503.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use bytes::Bytes;
use proto::Message as _;
use proto::code;
use proto::keyed::{fnv1a, partition_of};
use proto::profile::{GetRequest, Profile, Profiles, SetRequest};

use crate::context::Context;
use crate::handler_error::HandlerError;
use crate::service::Service;

/// The service's name: its subject token.
pub const NAME: &str = "profile";
/// The route `chat.login` calls.
pub const ROUTE_GET: &str = "profile.get";
/// Partitions the players spread over.
pub const PARTITIONS: u32 = 16;
/// Longest display name, in bytes.
pub const MAX_DISPLAY_LEN: usize = 32;
/// Most profiles a worker keeps set (defaults cost nothing): each is a player's name
/// and colour in memory.
pub const MAX_PROFILES: usize = 65_536;
/// Default colours, picked by the uid's hash: readable on a light and a dark page.
pub const PALETTE: [&str; 12] = [
    "#e6194b", "#3cb44b", "#4363d8", "#f58231", "#911eb4", "#42a5b3", "#f032e6", "#7c9a00",
    "#c0392b", "#008080", "#9a6324", "#6a5acd",
];

/// A player's set profile (the uid is its key).
#[derive(Debug, Clone)]
struct Set {
    display: String,
    color: String,
}

type Shared = Arc<Mutex<HashMap<String, Set>>>;

fn lock(profiles: &Shared) -> MutexGuard<'_, HashMap<String, Set>> {
    // Each change is one insert or remove: a poisoned lock's data is still whole.
    profiles.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The profile service, keeping at most [`MAX_PROFILES`] set profiles.
pub fn service() -> Service {
    with_limit(MAX_PROFILES)
}

/// The profile service, keeping at most `max_profiles` set profiles.
pub fn with_limit(max_profiles: usize) -> Service {
    let profiles: Shared = Arc::default();
    let (get, set, hand_over, take_over) = (
        profiles.clone(),
        profiles.clone(),
        profiles.clone(),
        profiles,
    );
    Service::new(NAME)
        .descriptors(proto::DESCRIPTORS)
        .keyed(PARTITIONS)
        .method("get", move |ctx: &mut Context, _: GetRequest| {
            on_get(&get, ctx)
        })
        .method("set", move |ctx: &mut Context, req: SetRequest| {
            on_set(&set, max_profiles, ctx, req)
        })
        .on_hand_over(move |_, partition| give(&hand_over, partition))
        .on_take_over(move |_, _, state| {
            if let Some(state) = state {
                restore(&take_over, max_profiles, state);
            }
        })
}

/// `uid`'s profile before it sets one.
pub fn default_profile(uid: &str) -> Profile {
    let color = PALETTE[fnv1a(uid.as_bytes()) as usize % PALETTE.len()];
    Profile {
        uid: uid.to_owned(),
        display: uid.to_owned(),
        color: color.to_owned(),
    }
}

fn profile_of(profiles: &HashMap<String, Set>, uid: &str) -> Profile {
    match profiles.get(uid) {
        Some(set) => Profile {
            uid: uid.to_owned(),
            display: set.display.clone(),
            color: set.color.clone(),
        },
        None => default_profile(uid),
    }
}

fn on_get(profiles: &Shared, ctx: &Context) -> Result<Profile, HandlerError> {
    // A keyed request always has its key: the gate or the caller routed it by one.
    let uid = ctx
        .key()
        .ok_or_else(|| HandlerError::bad_request("send profile.get with the player as its key"))?;
    Ok(profile_of(&lock(profiles), uid))
}

fn on_set(
    profiles: &Shared,
    max_profiles: usize,
    ctx: &Context,
    req: SetRequest,
) -> Result<Profile, HandlerError> {
    let uid = ctx
        .uid()
        .ok_or_else(|| HandlerError::unauthorized("log in first"))?;
    if ctx.key() != Some(uid) {
        return Err(HandlerError::with_code(
            code::FORBIDDEN,
            "a player sets its own profile only",
        ));
    }
    check_display(&req.display)?;
    check_color(&req.color)?;
    let mut profiles = lock(profiles);
    let current = profile_of(&profiles, uid);
    if !profiles.contains_key(uid) && profiles.len() >= max_profiles {
        return Err(HandlerError::with_code(
            code::UNAVAILABLE,
            format!("this worker holds {max_profiles} profiles already"),
        ));
    }
    let keep = |new: String, old: String| if new.is_empty() { old } else { new };
    let set = Set {
        display: keep(req.display, current.display),
        color: keep(req.color, current.color),
    };
    profiles.insert(uid.to_owned(), set);
    Ok(profile_of(&profiles, uid))
}

fn check_display(display: &str) -> Result<(), HandlerError> {
    if display.len() > MAX_DISPLAY_LEN || display.chars().any(char::is_control) {
        return Err(HandlerError::bad_request(format!(
            "a display name is 1 to {MAX_DISPLAY_LEN} bytes without control characters"
        )));
    }
    Ok(())
}

fn check_color(color: &str) -> Result<(), HandlerError> {
    let hex = |c: char| c.is_ascii_digit() || ('a'..='f').contains(&c);
    let valid = color.is_empty()
        || color
            .strip_prefix('#')
            .is_some_and(|digits| digits.len() == 6 && digits.chars().all(hex));
    if !valid {
        return Err(HandlerError::bad_request(
            "a colour is #rrggbb, in lowercase hex",
        ));
    }
    Ok(())
}

/// The profiles of `partition`, handed over (and forgotten here).
fn give(profiles: &Shared, partition: u32) -> Bytes {
    let mut profiles = lock(profiles);
    let uids: Vec<String> = profiles
        .keys()
        .filter(|uid| partition_of(uid.as_bytes(), PARTITIONS) == partition)
        .cloned()
        .collect();
    let handed = uids
        .iter()
        .filter_map(|uid| {
            let set = profiles.remove(uid)?;
            Some(Profile {
                uid: uid.clone(),
                display: set.display,
                color: set.color,
            })
        })
        .collect();
    Profiles { profiles: handed }.encode_to_vec().into()
}

/// Profiles handed over by their old owner. The bound holds here too: a worker taking
/// more than it has room for keeps the first that fit and logs the rest as lost.
fn restore(profiles: &Shared, max_profiles: usize, state: Bytes) {
    let handed = match Profiles::decode(state) {
        Ok(handed) => handed.profiles,
        Err(error) => {
            tracing::error!(%error, "a hand-over's profiles do not decode: they are lost");
            return;
        }
    };
    let mut profiles = lock(profiles);
    let mut lost = 0;
    for p in handed {
        if profiles.len() >= max_profiles && !profiles.contains_key(&p.uid) {
            lost += 1;
            continue;
        }
        let set = Set {
            display: p.display,
            color: p.color,
        };
        profiles.insert(p.uid, set);
    }
    if lost > 0 {
        tracing::warn!(
            lost,
            max_profiles,
            "profiles handed over past the worker's limit are lost (back to defaults)"
        );
    }
}

#[cfg(test)]
mod tests;
