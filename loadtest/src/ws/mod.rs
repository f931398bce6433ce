//! WebSocket load through the gateway (docs/benchmarks.md "Gateway end to end"):
//! [`schedule`] and [`clock`] pace; [`lean`] (with [`inflight`], [`stats`]) is one
//! client, [`generator`] N of them; [`target`] is where they go; [`scenario`], [`idle`],
//! [`broadcast`], [`pomelo`], [`churn`], [`matches`] are the subcommands; [`report`].

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
