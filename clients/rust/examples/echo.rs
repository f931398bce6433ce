//! Sends one `echo.echo` request through a gate and prints the answer and the round
//! trip: the smallest use of the client SDK.
//!
//! ```text
//! cargo run -p shaddock-sdk --example echo -- [ws://127.0.0.1:3250] [message]
//! ```

use std::time::Instant;

use anyhow::{Context, bail};
use proto::Message as _;
use proto::echo::{EchoRequest, EchoResponse};
use sdk::{Client, ClientOptions};

/// The gate's default listen address.
const DEFAULT_URL: &str = "ws://127.0.0.1:3250";

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let mut args = std::env::args().skip(1);
    let url = args.next().unwrap_or_else(|| DEFAULT_URL.to_owned());
    let message = args.next().unwrap_or_else(|| "hello".to_owned());

    let client = Client::connect(&url, ClientOptions::default())
        .await
        .with_context(|| format!("connecting to {url}"))?;
    let request = EchoRequest {
        body: message.into_bytes().into(),
    };

    let started = Instant::now();
    let response = client
        .request("echo.echo", request.encode_to_vec())
        .await
        .context("echo.echo")?;
    let rtt = started.elapsed();

    if response.code != proto::code::OK {
        bail!("echo.echo answered {}: {}", response.code, response.message);
    }
    let echo = EchoResponse::decode(response.body).context("decoding the EchoResponse")?;
    println!("echo: {}", String::from_utf8_lossy(&echo.body));
    println!("round trip: {rtt:?} (session {})", client.session_id());
    client.close().await;
    Ok(())
}
