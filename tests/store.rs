//! Profiles that outlive their processes (docs/stores.md), with real processes: `shaddock
//! up` killed with SIGKILL and started again on the same data directory; a fleet on a
//! 3-node nats-server cluster with JetStream whose every profile worker is killed; and
//! the faults refused at start (a corrupt file, a second process on a data directory,
//! `--store nats-kv` on the embedded broker).

use std::path::Path;
use std::process::Command;

use nix::sys::signal::Signal;
use sdk::{Client, ClientOptions};
use testkit::fleet::{BrokerSpec, Role, Topology, TopologySpec, UP_FREE_PORTS};
use testkit::{Process, within, word_after};

const BIN: &str = env!("CARGO_BIN_EXE_shaddock");

/// `shaddock up` on free ports over the embedded store in `data`.
fn up(data: &Path) -> Process {
    let mut command = Command::new(BIN);
    command
        .arg("up")
        .args(UP_FREE_PORTS)
        .arg("--store=embedded")
        .arg("--data-dir")
        .arg(data)
        .env("RUST_LOG", "info");
    Process::spawn("shaddock up", command)
}

/// Waits for `up` to be ready; returns its WebSocket URL and NATS URL.
async fn ready(up: &mut Process) -> (String, String) {
    up.line("Server is ready").await;
    let ws = word_after(&up.line("WebSocket clients:").await, "WebSocket clients:").to_owned();
    let nats = word_after(&up.line("NATS:").await, "NATS:").to_owned();
    (ws, nats)
}

