//! The request-load subcommands of docs/benchmarks.md "Gateway end to end": flags,
//! defaults and run order. Each builds one [`ScenarioReport`] and fails when a run had no
//! successful answer at all.

use std::time::Duration;

use anyhow::ensure;

use super::clock::ClockKind;
use super::generator::{self, Length, LoadSpec, RunReport, Target};
use super::lean::Codec;
use super::report::{Fraction, Runs, SaturateReport, SaturateStep, ScenarioReport, WorkerScaling};
use super::schedule::Payload;
use super::target::{LimitServer, ServiceKind, TargetArgs, plural, with_topology};
use crate::report::OutputArgs;

/// Most clients one run opens: each is a socket and a task here and a session on a gate.
const MAX_CLIENTS: usize = 10_000;
/// Shortest interval between two requests of one client (100,000 req/s per client).
const MIN_INTERVAL: Duration = Duration::from_micros(10);
/// Longest measured window, so a typo cannot start a day-long run.
const MAX_WINDOW: Duration = Duration::from_secs(3_600);

const LIMIT_SETUP: &str = "bare tokio-tungstenite WebSocket echo server in this process";
/// Default measured window of the duration-based scenarios.
const DEFAULT_DURATION: Duration = Duration::from_secs(10);
/// A step must achieve this share of its offered rate to pass in `saturate`.
const SATURATE_MIN_ACHIEVED: f64 = 0.95;

/// The load every request-sending scenario shares.
#[derive(Debug, Clone, clap::Args)]
pub struct LoadArgs {
    /// Time between two requests of one client (open loop: sent on schedule whether or
    /// not earlier answers came back).
    #[arg(long, default_value = "1ms", value_parser = net::duration::parse)]
    pub interval: Duration,
    /// Measured window (after the warm-up); the scenario's default when neither this
    /// nor --count is given.
    #[arg(long, value_parser = net::duration::parse, conflicts_with = "count")]
    pub duration: Option<Duration>,
    /// Measured requests per client, instead of a duration.
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..=10_000_000))]
    pub count: Option<u64>,
    /// Sent but not recorded, before the measured window.
    #[arg(long, default_value = "1s", value_parser = net::duration::parse)]
    pub warmup: Duration,
    /// Connections are opened spread over this long, before any request.
    #[arg(long, default_value = "1s", value_parser = net::duration::parse)]
    pub ramp: Duration,
    /// A request with no answer after this long counts as a timeout.
    #[arg(long, default_value = "5s", value_parser = net::duration::parse)]
    pub timeout: Duration,
    /// Route of every request. Default: `echo.raw` with a 16-32 byte body
    /// "Hello World #<seq>"; with `--service chat`, `chat.members` of room
    /// `hello-world` (a protobuf `MembersRequest`).
    #[arg(long)]
    pub route: Option<String>,
    /// Fixed body of every request, in hex (instead of the route's default body).
    #[arg(long, value_name = "HEX", value_parser = parse_hex)]
    pub body_hex: Option<bytes::Bytes>,
    /// What paces the clients: `thread` (an hrtimer thread, ~0.1 ms), `tokio` (tokio
    /// timers, 1 ms ticks) or `auto` (thread up to 20k req/s offered). See
    /// docs/benchmarks.md.
    #[arg(long, value_enum, default_value_t)]
    pub clock: ClockKind,
    /// First run the same load against a bare WebSocket echo server in this process
    /// (the machine's limit) and report what fraction of it the gateway reaches.
    #[arg(long)]
    pub with_limit: bool,
    #[command(flatten)]
    pub output: OutputArgs,
}

impl LoadArgs {
    /// One load per client count, each for the default duration unless told otherwise.
    fn specs(&self, clients: &[usize], service: ServiceKind) -> anyhow::Result<Vec<LoadSpec>> {
        let length = Length::Duration(DEFAULT_DURATION);
        let spec = |&n: &usize| self.spec(n, self.interval, length, service);
        clients.iter().map(spec).collect()
    }

