//! A host: one OS thread with a current-thread runtime that owns the bus I/O of the
//! workers it serves and runs their frame loops between the I/O's turns
//! ([`frame_loop::host`], with its watchdog). A worker started alone gets a host of its
//! own; `shaddock up` serves every in-process worker, and its gate, on one, so a
//! request there is read, forwarded, handled, answered and written on one thread.
//!
//! Anything else may run on a host as a task of its runtime ([`Host::runtime`]): it is
//! driven while the loops wait, and by the watchdog while a step overruns.

use std::sync::Arc;
use std::time::Duration;

use tokio::runtime::Handle;
use tokio::sync::{mpsc, oneshot};
use tokio::task::{JoinError, JoinHandle};
use tokio_util::sync::CancellationToken;
use tracing::Instrument as _;

use super::output::Output;
use super::{Worker, WorkerError};
use crate::frame_loop::{self, Ended, Finish, Guest, Watchdog};

/// A worker's I/O task, which ends its loop early if it ends first.
type Io = JoinHandle<Result<(), WorkerError>>;

/// A running host's handle: cheap to clone. The host's thread ends once every clone is
/// dropped and every worker it serves has stopped.
#[derive(Clone)]
pub struct Host {
    runtime: Handle,
    arrivals: mpsc::UnboundedSender<Guest<Output, Io>>,
}

impl std::fmt::Debug for Host {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Host").finish_non_exhaustive()
    }
}

impl Host {
    /// Starts host `name` (its threads are `host-<name>` and `watchdog-<name>`), whose
    /// handlers have `stall` to return before the watchdog drives the I/O
    /// (`--handler-stall`).
    pub fn spawn(name: &str, stall: Duration) -> Result<Host, WorkerError> {
        let rt = Arc::new(
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?,
        );
        let watchdog = Watchdog::start(&rt, name, stall)?;
        // Unbounded, yet bounded by construction: one arrival per worker started on it.
        let (arrivals, arriving) = mpsc::unbounded_channel();
        let runtime = rt.handle().clone();
        let span = tracing::Span::current();
        std::thread::Builder::new()
            .name(format!("host-{name}"))
            .spawn(move || {
                let _entered = span.enter();
                let takeovers = frame_loop::host(&rt, watchdog, arriving);
                // The studio's summary beside worker_io_takeovers_total (each was logged).
                if takeovers > 0 {
                    tracing::info!(takeovers, "handlers overran --handler-stall");
                }
            })?;
        Ok(Host { runtime, arrivals })
    }

    /// The host's runtime: a task spawned on it runs on the host's thread.
    pub fn runtime(&self) -> &Handle {
        &self.runtime
    }

    /// Serves `worker` on this host until `shutdown` fires and its drain is done; the
    /// result comes on the returned channel (dropped unsent if the host is gone).
    pub(super) fn serve(
        &self,
        worker: Worker,
        shutdown: CancellationToken,
    ) -> oneshot::Receiver<Result<(), WorkerError>> {
        let (done_tx, done) = oneshot::channel();
        let arrivals = self.arrivals.clone();
        let name = worker.service.name().to_owned();
        let span = tracing::info_span!("worker", service = %name);
        self.runtime.spawn(async move {
            let (frames_tx, frames) = oneshot::channel();
            let (stopped_tx, stopped) = oneshot::channel();
            let io = tokio::spawn(
                worker
                    .serve(shutdown, frames_tx, stopped)
                    .instrument(span.clone()),
            );
            let Ok(frame_loop) = frames.await else {
                let _ = done_tx.send(joined(io.await));
                return;
            };
            let ended = move |ended: Ended<Io>| match ended {
                Ended::Done(io) => {
                    // The I/O's drain goes on from the loop's end: flush, and return.
                    let _ = stopped_tx.send(Ok(()));
                    let finish: Finish = Box::pin(async move {
                        let _ = done_tx.send(joined(io.await));
                    });
                    Some(finish)
                }
                Ended::Stopped(io) => {
                    let _ = done_tx.send(joined(io));
                    None
                }
            };
            // A host that is gone drops the guest, and with it `done`: the caller hears
            // that the worker vanished.
            let _ = arrivals.send(Guest {
                name,
                span,
                frame_loop,
                stop: io,
                ended: Box::new(ended),
            });
        });
        done
    }
}

/// What a caller gets when the host ended without saying how: a handler panicked
/// outside the service's own catch, most likely.
pub(super) fn vanished(name: &str) -> WorkerError {
    WorkerError::Panicked(format!("the host of {name:?} ended without its result"))
}

fn joined(io: Result<Result<(), WorkerError>, JoinError>) -> Result<(), WorkerError> {
    io.unwrap_or_else(|panicked| Err(WorkerError::Panicked(panicked.to_string())))
}
