//! Changing a running topology, for scenarios that measure what clients see when the
//! fleet changes under load (`loadtest faults`): a worker or a gate added, one process
//! stopped by a chosen signal, a bus node started again ([`Topology::restart_bus_node`]).
//! Each call returns once the change is done: the new process logged that it is ready,
//! the stopped one has exited and been reaped.

use std::net::SocketAddr;
use std::process::ExitStatus;
use std::time::Duration;

use anyhow::Context as _;
use nix::sys::signal::Signal;
use tokio::time::Instant;

use super::{Role, Topology};

/// How [`Topology::stop_one`] ended.
#[derive(Debug, Clone)]
pub struct Stopped {
    pub role: Role,
    pub pid: u32,
    /// From the signal to the exit.
    pub took: Duration,
    /// The exit status, when it could be read.
    pub status: Option<ExitStatus>,
    /// It outlived the stop timeout and was killed (SIGKILL) then.
    pub killed_after_timeout: bool,
}

impl Topology {
    /// Starts one more worker of `service` and waits until it is ready.
    pub async fn add_worker(&mut self, service: &str) -> anyhow::Result<Role> {
        let role = self.spawn_worker(service)?;
        self.wait_started(Instant::now() + self.spec.ready_timeout)
            .await?;
        Ok(role)
    }

    /// Starts one more gate listening on `listen` (the port of a gate that was stopped,
    /// so its clients find it again) and waits until it is ready.
    pub async fn add_gate(&mut self, listen: SocketAddr) -> anyhow::Result<Role> {
        let role = self.spawn_gate(listen)?;
        self.wait_started(Instant::now() + self.spec.ready_timeout)
            .await?;
        Ok(role)
    }

    /// The running processes of a kind, in start order: e.g. every echo worker.
    pub fn running(&self, kind: impl Fn(&Role) -> bool) -> Vec<Role> {
        self.procs
            .iter()
            .filter(|p| kind(&p.role))
            .map(|p| p.role.clone())
            .collect()
    }

    /// Where a running gate listens for WebSocket clients (a bus node: for NATS clients).
    pub fn listen_addr(&self, role: &Role) -> Option<SocketAddr> {
        self.procs.iter().find(|p| &p.role == role)?.listen
    }

    /// Sends `signal` to one running process and waits for it to exit, up to the spec's
    /// stop timeout, then kills it. The process is no longer part of the topology
    /// afterwards (nor of its teardown).
    pub async fn stop_one(&mut self, role: &Role, signal: Signal) -> anyhow::Result<Stopped> {
        let at = self
            .procs
            .iter()
            .position(|p| &p.role == role)
            .with_context(|| format!("{role} is not running"))?;
        let mut proc = self.procs.remove(at);
        let started = Instant::now();
        proc.signal(signal);
        let stopped = proc.stop(started + self.spec.stop_timeout).await;
        let took = started.elapsed();
        if let Err(why) = &stopped {
            tracing::warn!("{why}");
        }
        Ok(Stopped {
            role: proc.role.clone(),
            pid: proc.pid,
            took,
            status: stopped.clone().ok().flatten(),
            killed_after_timeout: stopped.is_err(),
        })
    }
}
