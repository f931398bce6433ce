//! The worker's loop thread: one OS thread with a current-thread runtime that owns the
//! worker's bus I/O, and runs its frame loop between the I/O's turns
//! ([`frame_loop::drive`], which also starts the watchdog).

use std::sync::Arc;

use tokio::runtime::Runtime;
use tokio::sync::oneshot;
use tokio::task::JoinError;
use tokio_util::sync::CancellationToken;

use super::{Worker, WorkerError};
use crate::frame_loop;

/// Starts the loop thread of service `name`, which runs `body` with its runtime. Built
/// here, so a runtime that cannot be made is the caller's error.
pub(super) fn spawn(
    name: &str,
    body: impl FnOnce(&Arc<Runtime>) + Send + 'static,
) -> Result<(), WorkerError> {
    let rt = Arc::new(
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?,
    );
    let span = tracing::Span::current();
    std::thread::Builder::new()
        .name(format!("worker-{name}"))
        .spawn(move || {
            let _entered = span.enter();
            body(&rt);
        })?;
    Ok(())
}

/// What a caller gets when the loop thread ended without saying how: a handler panicked
/// outside the service's own catch, most likely.
pub(super) fn vanished(name: &str) -> WorkerError {
    WorkerError::Panicked(format!(
        "the loop thread of {name:?} ended without a result"
    ))
}

impl Worker {
    /// Serves on this (the loop) thread over `rt` until shutdown and the drain are done:
    /// the I/O as a task of `rt`, the frame loop driven between its turns.
    pub(super) fn serve_on(
        self,
        rt: &Arc<Runtime>,
        shutdown: CancellationToken,
    ) -> Result<(), WorkerError> {
        let name = self.service.name().to_owned();
        let stall = self.config.frames.handler_stall;
        let span = tracing::info_span!("worker", service = %name);
        let _entered = span.enter();
        let (frames_tx, frames) = oneshot::channel();
        let (stopped_tx, stopped) = oneshot::channel();
        let mut io = rt.spawn(self.serve(shutdown, frames_tx, stopped));
        let Ok(frame_loop) = rt.block_on(frames) else {
            return joined(rt.block_on(io));
        };
        let driven = frame_loop::drive(rt, &name, stall, frame_loop, &mut io)?;
        // The studio's summary beside worker_io_takeovers_total (each was logged).
        if driven.takeovers > 0 {
            tracing::info!(
                takeovers = driven.takeovers,
                "handlers overran --handler-stall"
            );
        }
        match driven.ended {
            Ok(_service) => {
                // The I/O's drain goes on from the loop's end: flush, and return.
                let _ = stopped_tx.send(Ok(()));
                joined(rt.block_on(io))
            }
            Err(ended) => joined(ended),
        }
    }
}

fn joined(io: Result<Result<(), WorkerError>, JoinError>) -> Result<(), WorkerError> {
    io.unwrap_or_else(|panicked| Err(WorkerError::Panicked(panicked.to_string())))
}
