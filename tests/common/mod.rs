//! What the root crate's process tests share: `shaddock up` started as a real process
//! on free ports.

use broker::testing::hostile::spawn_limited;
use testkit::Process;
use testkit::fleet::UP_FREE_PORTS;

/// Starts `shaddock up` with every port free-picked, at most `nofile` open files, and
/// `extra` flags; stopped when the returned handle drops.
pub fn up(nofile: u64, extra: &[&str]) -> Process {
    let mut args = vec!["up"];
    args.extend(UP_FREE_PORTS);
    // Tests run side by side: no two share the default data directory.
    args.push("--store=memory");
    args.extend_from_slice(extra);
    spawn_limited(nofile, env!("CARGO_BIN_EXE_shaddock").as_ref(), &args)
}