    /// The load for `clients` clients of `service` at `interval`; `length` unless
    /// --duration or --count is given.
    pub fn spec(
        &self,
        clients: usize,
        interval: Duration,
        length: Length,
        service: ServiceKind,
    ) -> anyhow::Result<LoadSpec> {
        let (max, min) = (MAX_CLIENTS, MIN_INTERVAL);
        let why = format!("clients must be 1..={max} (not {clients}), the interval ≥ {min:?}");
        ensure!((1..=max).contains(&clients) && interval >= min, why);
        let length = match (self.duration, self.count) {
            (Some(d), _) => Length::Duration(d),
            (None, Some(n)) => Length::Count(n),
            (None, None) => length,
        };
        let route = self.route.as_deref().unwrap_or(service.default_route());
        let spec = LoadSpec {
            clients,
            interval,
            length,
            warmup: self.warmup,
            ramp: self.ramp,
            timeout: self.timeout,
            route: route.to_owned(),
            payload: match &self.body_hex {
                Some(bytes) => Payload::Fixed(bytes.clone()),
                None if self.route.is_some() => Payload::Hello,
                None => service.default_payload(),
            },
            codec: Codec::Protobuf,
            clock: self.clock,
            progress: !self.output.quiet,
        };
        let lengths = [spec.window(), self.warmup, self.ramp, self.timeout];
        let longest = lengths.into_iter().max();
        let max = MAX_WINDOW;
        let why = format!(
            "the measured window must be above zero; it, warm-up, ramp and timeout at most {max:?}"
        );
        ensure!(!spec.window().is_zero() && longest <= Some(MAX_WINDOW), why);
        Ok(spec)
    }
}

/// `concurrency`: one run per client count.
#[derive(Debug, clap::Args)]
pub struct ConcurrencyArgs {
    /// Client counts, run in turn.
    #[arg(long, value_delimiter = ',', default_values_t = [50usize, 100, 200])]
    pub clients: Vec<usize>,
    /// Also run each client count with JSON clients (typed bodies the gate transcodes)
    /// on the service's default route, right after the protobuf run: what transcoding
    /// costs, in one run. Not with --route or --body-hex.
    #[arg(long, conflicts_with_all = ["route", "body_hex"])]
    pub json_beside: bool,
    /// Also run each client count over `wss://` right after the plain run, against the
    /// same gates: what TLS costs the gate. The launched gates serve TLS on a second port,
    /// certified by a throwaway CA (made at launch, removed at the end) that the clients
    /// trust. Not with --url: for running gates, give their `wss://` URLs and --tls-ca.
    #[arg(long, conflicts_with = "url")]
    pub tls_beside: bool,
    #[command(flatten)]
    pub target: TargetArgs,
    #[command(flatten)]
    pub load: LoadArgs,
}

/// `limit`: the load against the bare WebSocket echo server only.
#[derive(Debug, clap::Args)]
pub struct LimitArgs {
    /// Client counts, run in turn.
    #[arg(long, value_delimiter = ',', default_values_t = [50usize, 100, 200])]
    pub clients: Vec<usize>,
    #[command(flatten)]
    pub load: LoadArgs,
}

