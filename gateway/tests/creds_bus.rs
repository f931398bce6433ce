//! `--nats-creds` end to end: nats-server in operator mode (NATS decentralized JWT
//! auth) trusting an operator made by the test, with one account preloaded; the gate's
//! own bus connection and an echo worker (async-nats) log in with a `.creds` file of a
//! user of that account, read through `BusSecurity` as `shaddock gate` and
//! `shaddock worker` read it. A WebSocket client's echo request crossing them is the
//! proof; a user the server cannot trust is refused, and the gate says why.

mod common;

use std::path::PathBuf;
use std::sync::Arc;

use broker::testing::Bus;
use bus::BusOptions;
use common::jwt::{Account, Operator, creds};
use common::logs::Logs;
use common::{TestGate, start_worker_with, within};
use gateway::{AnyToken, Gate, GateConfig};
use proto::code;
use services::{BusSecurity, WorkerConfig};
use testkit::temp_file;

/// nats-server trusting `operator`, knowing only `account`.
async fn operator_mode(operator: &Operator, account: &Account) -> Bus {
    Bus::nats_server_with(&operator.server_config(&[account])).await
}

/// Security with the `.creds` file holding `text`.
fn with_creds(text: &str) -> (BusSecurity, PathBuf) {
    let path = temp_file("user.creds", text);
    let security = BusSecurity {
        nats_creds: Some(path.clone()),
        ..BusSecurity::default()
    };
    (security, path)
}

/// The gate's bus settings for `bus` with `security`'s credentials.
fn gate_bus(bus: &Bus, security: &BusSecurity) -> BusOptions {
    let mut options = BusOptions::new([bus.url()]);
    options.auth = security.credentials().unwrap();
    options
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gate_and_worker_log_in_with_a_creds_file() {
    let operator = Operator::new("shaddock-test");
    let account = operator.account("game");
    let bus = operator_mode(&operator, &account).await;
    let (security, path) = with_creds(&account.user("gate-and-worker").creds());
    let config = WorkerConfig {
        nats: vec![bus.url().to_owned()],
        security: security.clone(),
        ..WorkerConfig::default()
    };
    let _worker = start_worker_with(services::echo::service(), config).await;
    let gate = TestGate::start_on(
        gate_bus(&bus, &security),
        GateConfig::default(),
        Arc::new(AnyToken),
    )
    .await;
    let client = gate.client().await;
    let response = within(client.request("echo.raw", "with creds"))
        .await
        .unwrap();
    assert_eq!(response.code, code::OK, "{response:?}");
    assert_eq!(response.body, b"with creds".as_slice());
    let _ = std::fs::remove_file(path);
}

/// The gate never becomes ready with `creds_text`, and logs the server's refusal.
async fn gate_is_refused(bus: &Bus, creds_text: &str) {
    let (security, path) = with_creds(creds_text);
    let mut logs = Logs::listen();
    let options = gate_bus(bus, &security);
    let starting = tokio::spawn(Gate::new(
        options,
        GateConfig::default(),
        Arc::new(AnyToken),
    ));
    let line = logs
        .wait_for(&["cannot connect to the bus", bus.url()])
        .await;
    assert!(
        line.contains("refused: Authorization Violation"),
        "not the server's refusal: {line}"
    );
    assert!(!starting.is_finished(), "a refused gate became ready");
    starting.abort();
    let _ = std::fs::remove_file(path);
}

/// A user signed by another account than the one the server knows (the operator
/// signed both, but the server was given only the first).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_user_of_an_unknown_account_is_refused() {
    let operator = Operator::new("shaddock-test");
    let bus = operator_mode(&operator, &operator.account("game")).await;
    let other = operator.account("other");
    gate_is_refused(&bus, &other.user("intruder").creds()).await;
}

/// A valid user JWT with a seed that is not its user's: the nonce's signature fails.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_seed_that_does_not_match_the_jwt_is_refused() {
    let operator = Operator::new("shaddock-test");
    let account = operator.account("game");
    let bus = operator_mode(&operator, &account).await;
    let user = account.user("gate");
    let other = account.user("someone-else");
    gate_is_refused(&bus, &creds(&user.jwt, &other.seed())).await;
}
