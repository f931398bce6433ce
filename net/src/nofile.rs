//! The open-file limit a server holds its connections in: read at start, raised from
//! the soft limit to the hard one where allowed, and logged, so that an operator sees
//! how many connections the process can hold before the first EMFILE.

use nix::sys::resource::{Resource, getrlimit, setrlimit};

/// The open-file limit before and after [`raise`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NofileLimit {
    /// The soft limit the process started with.
    pub was: u64,
    /// The soft limit now: the hard limit if raising it worked.
    pub now: u64,
    pub hard: u64,
}

/// Raises the soft open-file limit to the hard limit. An unprivileged process may do
/// this (the hard limit is the ceiling the administrator set); only the hard limit
/// needs `ulimit -n`, systemd's `LimitNOFILE` or docker's `--ulimit nofile=`.
pub fn raise() -> nix::Result<NofileLimit> {
    let (soft, hard) = getrlimit(Resource::RLIMIT_NOFILE)?;
    let mut now = soft;
    if soft < hard && setrlimit(Resource::RLIMIT_NOFILE, hard, hard).is_ok() {
        now = hard;
    }
    Ok(NofileLimit {
        was: soft,
        now,
        hard,
    })
}

/// [`raise`], then one log line saying what the process holds:
/// `open-file limit 1048576 (raised from 1024)`.
pub fn raise_and_log() {
    match raise() {
        Ok(limit) if limit.now != limit.was => tracing::info!(
            hard = limit.hard,
            "open-file limit {} (raised from {})",
            limit.now,
            limit.was
        ),
        Ok(limit) => tracing::info!(hard = limit.hard, "open-file limit {}", limit.now),
        Err(error) => tracing::warn!(%error, "reading the open-file limit failed"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn raising_leaves_the_soft_limit_at_the_hard_one() {
        let limit = raise().unwrap();
        assert!(limit.was <= limit.now);
        assert_eq!(
            getrlimit(Resource::RLIMIT_NOFILE).unwrap(),
            (limit.now, limit.hard)
        );
        assert_eq!(limit.now, limit.hard);
    }
}