/// `saturate`: the highest per-client rate whose p99 stays under a target.
#[derive(Debug, clap::Args)]
pub struct SaturateArgs {
    /// Clients, fixed; their rate is what rises.
    #[arg(long, default_value_t = 50)]
    pub clients: usize,
    /// Highest acceptable p99 latency from the schedule.
    #[arg(long, default_value = "5ms", value_parser = net::duration::parse)]
    pub p99_target: Duration,
    /// First per-client rate tried (requests per second).
    #[arg(long, default_value_t = 200.0)]
    pub start_rate: f64,
    /// Highest per-client rate tried on the gateway (the gate's own per-session limit is
    /// 5,000/s).
    #[arg(long, default_value_t = 5_000.0)]
    pub max_rate: f64,
    /// Highest per-client rate tried on the bare echo (`--with-limit`): it has no per-session
    /// limit, and a search stopped before it fails finds only a lower bound.
    #[arg(long, default_value_t = 20_000.0)]
    pub limit_max_rate: f64,
    /// Each passing step multiplies the rate by this.
    #[arg(long, default_value_t = 1.5)]
    pub factor: f64,
    /// Bisection steps between the last passing and the first failing rate.
    #[arg(long, default_value_t = 2)]
    pub refine: u32,
    /// Measured window of each step.
    #[arg(long, default_value = "3s", value_parser = net::duration::parse)]
    pub step: Duration,
    /// A step that misses the target is run again up to this many times before its
    /// rate counts as too high (0: one miss ends the climb).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(0..=5))]
    pub retries: u32,
    /// Search once per worker count (`1,2,3`), on a topology launched with that many
    /// workers: what each added worker raises the saturation by. Not with --workers, --url.
    #[arg(long, value_delimiter = ',', conflicts_with_all = ["workers", "url"],
          value_parser = clap::value_parser!(u32).range(1..=64))]
    pub scale_workers: Vec<u32>,
    #[command(flatten)]
    pub target: TargetArgs,
    #[command(flatten)]
    pub load: LoadArgs,
}

pub async fn concurrency(args: ConcurrencyArgs) -> anyhow::Result<()> {
    let service = args.target.service;
    let specs = args.load.specs(&args.clients, service)?;
    let tls = args.tls_beside;
    let (gates, topology) = args.target.launch(1, 1, &[service], tls).await?;
    let why = "the gates serve no wss://";
    ensure!(!args.tls_beside || !gates.tls_urls.is_empty(), why);
    let limit = args.load.with_limit.then(LimitServer::start).transpose()?;
    let work = async {
        let mut report = ScenarioReport::new("concurrency", gates.setup.clone(), Runs::default());
        for spec in &specs {
            let label = format!("{} clients", spec.clients);
            // The same load on the bare echo first; every gateway run is compared with it.
            let limit_run = match &limit {
                Some(server) => match report.data.run(spec, &server.target(&label)).await {
                    Some(run) => Some(run.clone()),
                    None => continue,
                },
                None => None,
            };
            let json = LoadSpec {
                codec: Codec::Json,
                payload: service.default_json_payload(),
                ..spec.clone()
            };
            let mut runs = vec![(label.clone(), spec, &gates.urls)];
            if args.json_beside {
                runs.push((format!("{label}, JSON"), &json, &gates.urls));
            }
            if args.tls_beside {
                runs.push((format!("{label}, wss"), spec, &gates.tls_urls));
            }
            for (name, spec, urls) in runs {
                let target = Target {
                    urls: urls.clone(),
                    ..gates.target(&name)
                };
                if let (Some(run), Some(limit)) = (report.data.run(spec, &target).await, &limit_run)
                {
                    run.compare_with_limit(limit);
                }
            }
        }
        Ok(report)
    };
    let report = with_topology(topology, work).await?;
    report.finish(&args.load.output)
}

pub async fn limit(args: LimitArgs) -> anyhow::Result<()> {
    let server = LimitServer::start()?;
    let mut report = ScenarioReport::new("limit", LIMIT_SETUP.to_owned(), Runs::default());
    for spec in args.load.specs(&args.clients, ServiceKind::Echo)? {
        let label = format!("{} clients", spec.clients);
        report.data.run(&spec, &server.target(&label)).await;
    }
    report.finish(&args.load.output)
}

