//! One `matches` player: its session and what it saw (pushes, ticks, inputs and their
//! answers), the inputs it sends, and its position at the end.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use proto::Message as _;
use proto::arena::{InputRequest, InputResponse, JoinRequest, State};
use proto::chat::LoginRequest;
use sdk::{Backoff, Client, ClientOptions};

use super::super::broadcast::{expect_ok, request_ok};
use super::{MatchesArgs, NO_ANSWER};
use crate::hist::Hist;

/// One player: its session, and what it saw.
pub(super) struct Player {
    pub client: Client,
    pub seen: Arc<Mutex<Seen>>,
}

/// What one player saw.
#[derive(Default)]
pub(super) struct Seen {
    /// Inputs sent and not yet shown by a state push: (count after it, when sent).
    pub unshown: VecDeque<(i64, Instant)>,
    pub sent: i64,
    /// Inputs answered 200; and answered with a code but 200 or 408: not applied.
    pub ok: i64,
    pub refused: i64,
    pub latency: Hist,
    /// Input sent to its answer of 200 (what a standby's round trip adds to).
    pub answered: Hist,
    pub pushes: u64,
    pub last_tick: Option<u64>,
    pub last_push: Option<Instant>,
    pub skipped: u64,
    pub repeated: u64,
    pub longest_gap: Duration,
}

impl Seen {
    fn on_state(&mut self, uid: &str, state: &State, watches: bool) {
        let now = Instant::now();
        self.pushes += 1;
        if watches {
            if let Some(last) = self.last_tick {
                match state.tick.checked_sub(last) {
                    Some(1) => {}
                    Some(0) | None => self.repeated += 1,
                    Some(n) => self.skipped += n - 1,
                }
            }
            if let Some(last) = self.last_push {
                self.longest_gap = self.longest_gap.max(now - last);
            }
            self.last_tick = Some(state.tick);
            self.last_push = Some(now);
        }
        let Some(me) = state.players.iter().find(|p| p.uid == uid) else {
            return;
        };
        while let Some(&(count, sent)) = self.unshown.front() {
            if count > me.x {
                break;
            }
            self.latency.record(now - sent);
            self.unshown.pop_front();
        }
    }
}

/// Inputs not answered 200, by `code message`, and inputs not answered yet.
#[derive(Default)]
pub(super) struct Outcomes {
    pub failed: std::collections::BTreeMap<String, u64>,
    pub pending: u64,
}

/// Connects player `i` (gate `i % gates` first, resuming by itself), logs it in and
/// joins its match (`i / players`).
pub(super) async fn join(urls: &[String], i: usize, players: usize) -> anyhow::Result<Player> {
    let first = i % urls.len();
    let urls = [&urls[first..], &urls[..first]].concat();
    let options = ClientOptions {
        reconnect: Some(Backoff::default()),
        ..ClientOptions::default()
    };
    let client = Client::connect_any(&urls, options).await;
    let client = client.with_context(|| format!("connecting {}", urls[0]))?;
    let uid = format!("p{i}");
    request_ok(&client, "chat.login", LoginRequest { name: uid.clone() }).await?;
    let name = format!("m{}", i / players);
    let r#match = name.clone();
    let join = JoinRequest { r#match }.encode_to_vec();
    let joined = client.request_keyed("arena.join", &name, join).await;
    expect_ok(joined.with_context(|| format!("{uid} joining {name}"))?)?;
    let seen = Arc::new(Mutex::new(Seen::default()));
    let mut pushes = client.pushes().context("push stream taken")?;
    let watching = seen.clone();
    let watches = i % players == 0;
    tokio::spawn(async move {
        while let Some(push) = pushes.recv().await {
            if let Ok(state) = State::decode(push.body) {
                watching.lock().unwrap().on_state(&uid, &state, watches);
            }
        }
    });
    Ok(Player { client, seen })
}

/// Sends `--rate` inputs a second for `--duration`, not waiting; answers go to `results`.
/// The first goes `phase` (0 to 1) of a period late: players spread over the period, so
/// their inputs' waits for the next tick spread too, and input to state's p99 does not
/// hang on one shared phase between the players' schedule and the tick.
pub(super) fn send_inputs(
    player: &Player,
    phase: f64,
    args: &MatchesArgs,
    results: &Arc<Mutex<Outcomes>>,
) -> tokio::task::JoinHandle<()> {
    let (client, seen, results) = (player.client.clone(), player.seen.clone(), results.clone());
    let interval = Duration::from_secs(1) / args.rate;
    let count = (args.duration.as_secs_f64() * f64::from(args.rate)) as u64;
    tokio::spawn(async move {
        let body = InputRequest { dx: 1, dy: 0 }.encode_to_vec();
        let first = tokio::time::Instant::now() + interval.mul_f64(phase);
        let mut ticks = tokio::time::interval_at(first, interval);
        for _ in 0..count {
            ticks.tick().await;
            {
                let mut seen = seen.lock().unwrap();
                seen.sent += 1;
                let count = seen.sent;
                seen.unshown.push_back((count, Instant::now()));
            }
            results.lock().unwrap().pending += 1;
            let (client, body, results) = (client.clone(), body.clone(), results.clone());
            let seen = seen.clone();
            tokio::spawn(async move {
                let sent = Instant::now();
                let answer = client.request("arena.input", body).await;
                let mut r = results.lock().unwrap();
                r.pending -= 1;
                let failed = match answer {
                    Ok(a) if a.code == proto::code::OK => {
                        let mut seen = seen.lock().unwrap();
                        seen.answered.record(sent.elapsed());
                        return seen.ok += 1;
                    }
                    Ok(a) => {
                        let refused = a.code != proto::code::TIMEOUT;
                        seen.lock().unwrap().refused += i64::from(refused);
                        format!("{} {}", a.code, a.message)
                    }
                    Err(e) => format!("{NO_ANSWER} {e}"),
                };
                *r.failed.entry(failed).or_default() += 1;
            });
        }
    })
}

/// A player's position (an input of (0, 0) answers it); `None` if its match is lost (404).
pub(super) async fn position(client: &Client) -> anyhow::Result<Option<i64>> {
    let body = InputRequest { dx: 0, dy: 0 }.encode_to_vec();
    let answer = client.request("arena.input", body).await?;
    if answer.code == proto::code::NOT_FOUND {
        return Ok(None);
    }
    expect_ok(answer.clone())?;
    Ok(Some(InputResponse::decode(answer.body)?.x))
}
