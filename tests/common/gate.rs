//! A gate served in-process on the test's runtime (for tests whose workers run beside
//! it), on 127.0.0.1:0; shut down when dropped.

#![allow(dead_code)] // not every test uses every part

use std::sync::Arc;

use bus::BusOptions;
use gateway::{AnyToken, Gate, GateConfig};
use sdk::{Client, ClientOptions};
use testkit::within;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

pub struct TestGate {
    pub gate: Gate,
    /// `ws://127.0.0.1:PORT`
    pub url: String,
    shutdown: CancellationToken,
}

impl TestGate {
    /// A gate on the bus at `nats_url` under `prefix`, accepting any token.
    pub async fn start(nats_url: &str, prefix: &str) -> TestGate {
        let options = BusOptions::new([nats_url]);
        let config = GateConfig {
            prefix: prefix.to_owned(),
            ..GateConfig::default()
        };
        let gate = within(Gate::new(options, config, Arc::new(AnyToken)))
            .await
            .unwrap();
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("ws://{}", listener.local_addr().unwrap());
        let shutdown = CancellationToken::new();
        let (serving, token) = (gate.clone(), shutdown.clone());
        tokio::spawn(async move { serving.run(listener, token).await });
        TestGate {
            gate,
            url,
            shutdown,
        }
    }

    /// A client of this gate, speaking JSON when `json`.
    pub async fn client(&self, json: bool) -> Client {
        let options = ClientOptions {
            json,
            ..ClientOptions::default()
        };
        within(Client::connect(&self.url, options)).await.unwrap()
    }
}

impl Drop for TestGate {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}