pub async fn saturate(args: SaturateArgs) -> anyhow::Result<()> {
    ensure!(
        args.start_rate > 0.0
            && args.max_rate >= args.start_rate
            && args.limit_max_rate >= args.start_rate
            && args.factor > 1.0,
        "need 0 < --start-rate <= --max-rate, --limit-max-rate and --factor > 1"
    );
    let mut report = ScenarioReport::new("saturate", String::new(), Runs::default());
    let mut sat = SaturateReport {
        p99_target_us: args.p99_target.as_secs_f64() * 1e6,
        clients: args.clients,
        ..SaturateReport::default()
    };
    if let Some(server) = args.load.with_limit.then(LimitServer::start).transpose()? {
        let target = server.target("limit");
        search_into(&args, args.limit_max_rate, &target, &mut sat, &mut report).await?;
    }
    // One search on the topology the flags describe, or one per worker count.
    let mut counts: Vec<Option<u32>> = args.scale_workers.iter().copied().map(Some).collect();
    if counts.is_empty() {
        counts.push(None);
    }
    let mut setups = Vec::new();
    let mut missing = Vec::new();
    // The best gateway search: its rate, and whether it is a lower bound.
    let mut best_gateway: Option<(f64, bool)> = None;
    for workers in counts {
        let mut target_args = args.target.clone();
        target_args.launch.workers = workers.or(args.target.launch.workers);
        let (gates, topology) = target_args.gates(1, 1).await?;
        setups.push(gates.setup.clone());
        let name = match workers {
            Some(w) => format!("gateway, {w} worker{}", plural(w)),
            None => "gateway".to_owned(),
        };
        let target = gates.target(&name);
        let work = search_into(&args, args.max_rate, &target, &mut sat, &mut report);
        if !with_topology(topology, work).await? {
            missing.push(name.clone());
        }
        if let Some(best) = sat.best.get(&name)
            && best_gateway.is_none_or(|(rps, _)| best.achieved_rps > rps)
        {
            best_gateway = Some((best.achieved_rps, sat.at_max_rate.contains(&name)));
        }
        if let Some(workers) = workers {
            sat.scaling.push(WorkerScaling {
                workers,
                target: name,
            });
        }
    }
    report.setup = setups.join("; then ");
    let limit = sat.best.get("limit").map(|l| l.achieved_rps);
    if let (Some((gateway, gateway_bound)), Some(limit)) = (best_gateway, limit)
        && limit > 0.0
    {
        let limit_bound = sat.at_max_rate.iter().any(|t| t == "limit");
        sat.fraction_of_limit = Some(Fraction::of(gateway, gateway_bound, limit, limit_bound));
    }
    report.data.saturate = Some(sat);
    report.finish(&args.load.output)?;
    let (missing, rate) = (missing.join(", "), args.start_rate);
    let why = format!("no step met the target for {missing}, not even {rate} req/s per client");
    ensure!(missing.is_empty(), why);
    Ok(())
}

/// One search on `target`, filed under its label; whether any step met the target.
async fn search_into(
    args: &SaturateArgs,
    max_rate: f64,
    target: &Target,
    sat: &mut SaturateReport,
    report: &mut ScenarioReport,
) -> anyhow::Result<bool> {
    let measure = |rate| saturate_step(args, target, rate);
    let (best, at_max_rate) = search(args, max_rate, measure, &mut sat.steps).await?;
    if at_max_rate {
        sat.at_max_rate.push(target.label.clone());
    }
    let Some((step, run)) = best else {
        return Ok(false);
    };
    sat.best.insert(target.label.clone(), step);
    report.data.runs.push(run);
    Ok(true)
}

