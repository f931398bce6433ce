//! `pomelo-compare`: the same pomelo-protocol clients ([`Codec::Pomelo`]), route and
//! schedule against a Shaddock gate and a real pomelo server (scripts/pomelo-peer.sh:
//! pomelo 2.2.7, 1 connector + 1 echo server), in one run. A request counts as answered
//! when its response has neither the error flag nor an error `code` in its body.

use anyhow::{Context as _, ensure};

use super::generator::{Length, LoadSpec, Target};
use super::lean::Codec;
use super::report::{Runs, ScenarioReport};
use super::scenario::LoadArgs;
use super::schedule::Payload;
use super::target::{ServiceKind, TargetArgs, this_process, with_topology};
use crate::proc::LOADTEST;

/// Requests per client in the measured window unless told otherwise: the seed's.
const SEED_COUNT: u64 = 10_000;
/// The route requested on both unless told otherwise.
const ROUTE: &str = "echo.echoHandler.raw";

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
    /// JSON body of every request (the seed's 'Hello World').
    #[arg(long, default_value = r#"{"msg":"Hello World"}"#)]
    pub body: String,
    #[command(flatten)]
    pub target: TargetArgs,
    /// The load; without --duration or --count, 10,000 requests per client (the
    /// seed's); the route by default `echo.echoHandler.raw` (pomelo's
    /// `serverType.handler.method`: on Shaddock, service `echo`, method `raw`).
    #[command(flatten)]
    pub load: LoadArgs,
}

pub async fn pomelo_compare(args: PomeloCompareArgs) -> anyhow::Result<()> {
    let why = "the bare echo speaks no pomelo (--with-limit), and the body is --body";
    ensure!(!args.load.with_limit && args.load.body_hex.is_none(), why);
    serde_json::from_str::<serde_json::Value>(&args.body).context("--body is not JSON")?;
    let specs = (args.clients.iter())
        .map(|&clients| {
            let count = Length::Count(SEED_COUNT);
            let spec = args
                .load
                .spec(clients, args.load.interval, count, ServiceKind::Echo)?;
            Ok(LoadSpec {
                route: (args.load.route.clone()).unwrap_or_else(|| ROUTE.to_owned()),
                payload: Payload::Fixed(args.body.clone().into()),
                codec: Codec::Pomelo,
                ..spec
            })
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    let (gates, topology) = args.target.gates(1, 1).await?;
    let mut targets = vec![gates.target("shaddock")];
    targets[0].urls.truncate(1);
    let pomelo = |url: &String| {
        Target::new(
            "pomelo 2.2.7",
            "pomelo",
            vec![url.clone()],
            vec![this_process(LOADTEST)],
        )
    };
    targets.extend(args.pomelo_url.iter().map(pomelo));
    let work = async {
        let mut report =
            ScenarioReport::new("pomelo-compare", gates.setup.clone(), Runs::default());
        for spec in &specs {
            for target in &targets {
                let mut target = target.clone();
                target.label = format!("{}, {} clients", target.label, spec.clients);
                report.data.run(spec, &target).await;
            }
        }
        Ok(report)
    };
    let report = with_topology(topology, work).await?;
    report.finish(&args.load.output)
}
