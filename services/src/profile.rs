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
//! Profiles are kept in a store ([`crate::store`], docs/stores.md) and in memory:
//! `profile.set` writes through before it answers 200 (the store's failure is a 503,
//! and memory keeps what it had), `profile.get` reads memory. A partition taken (at
//! start, on a hand-over, after a worker's death) loads its profiles from the store;
//! requests for it meanwhile wait for the load ([`held`]). At most [`MAX_PROFILES`] set
//! profiles per worker in memory: past it a new player's set is answered 503.

mod held;

use proto::code;
use proto::keyed::{fnv1a, partition_of};
use proto::profile::{GetRequest, Profile, SetRequest};

use crate::context::Context;
use crate::handler_error::HandlerError;
use crate::service::Service;
use crate::store::Store;
use held::Held;

/// The service's name: its subject token.
pub const NAME: &str = "profile";
/// The route `chat.login` calls.
pub const ROUTE_GET: &str = "profile.get";
/// Partitions the players spread over.
pub const PARTITIONS: u32 = 16;
/// Longest display name, in bytes.
pub const MAX_DISPLAY_LEN: usize = 32;
/// Most profiles a worker keeps set in memory (defaults cost nothing): each is a
/// player's name and colour.
pub const MAX_PROFILES: usize = 65_536;
/// Default colours, picked by the uid's hash: readable on a light and a dark page.
pub const PALETTE: [&str; 12] = [
    "#e6194b", "#3cb44b", "#4363d8", "#f58231", "#911eb4", "#42a5b3", "#f032e6", "#7c9a00",
    "#c0392b", "#008080", "#9a6324", "#6a5acd",
];

/// The profile service over `store`, keeping at most [`MAX_PROFILES`] set profiles.
pub fn service(store: Store) -> Service {
    with_limit(store, MAX_PROFILES)
}

/// The profile service over `store`, keeping at most `max_profiles` set profiles.
pub fn with_limit(store: Store, max_profiles: usize) -> Service {
    let held = Held::new(store, max_profiles);
    let (get, set, hand_over) = (held.clone(), held.clone(), held.clone());
    let (snapshot, take_over) = (held.clone(), held);
    Service::new(NAME)
        .descriptors(proto::DESCRIPTORS)
        .keyed(PARTITIONS)
        .method("get", move |ctx: &mut Context, _: GetRequest| {
            on_get(&get, ctx)
        })
        .method("set", move |ctx: &mut Context, req: SetRequest| {
            on_set(&set, ctx, req)
        })
        .on_hand_over(move |ctx, partition| hand_over.give(ctx, partition))
        .on_snapshot(move |partition| snapshot.copy(partition))
        .on_take_over(move |ctx, partition, state| take_over.take(ctx, partition, state))
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

/// The partition `uid` belongs to.
fn partition_of_uid(uid: &str) -> u32 {
    partition_of(uid.as_bytes(), PARTITIONS)
}

fn on_get(held: &Held, ctx: &mut Context) -> Result<Profile, HandlerError> {
    // A keyed request always has its key: the gate or the caller routed it by one.
    let uid = ctx
        .key()
        .ok_or_else(|| HandlerError::bad_request("send profile.get with the player as its key"))?
        .to_owned();
    held.get(ctx, uid)
}

fn on_set(held: &Held, ctx: &mut Context, req: SetRequest) -> Result<Profile, HandlerError> {
    let uid = ctx
        .uid()
        .ok_or_else(|| HandlerError::unauthorized("log in first"))?
        .to_owned();
    if ctx.key() != Some(uid.as_str()) {
        return Err(HandlerError::with_code(
            code::FORBIDDEN,
            "a player sets its own profile only",
        ));
    }
    check_display(&req.display)?;
    check_color(&req.color)?;
    held.set(ctx, uid, req)?;
    // Deferred: the answer comes once the store has the profile.
    Ok(Profile::default())
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

#[cfg(test)]
mod tests;
