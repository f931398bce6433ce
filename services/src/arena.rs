//! The arena service: the reference keyed service (docs/workers.md, "Keyed services").
//!
//! A match lives in the one worker that owns its partition. Players join it, move in it
//! with inputs, and every tick of the worker's loop (20 Hz by default) the match steps
//! and pushes its state to its group:
//!
//! - `arena.join{match}`, sent with the match as the request's key: the session must
//!   have a uid (`chat.login` or a signed token). Binds the session's `arena_match` to
//!   the match, so its later requests route by it, and joins group `arena-<match>`. A
//!   new player starts at (0, 0); one already in the match keeps its place.
//! - `arena.input{dx, dy}`: adds (dx, dy) to the player's integer position, unbounded
//!   (saturating at the integer's ends), so a test can count moves.
//! - `arena.leave`: leaves the match (and its group); a match with no players ends.
//! - Pushes `arena.state{match, tick, players}` on each tick; `tick` rises by one per
//!   step for the match's whole life, hand-overs included (it moves with the state).
//!
//! A player whose session closes leaves its match (the gates' `evt.session.closed`,
//! seen by every arena worker, acted on by the match's owner). Every tick and input
//! reaches the partition's standby before it is pushed or answered: a partition whose
//! owner died is taken by its standby with its matches, ticks going on from the last one
//! pushed. Only one whose owner and standby both died starts fresh, with no matches: the
//! players' next input is answered 404 `match lost: join again`.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, MutexGuard};

use bytes::Bytes;
use proto::Message as _;
use proto::arena::{
    InputRequest, InputResponse, JoinRequest, JoinResponse, LeaveRequest, LeaveResponse, Matches,
    Player, State,
};
use proto::code;
use proto::keyed::partition_of;
use proto::rpc::SessionClosed;

use crate::context::Context;
use crate::handler_error::HandlerError;
use crate::service::{Delivery, Service};

/// The service's name: its subject token.
pub const NAME: &str = "arena";
/// Partitions the matches spread over.
pub const PARTITIONS: u32 = 64;
/// The session value a session's match is kept under: its requests route by it.
pub const SESSION_KEY: &str = "arena_match";
/// Longest match name: `arena-<match>` must be a group name (64 bytes at most).
pub const MAX_MATCH_LEN: usize = 48;
/// Most players in one match: a state push carries them all, every tick.
pub const MAX_PLAYERS: usize = 64;

const STATE_ROUTE: &str = "arena.state";
const SESSION_CLOSED: &str = "evt.session.closed";

/// One match: its tick and its players' positions, by uid.
#[derive(Debug, Default)]
struct Match {
    /// Its partition, worked out once (the tick snapshots it every step).
    partition: u32,
    tick: u64,
    players: BTreeMap<String, (i64, i64)>,
}

/// The matches this worker holds.
#[derive(Debug, Default)]
struct Arena {
    matches: HashMap<String, Match>,
}

type Shared = Arc<Mutex<Arena>>;

fn lock(arena: &Shared) -> MutexGuard<'_, Arena> {
    // Never held across a panic point that leaves it inconsistent: a poisoned lock's
    // data is still whole.
    arena
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn group(name: &str) -> String {
    format!("arena-{name}")
}

/// The arena service.
pub fn service() -> Service {
    let arena: Shared = Arc::default();
    let (join, input, leave) = (arena.clone(), arena.clone(), arena.clone());
    let (tick, closed, hand_over) = (arena.clone(), arena.clone(), arena.clone());
    let (snapshot, take_over) = (arena.clone(), arena);
    Service::new(NAME)
        .descriptors(proto::DESCRIPTORS)
        .keyed(PARTITIONS)
        .key_from_session(SESSION_KEY)
        .method("join", move |ctx: &mut Context, req: JoinRequest| {
            on_join(&join, ctx, &req)
        })
        .method("input", move |ctx: &mut Context, req: InputRequest| {
            on_input(&input, ctx, req)
        })
        .method("leave", move |ctx: &mut Context, _: LeaveRequest| {
            on_leave(&leave, ctx)
        })
        .push::<State>(STATE_ROUTE)
        .on_tick(move |ctx, _| step(&tick, ctx))
        .on_event(SESSION_CLOSED, Delivery::All, move |ctx, payload| {
            on_closed(&closed, ctx, payload)
        })
        .on_hand_over(move |_, partition| give(&hand_over, partition))
        .on_snapshot(move |partition| copy(&snapshot, partition))
        .on_take_over(move |_, _, state| {
            if let Some(state) = state {
                restore(&take_over, state);
            }
        })
}

fn uid(ctx: &Context) -> Result<String, HandlerError> {
    ctx.uid()
        .map(str::to_owned)
        .ok_or_else(|| HandlerError::unauthorized("log in first"))
}