/// Raises the rate by `factor` while steps pass, then bisects between the last pass and
/// the first failure: the best step and its run, and whether every rate up to `max_rate`
/// passed (a lower bound). `measure` is generic so tests run it without a network.
async fn search<R, F, Fut>(
    args: &SaturateArgs,
    max_rate: f64,
    mut measure: F,
    steps: &mut Vec<SaturateStep>,
) -> anyhow::Result<(Option<(SaturateStep, R)>, bool)>
where
    F: FnMut(f64) -> Fut,
    Fut: Future<Output = anyhow::Result<(SaturateStep, R)>>,
{
    let mut best: Option<(SaturateStep, R)> = None;
    let mut failed_at = None;
    let mut rate = args.start_rate;
    while rate <= max_rate {
        let (step, run) = confirmed_step(args, &mut measure, rate, steps).await?;
        if !step.passed {
            failed_at = Some(rate);
            break;
        }
        best = Some((step, run));
        rate *= args.factor;
    }
    if let (Some((passed, _)), Some(failed)) = (&best, failed_at) {
        let (mut low, mut high) = (passed.per_client_rps, failed);
        for _ in 0..args.refine {
            let mid = (low + high) / 2.0;
            let (step, run) = confirmed_step(args, &mut measure, mid, steps).await?;
            if step.passed {
                low = mid;
                best = Some((step, run));
            } else {
                high = mid;
            }
        }
    }
    let at_max_rate = best.is_some() && failed_at.is_none();
    Ok((best, at_max_rate))
}

/// One rate: a step, then up to `--retries` more while it misses, so one stall of a
/// shared machine cannot end the search. Each goes into `steps`; the last decides.
async fn confirmed_step<R, Fut>(
    args: &SaturateArgs,
    measure: &mut impl FnMut(f64) -> Fut,
    per_client_rps: f64,
    steps: &mut Vec<SaturateStep>,
) -> anyhow::Result<(SaturateStep, R)>
where
    Fut: Future<Output = anyhow::Result<(SaturateStep, R)>>,
{
    for tries in 0.. {
        let (step, run) = measure(per_client_rps).await?;
        steps.push(step.clone());
        if step.passed || tries == args.retries {
            return Ok((step, run));
        }
    }
    unreachable!("tries never run out")
}

async fn saturate_step(
    args: &SaturateArgs,
    target: &Target,
    per_client_rps: f64,
) -> anyhow::Result<(SaturateStep, RunReport)> {
    let interval = Duration::from_secs_f64(1.0 / per_client_rps);
    let (length, service) = (Length::Duration(args.step), args.target.service);
    let spec = args.load.spec(args.clients, interval, length, service)?;
    let mut step_target = target.clone();
    step_target.label = format!("{} at {per_client_rps:.0}/s per client", target.label);
    let run = generator::run(&spec, &step_target).await?;
    let lost = run.lost();
    let errors = run.errors_by_code.values().sum::<u64>();
    let p99 = run.latency.from_schedule.p99_us;
    let passed = p99 <= args.p99_target.as_secs_f64() * 1e6
        && lost == 0
        && errors == 0
        && run.achieved_rps >= run.offered_rps * SATURATE_MIN_ACHIEVED;
    let step = SaturateStep {
        target: target.label.clone(),
        per_client_rps,
        offered_rps: run.offered_rps,
        achieved_rps: run.achieved_rps,
        p99_from_schedule_us: p99,
        lost,
        errors,
        passed,
    };
    Ok((step, run))
}

