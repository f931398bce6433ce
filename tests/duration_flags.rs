//! Durations on the command line: one grammar (a number and a unit), and the gate's old
//! `-ms` flags kept as deprecated aliases that say so once.

mod common;

use std::process::Command;

fn shaddock(args: &[&str]) -> (bool, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_shaddock"))
        .args(args)
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[tokio::test]
async fn an_old_ms_flag_still_works_and_says_it_is_deprecated() {
    let mut up = common::up(4096, &["--heartbeat-ms", "2500"]);
    up.line("--heartbeat-ms is deprecated: use --heartbeat")
        .await;
    up.line("Server is ready").await;
}

#[test]
fn an_old_ms_flag_maps_onto_the_new_one_and_a_bare_number_is_refused() {
    // The alias's value is the new flag's: a bad one is refused under the new name.
    let (ok, err) = shaddock(&[
        "gate",
        "--nats",
        "nats://127.0.0.1:1",
        "--heartbeat-ms",
        "soon",
    ]);
    assert!(!ok);
    assert!(err.contains("'--heartbeat <HEARTBEAT>'"), "{err}");
    // A number without a unit could mean seconds or milliseconds: refused, saying so.
    let (ok, err) = shaddock(&["gate", "--nats", "nats://127.0.0.1:1", "--heartbeat", "10"]);
    assert!(!ok);
    assert!(err.contains("has no unit"), "{err}");
    let (ok, err) = shaddock(&["worker", "--service", "echo", "--tick-interval", "50"]);
    assert!(!ok);
    assert!(err.contains("has no unit"), "{err}");
}