/// A JSON client of `ws`, logged in to chat as `name`; returns it and the login's body.
/// The login is asked again while the gate has not yet heard chat's message types: a
/// worker's announcement travels the bus on its own, so a gate may hear it a moment
/// after both have logged that they are ready (docs/gateway.md, "Typed bodies").
async fn login(ws: &str, name: &str) -> (Client, String) {
    let options = ClientOptions {
        json: true,
        ..ClientOptions::default()
    };
    let client = within(Client::connect(ws, options)).await.unwrap();
    let body = format!(r#"{{"name":"{name}"}}"#);
    let response = within(async {
        loop {
            let response = client.request("chat.login", body.clone()).await.unwrap();
            if !response.message.contains("no announced message types") {
                break response;
            }
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
    })
    .await;
    assert_eq!(response.code, 200, "{response:?}");
    (client, String::from_utf8_lossy(&response.body).into_owned())
}

/// Sets the client's profile, then checks both ways of reading it back.
async fn set_and_read(client: &Client) {
    let set = r##"{"display":"Ann the First","color":"#00ff7f"}"##;
    let response = within(client.request("profile.set", set)).await.unwrap();
    assert_eq!(response.code, 200, "{response:?}");
    assert_profile(&String::from_utf8_lossy(&response.body));
}

fn assert_profile(json: &str) {
    assert!(
        json.contains(r#""display":"Ann the First""#) && json.contains(r##""color":"#00ff7f""##),
        "{json}"
    );
}

/// What `profile.get` and `chat.login` answer for `name` on `ws`. The get is asked again
/// until answered 200 (new profile workers take their partitions after a heartbeat or
/// two: meanwhile a request may find none), before the login, whose call to the
/// profile service falls back to a default when it finds none.
async fn read_back(ws: &str, name: &str) {
    let (client, _) = login(ws, name).await;
    let got = within(async {
        loop {
            let got = client.request("profile.get", "{}").await.unwrap();
            if got.code == 200 {
                break got;
            }
        }
    })
    .await;
    assert_profile(&String::from_utf8_lossy(&got.body));
    let again = format!(r#"{{"name":"{name}"}}"#);
    let again = within(client.request("chat.login", again)).await.unwrap();
    assert_eq!(again.code, 200, "{again:?}");
    assert_profile(&String::from_utf8_lossy(&again.body));
    client.close().await;
}

#[tokio::test]
async fn up_keeps_profiles_through_a_sigkill() {
    let data = tempfile::tempdir().unwrap();
    let mut first = up(data.path());
    let (ws, _) = ready(&mut first).await;
    let (client, _) = login(&ws, "ann").await;
    set_and_read(&client).await;
    first.signal(Signal::SIGKILL);
    first.exit().await;

    let mut second = up(data.path());
    let (ws, _) = ready(&mut second).await;
    read_back(&ws, "ann").await;
}

#[tokio::test]
async fn a_fleet_on_jetstream_keeps_profiles_when_every_profile_worker_is_killed() {
    let spec = TopologySpec {
        broker: BrokerSpec::NatsCluster(3),
        jetstream: true,
        workers: vec![("chat".to_owned(), 1), ("profile".to_owned(), 2)],
        store_args: ["--store=nats-kv", "--store-replicas=3"]
            .map(String::from)
            .to_vec(),
        metrics: false,
        ..TopologySpec::default()
    };
    let mut fleet = Topology::start(spec).await.unwrap();
    let ws = fleet.gate_urls()[0].clone();
    let (client, _) = login(&ws, "ann").await;
    set_and_read(&client).await;
    client.close().await;

    let profile =
        |role: &Role| matches!(role, Role::Worker { service, .. } if service == "profile");
    for role in fleet.running(profile) {
        let mut killed = fleet.take(&role).unwrap();
        killed.signal(Signal::SIGKILL);
        killed.exit().await;
    }
    for _ in 0..2 {
        within(fleet.add_worker("profile")).await.unwrap();
    }
    read_back(&ws, "ann").await;
    fleet.shutdown().await.unwrap();
}

/// Without a store that outlives them (`--store=memory`), profiles survive their
/// worker's SIGKILL through its partitions' standbys alone: sixteen players spread over
/// the partitions (the killed worker owned some of them: 1 in 65,536 it owned none), each
/// set, then one of the two profile workers killed; every profile reads back.
#[tokio::test]
async fn profiles_survive_a_sigkill_of_their_worker_through_its_standby() {
    let spec = TopologySpec {
        workers: vec![("chat".to_owned(), 1), ("profile".to_owned(), 2)],
        store_args: vec!["--store=memory".to_owned()],
        metrics: false,
        ..TopologySpec::default()
    };
    let mut fleet = Topology::start(spec).await.unwrap();
    let ws = fleet.gate_urls()[0].clone();
    let names: Vec<String> = (0..16).map(|n| format!("ann{n}")).collect();
    for name in &names {
        let (client, _) = login(&ws, name).await;
        within(async {
            // The workers take their partitions a heartbeat or two after starting.
            while client.request("profile.get", "{}").await.unwrap().code != 200 {}
        })
        .await;
        set_and_read(&client).await;
        client.close().await;
    }
    let first = Role::Worker {
        service: "profile".into(),
        index: 0,
    };
    let mut killed = fleet.take(&first).unwrap();
    killed.signal(Signal::SIGKILL);
    killed.exit().await;
    for name in &names {
        read_back(&ws, name).await;
    }
    fleet.shutdown().await.unwrap();
}

/// A `shaddock ARGS` that must fail at start; returns its log.
async fn refused(args: &[&str], data: &Path) -> String {
    let mut command = Command::new(BIN);
    command
        .args(args)
        .arg("--data-dir")
        .arg(data)
        .env("RUST_LOG", "info");
    let mut process = Process::spawn("shaddock (refused)", command);
    let status = process.exit().await;
    assert!(!status.success(), "{status}: {}", process.log());
    process.log()
}

#[tokio::test]
async fn a_corrupt_store_file_is_refused_at_start_naming_it() {
    let data = tempfile::tempdir().unwrap();
    let file = data.path().join(services::store::FILE_NAME);
    std::fs::write(&file, b"not a database at all, just bytes").unwrap();
    let log = refused(
        &[
            "up",
            "--broker-port=0",
            "--monitor-port=0",
            "--gate-port=0",
            "--metrics-port=0",
        ],
        data.path(),
    )
    .await;
    assert!(
        log.contains(&format!("{} is not a Shaddock store", file.display())),
        "{log}"
    );
}

#[tokio::test]
async fn a_second_process_on_a_data_dir_and_nats_kv_on_the_embedded_broker_are_refused() {
    let data = tempfile::tempdir().unwrap();
    let mut holder = up(data.path());
    let (_, nats) = ready(&mut holder).await;
    let worker = ["worker", "--service", "profile", "--nats", &nats];

    let log = refused(&worker, data.path()).await;
    let file = data.path().join(services::store::FILE_NAME);
    assert!(
        log.contains(&format!("{} is in use by another process", file.display())),
        "{log}"
    );

    let other = tempfile::tempdir().unwrap();
    let mut on_kv = worker.to_vec();
    on_kv.extend(["--store", "nats-kv"]);
    let log = refused(&on_kv, other.path()).await;
    assert!(log.contains("this bus has no JetStream (the embedded broker does not implement it): use --store embedded or point --nats at nats-server with JetStream enabled"), "{log}");
}