fn on_join(
    arena: &Shared,
    ctx: &mut Context,
    req: &JoinRequest,
) -> Result<JoinResponse, HandlerError> {
    let uid = uid(ctx)?;
    let name = &req.r#match;
    if name.is_empty() || name.len() > MAX_MATCH_LEN || !crate::names::is_valid_token(name) {
        return Err(HandlerError::bad_request(format!(
            "a match is 1 to {MAX_MATCH_LEN} of [a-z0-9_-]"
        )));
    }
    if ctx.key() != Some(name.as_str()) {
        return Err(HandlerError::bad_request(
            "send arena.join with its match as the request's key",
        ));
    }
    let mut arena = lock(arena);
    let game = (arena.matches.entry(name.clone())).or_insert_with(|| Match {
        partition: partition_of(name.as_bytes(), PARTITIONS),
        ..Match::default()
    });
    if !game.players.contains_key(&uid) && game.players.len() >= MAX_PLAYERS {
        return Err(HandlerError::with_code(
            code::CONFLICT,
            format!("match full: {MAX_PLAYERS} players"),
        ));
    }
    let &mut (x, y) = game.players.entry(uid).or_default();
    let tick = game.tick;
    ctx.set_data(SESSION_KEY, name.clone());
    ctx.join(group(name));
    Ok(JoinResponse {
        r#match: name.clone(),
        tick,
        x,
        y,
    })
}

/// The player's match, as the request was routed.
fn routed_match(ctx: &Context) -> Result<String, HandlerError> {
    ctx.key()
        .map(str::to_owned)
        .ok_or_else(|| HandlerError::bad_request("join a match first"))
}

fn on_input(
    arena: &Shared,
    ctx: &mut Context,
    req: InputRequest,
) -> Result<InputResponse, HandlerError> {
    let uid = uid(ctx)?;
    let name = routed_match(ctx)?;
    let mut arena = lock(arena);
    let Some(game) = arena.matches.get_mut(&name) else {
        return Err(HandlerError::with_code(
            code::NOT_FOUND,
            "match lost: join again",
        ));
    };
    let Some((x, y)) = game.players.get_mut(&uid) else {
        return Err(HandlerError::with_code(
            code::NOT_FOUND,
            "not in this match: join again",
        ));
    };
    *x = x.saturating_add(i64::from(req.dx));
    *y = y.saturating_add(i64::from(req.dy));
    Ok(InputResponse { x: *x, y: *y })
}

fn on_leave(arena: &Shared, ctx: &mut Context) -> Result<LeaveResponse, HandlerError> {
    let uid = uid(ctx)?;
    let name = routed_match(ctx)?;
    remove_player(&mut lock(arena), &name, &uid);
    ctx.clear_data(SESSION_KEY);
    ctx.leave(group(&name));
    Ok(LeaveResponse {})
}

fn remove_player(arena: &mut Arena, name: &str, uid: &str) {
    if let Some(game) = arena.matches.get_mut(name) {
        game.players.remove(uid);
        if game.players.is_empty() {
            arena.matches.remove(name);
        }
    }
}

fn on_closed(arena: &Shared, ctx: &mut Context, payload: Bytes) -> Result<(), HandlerError> {
    let closed = SessionClosed::decode(payload)
        .map_err(|e| HandlerError::bad_request(format!("bad SessionClosed: {e}")))?;
    if closed.uid.is_empty() {
        return Ok(());
    }
    let mut arena = lock(arena);
    for joined in &closed.groups {
        if let Some(name) = joined.strip_prefix("arena-")
            && arena.matches.contains_key(name)
        {
            remove_player(&mut arena, name, &closed.uid);
            ctx.changed(partition_of(name.as_bytes(), PARTITIONS));
        }
    }
    Ok(())
}

fn state_of(name: &str, game: &Match) -> State {
    State {
        r#match: name.to_owned(),
        tick: game.tick,
        players: game
            .players
            .iter()
            .map(|(uid, &(x, y))| Player {
                uid: uid.clone(),
                x,
                y,
            })
            .collect(),
    }
}

/// One step of every match: its tick, and its state to its group.
fn step(arena: &Shared, ctx: &mut Context) {
    let mut arena = lock(arena);
    for (name, game) in &mut arena.matches {
        game.tick += 1;
        ctx.changed(game.partition);
        let state = state_of(name, game).encode_to_vec();
        if let Err(error) = ctx.broadcast(&group(name), STATE_ROUTE, state) {
            tracing::warn!(%error, "cannot push a match's state");
        }
    }
}

/// The matches of `partition`, handed over (and forgotten here).
fn give(arena: &Shared, partition: u32) -> Bytes {
    let mut arena = lock(arena);
    let state = matches_of(&arena, partition);
    arena.matches.retain(|_, game| game.partition != partition);
    state
}

/// The matches of `partition` as they are now, for its standby (kept here).
fn copy(arena: &Shared, partition: u32) -> Bytes {
    matches_of(&lock(arena), partition)
}

fn matches_of(arena: &Arena, partition: u32) -> Bytes {
    let matches = (arena.matches.iter())
        .filter(|(_, game)| game.partition == partition)
        .map(|(name, game)| state_of(name, game))
        .collect();
    Matches { matches }.encode_to_vec().into()
}

/// Matches handed over by their old owner.
fn restore(arena: &Shared, state: Bytes) {
    let matches = match Matches::decode(state) {
        Ok(matches) => matches.matches,
        Err(error) => {
            tracing::error!(%error, "a hand-over's matches do not decode: they are lost");
            return;
        }
    };
    let mut arena = lock(arena);
    for state in matches {
        let players = state
            .players
            .into_iter()
            .map(|p| (p.uid, (p.x, p.y)))
            .collect();
        let game = Match {
            partition: partition_of(state.r#match.as_bytes(), PARTITIONS),
            tick: state.tick,
            players,
        };
        arena.matches.insert(state.r#match, game);
    }
}

#[cfg(test)]
mod tests;
