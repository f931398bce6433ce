//! What the root crate's process tests share: `shaddock up` started as a real process
//! on free ports.

use broker::testing::hostile::spawn_limited;
use testkit::Process;

/// Starts `shaddock up` with every port free-picked, at most `nofile` open files, and
/// `extra` flags; stopped when the returned handle drops.
pub fn up(nofile: u64, extra: &[&str]) -> Process {
    let mut args = vec![
        "up",
        "--broker-port=0",
        "--monitor-port=0",
        "--gate-port=0",
        "--metrics-port=0",
        // Tests run side by side: no two share the default data directory.
        "--store=memory",
    ];
    args.extend_from_slice(extra);
    spawn_limited(nofile, env!("CARGO_BIN_EXE_shaddock").as_ref(), &args)
}
