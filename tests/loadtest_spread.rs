//! The load tester past one process (`--procs`) and one source address
//! (`--source-addrs`), run as `shaddock loadtest` against a fleet it launches from this
//! package's `shaddock` binary: the load processes' figures add up to one report, and a
//! bad address is refused with its reason.

use std::process::{Command, Output};

use serde_json::Value;

/// `shaddock loadtest ARGS` to its end (it launches and stops its own fleet).
fn loadtest(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_shaddock"))
        .arg("loadtest")
        .args(args)
        .env("SHADDOCK_BIN", env!("CARGO_BIN_EXE_shaddock"))
        .output()
        .expect("running shaddock loadtest")
}

/// The run's JSON report, after checking it succeeded.
fn report(args: &[&str]) -> Value {
    let out = loadtest(&[args, &["--json", "-"]].concat());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{args:?} failed: {stderr}");
    serde_json::from_slice(&out.stdout).expect("a JSON report on stdout")
}

#[test]
fn idle_sessions_held_by_two_processes_over_two_addresses_add_up() {
    let run = report(&[
        "idle",
        "--gates",
        "2",
        "--sessions",
        "100",
        "--procs",
        "2",
        "--source-addrs",
        "127.0.0.1-127.0.0.2",
        "--hold",
        "0s",
    ]);
    assert_eq!(
        (run["procs"].as_u64(), run["gates"].as_u64()),
        (Some(2), Some(2))
    );
    assert_eq!(
        (run["opened"].as_u64(), run["failed"].as_u64()),
        (Some(100), Some(0))
    );
    assert!(run["handshakes_per_s"].as_f64().is_some_and(|r| r > 0.0));
}

#[test]
fn a_drained_gates_players_are_all_served_by_the_other() {
    let run = report(&[
        "idle",
        "--gates",
        "2",
        "--sessions",
        "40",
        "--procs",
        "2",
        "--drain",
        "--hold",
        "0s",
    ]);
    let drain = &run["drain"];
    assert_eq!(drain["players"].as_u64(), Some(40), "{run}");
    assert_eq!(drain["served_elsewhere"].as_u64(), Some(40), "{run}");
    assert_eq!(drain["lost"].as_u64(), Some(0), "{run}");
}

#[test]
fn a_room_whose_members_two_processes_hold_gets_every_message_there_and_on_the_bare_server() {
    let run = report(&[
        "broadcast",
        "--gates",
        "2",
        "--members",
        "20",
        "--messages",
        "10",
        "--rate",
        "50",
        "--procs",
        "2",
        "--source-addrs",
        "127.0.0.3-127.0.0.4",
        "--with-limit",
    ]);
    assert_eq!(run["deliveries"].as_u64(), Some(200), "{run}");
    assert_eq!(run["latency"]["count"].as_u64(), Some(200), "{run}");
    // The same room on the bare WebSocket server, first, in the same run.
    let limit = &run["limit"];
    assert_eq!(limit["deliveries"].as_u64(), Some(200), "{run}");
    assert_eq!(limit["latency"]["count"].as_u64(), Some(200), "{run}");
    assert_eq!(limit["gates"].as_u64(), Some(1), "{run}");
}

#[test]
fn a_bad_source_address_is_refused_with_its_reason() {
    for (addrs, why) in [
        ("192.0.2.1", "192.0.2.1 is not an address of this host"),
        ("127.0.0.9-127.0.0.1", "the range runs backwards"),
        ("127.0.1.0-127.0.2.0", "more than 256 source addresses"),
    ] {
        let out = loadtest(&["idle", "--sessions", "1", "--source-addrs", addrs]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success() && stderr.contains(why),
            "{addrs}: {stderr}"
        );
    }
    let out = loadtest(&["idle", "--procs", "65"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("65 is not in 1..=64"), "{stderr}");
}
