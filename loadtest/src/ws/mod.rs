//! WebSocket load through the gateway (BENCHMARKS.md "Gateway end to end"): an
//! open-loop generator (each client one task owning its WebSocket, or on the Rust client
//! SDK for `wss://` and `--driver sdk`), the scenarios run with it, and their reports.
//!
//! - [`schedule`]: absolute send times, warm-up and measured slots, the request body.
//! - [`clock`]: what wakes a client when a slot is due (hrtimer thread or tokio timers).
//! - [`generator`]: N clients, one request per interval, recorded three ways.
//! - [`lean`] (with [`inflight`]) and [`sdk_driver`]: what speaks to the server for
//!   each client; [`books`]: each client's counts, whichever driver.
//! - [`hist`], [`stats`]: HDR histograms, per-client records and how they add up.
//! - [`target`]: gates by URL, a launched topology, or the bare echo server.
//! - [`scenario`], [`idle`], [`broadcast`], [`pomelo`], [`churn`]: the subcommands.
//! - [`report`], [`text`], [`html`]: the report, as JSON, terminal text and HTML.
//! - [`procfs`]: RSS and CPU time of a process.

pub mod books;
pub mod broadcast;
pub mod churn;
pub mod clock;
pub mod generator;
pub mod hist;
pub mod html;
pub mod idle;
pub mod inflight;
pub mod lean;
pub mod pomelo;
pub mod procfs;
pub mod report;
pub mod scenario;
pub mod schedule;
pub mod sdk_driver;
pub mod stats;
pub mod target;
pub mod text;
