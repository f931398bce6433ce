//! `pomelo-compare`: the same pomelo-protocol clients (the generator's, speaking the
//! gate's own pomelo codec, [`Codec::Pomelo`]), the same route and the same schedule,
//! against a Shaddock gate and against a real pomelo server (scripts/pomelo-peer.sh:
//! pomelo 2.2.7, 1 connector + 1 echo server, as the seed's comparison), in one run.
//! A request counts as answered when its response has neither the error flag nor an
//! error `code` in its body.

use std::time::Duration;

use anyhow::{Context as _, ensure};

use super::clock::ClockKind;
use super::generator::{Length, LoadSpec, Target};
use super::lean::Codec;
use super::report::{Runs, ScenarioReport};
use super::scenario::{MAX_CLIENTS, MIN_INTERVAL};
use super::schedule::Payload;
use super::target::{TargetArgs, this_process, with_topology};
use crate::report::OutputArgs;

/// `pomelo-compare`: the same pomelo client against the gate and a pomelo server.
#[derive(Debug, clap::Args)]
pub struct PomeloCompareArgs {
    /// Client counts, run in turn against each target.
    #[arg(long, value_delimiter = ',', default_values_t = [2usize, 50])]
    pub clients: Vec<usize>,
    /// The pomelo server's connector, `ws://host:port` (scripts/pomelo-peer.sh).
    /// Without it only the gate is measured.
    #[arg(long)]
    pub pomelo_url: Option<String>,
    /// Route requested on both: pomelo's `serverType.handler.method`; on Shaddock it
    /// is service `echo`, method `raw`, which answers the body unchanged.
    #[arg(long, default_value = "echo.echoHandler.raw")]
    pub route: String,
    /// JSON body of every request (the seed's 'Hello World').
    #[arg(long, default_value = r#"{"msg":"Hello World"}"#)]
    pub body: String,
    /// Time between one client's requests.
    #[arg(long, default_value = "1ms", value_parser = net::duration::parse)]
    pub interval: Duration,
    /// Requests per client in the measured window (the seed: 10,000).
    #[arg(long, default_value_t = 10_000,
          value_parser = clap::value_parser!(u64).range(1..=10_000_000))]
    pub count: u64,
    /// Sent before the window, not recorded.
    #[arg(long, default_value = "1s", value_parser = net::duration::parse)]
    pub warmup: Duration,
    /// A request with no answer after this long counts as a timeout.
    #[arg(long, default_value = "5s", value_parser = net::duration::parse)]
    pub timeout: Duration,
    #[command(flatten)]
    pub target: TargetArgs,
    #[command(flatten)]
    pub output: OutputArgs,
}

pub async fn pomelo_compare(args: PomeloCompareArgs) -> anyhow::Result<()> {
    ensure!(
        args.interval >= MIN_INTERVAL,
        "interval must be at least {MIN_INTERVAL:?}"
    );
    ensure!(
        args.clients.iter().all(|n| (1..=MAX_CLIENTS).contains(n)),
        "clients must be 1..={MAX_CLIENTS}"
    );
    serde_json::from_str::<serde_json::Value>(&args.body).context("--body is not JSON")?;
    let (gates, topology) = args.target.gates(1, 1).await?;
    let mut targets = vec![Target {
        label: "shaddock".to_owned(),
        kind: "gateway",
        urls: vec![gates.urls[0].clone()],
        tls: gates.tls.clone(),
        watched: gates.watched.clone(),
    }];
    targets.extend(args.pomelo_url.iter().map(|url| Target {
        label: "pomelo 2.2.7".to_owned(),
        kind: "pomelo",
        urls: vec![url.clone()],
        tls: None,
        watched: vec![this_process("loadtest")],
    }));
    let work = async {
        let mut report =
            ScenarioReport::new("pomelo-compare", gates.setup.clone(), Runs::default());
        for &clients in &args.clients {
            let spec = LoadSpec {
                clients,
                interval: args.interval,
                length: Length::Count(args.count),
                warmup: args.warmup,
                ramp: Duration::ZERO,
                timeout: args.timeout,
                route: args.route.clone(),
                payload: Payload::Fixed(args.body.clone().into()),
                codec: Codec::Pomelo,
                server_timing: false,
                clock: ClockKind::Auto,
                progress: !args.output.quiet,
            };
            for target in &targets {
                let target = Target {
                    label: format!("{}, {clients} clients", target.label),
                    ..target.clone()
                };
                report.data.run(&spec, &target).await;
            }
        }
        Ok(report)
    };
    with_topology(topology, work).await?.finish(&args.output)
}