/// Parses `--body-hex`.
fn parse_hex(text: &str) -> Result<bytes::Bytes, String> {
    let text = text.trim();
    let pair = |i: usize| u8::from_str_radix(text.get(i..i + 2)?, 16).ok();
    let bytes: Option<Vec<u8>> = (0..text.len()).step_by(2).map(pair).collect();
    let bytes = bytes.filter(|_| text.len() % 2 == 0);
    let why = || format!("`{text}` is not an even number of hex digits");
    bytes.map(Into::into).ok_or_else(why)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hex_bodies() {
        assert_eq!(parse_hex("0a02").as_deref(), Ok(&[0x0a, 0x02][..]));
        assert_eq!(parse_hex("").as_deref(), Ok(&[][..]));
        assert!(parse_hex("0a0").is_err());
        assert!(parse_hex("zz").is_err());
        assert!(parse_hex("é0").is_err());
    }

    /// `flags` parsed as `T`'s, after `base`.
    fn parse<T: clap::Args>(base: &str, flags: &str) -> Result<T, clap::Error> {
        #[derive(clap::Parser)]
        struct Cli<T: clap::Args> {
            #[command(flatten)]
            args: T,
        }
        let argv = base.split(' ').chain(flags.split_whitespace());
        Ok(<Cli<T> as clap::Parser>::try_parse_from(argv)?.args)
    }

    fn saturate_args(flags: &str) -> SaturateArgs {
        let base = "saturate --start-rate 100 --max-rate 1000 --factor 2";
        parse(base, flags).expect("valid flags")
    }

    /// Searches up to `max_rate` with a fake measurement: a rate passes when
    /// `passes(rate, attempt)`, attempt counting from 0 per rate. Returns the best rate,
    /// whether it is a lower bound, and every (rate, passed) step in order.
    fn run_search(
        args: &SaturateArgs,
        max_rate: f64,
        passes: impl Fn(f64, usize) -> bool,
    ) -> (Option<f64>, bool, Vec<(f64, bool)>) {
        let mut attempts: Vec<f64> = Vec::new();
        let measure = |rate: f64| {
            let attempt = attempts.iter().filter(|r| **r == rate).count();
            attempts.push(rate);
            let step = SaturateStep::fake("fake", rate, passes(rate, attempt));
            async move { Ok((step, ())) }
        };
        let mut steps = Vec::new();
        let searched = futures::executor::block_on(search(args, max_rate, measure, &mut steps));
        let (best, at_max_rate) = searched.expect("a fake step cannot fail");
        let steps = steps.iter().map(|s| (s.per_client_rps, s.passed)).collect();
        (best.map(|(b, ())| b.per_client_rps), at_max_rate, steps)
    }

    #[test]
    fn json_beside_and_scale_workers_refuse_what_they_cannot_do() {
        let concurrency = |flags| parse::<ConcurrencyArgs>("concurrency", flags).is_ok();
        assert!(concurrency("--json-beside") && !concurrency("--json-beside --route echo.raw"));
        assert!(!concurrency("--json-beside --body-hex 00"));
        let saturate = |flags| parse::<SaturateArgs>("saturate", flags).is_ok();
        assert!(saturate("--scale-workers 1,2") && !saturate("--scale-workers 1 --url ws://a"));
    }

    #[test]
    fn the_search_climbs_then_bisects_and_confirms_each_miss() {
        let args = saturate_args("--refine 2");
        let (best, bound, steps) = run_search(&args, args.max_rate, |rate, _| rate <= 300.0);
        assert_eq!(best, Some(300.0));
        assert!(!bound);
        assert_eq!(
            steps,
            [
                (100.0, true),
                (200.0, true),
                (400.0, false),
                (400.0, false), // the one retry confirms the miss
                (300.0, true),
                (350.0, false),
                (350.0, false),
            ]
        );
    }

    #[test]
    fn one_stall_does_not_end_the_climb_unless_retries_are_off() {
        // The first attempt at 200 stalls; the retry passes.
        let stall = |rate: f64, attempt: usize| !(rate == 200.0 && attempt == 0);
        let args = saturate_args("--refine 0");
        let (best, bound, _) = run_search(&args, args.max_rate, stall);
        let every_rate = (Some(800.0), true);
        assert_eq!((best, bound), every_rate, "every rate to --max-rate");

        let args = saturate_args("--refine 0 --retries 0");
        let (best, bound, steps) = run_search(&args, args.max_rate, stall);
        assert_eq!((best, bound), (Some(100.0), false));
        assert_eq!(steps, [(100.0, true), (200.0, false)]);
    }

    #[test]
    fn nothing_passing_is_no_best() {
        let args = saturate_args("");
        let (best, bound, steps) = run_search(&args, args.max_rate, |_, _| false);
        assert_eq!((best, bound), (None, false));
        assert_eq!(steps, [(100.0, false), (100.0, false)]);
    }
}
