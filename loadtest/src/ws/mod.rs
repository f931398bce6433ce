//! WebSocket load through the gateway (docs/benchmarks.md "Gateway end to end"): the
//! open-loop generator, the scenarios run with it, and their reports.
//!
//! - [`schedule`], [`clock`]: absolute send times, and what wakes a client for them.
//! - [`lean`] (with [`inflight`], [`stats`]): one client, its WebSocket and
//!   what it records; [`generator`]: N of them, one run.
//! - [`target`]: gates by URL, a launched topology, or the bare echo server.
//! - [`scenario`], [`idle`], [`broadcast`], [`pomelo`], [`churn`], [`matches`]: the
//!   subcommands;
//!   [`report`]: what they measured.

pub mod broadcast;
pub mod churn;
pub mod clock;
pub mod generator;
pub mod idle;
pub mod inflight;
pub mod lean;
pub mod matches;
pub mod pomelo;
pub mod report;
pub mod scenario;
pub mod schedule;
pub mod stats;
pub mod target;
