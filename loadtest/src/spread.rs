//! Past one process's and one address's limits (docs/capacity.md): sockets bound to
//! several source addresses in turn (`--source-addrs`), and sessions spread over
//! `--procs` load processes, copies of this program ([`testkit::copies`]) given a share
//! and `--child`, that say READY then RESULT (JSON on stdout); one report for all.

use std::net::{IpAddr, Ipv4Addr};
use std::time::{SystemTime, UNIX_EPOCH};

use anyhow::Context as _;
use testkit::copies::Copies;

use crate::proc::{Threads, Watched};

/// Most load processes: each holds its open-file limit of sockets (20,000 here), so 64
/// reach past a million.
pub const MAX_PROCS: u32 = 64;
/// Most source addresses: a /24, each good for 28,232 ports (Linux's default), is 7 million.
pub const MAX_SOURCE_ADDRS: usize = 256;
/// The flags that spread a scenario's sessions over addresses and processes.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct SpreadArgs {
    /// Load processes holding the sessions, each a copy of this program holding its
    /// share within its own open-file limit; this one starts them and prints one report.
    #[arg(long, env = "SHADDOCK_LOADTEST_PROCS", default_value_t = 1,
          value_parser = clap::value_parser!(u32).range(1..=i64::from(MAX_PROCS)))]
    pub procs: u32,
    /// Local addresses client sockets are bound to, in turn: a range
    /// (`127.0.0.1-127.0.0.8`), a list, or both (`127.0.0.1,127.0.0.5-127.0.0.6`), each
    /// an address of this host. One address gives at most 28,232 sockets (Linux's
    /// default ephemeral ports); processes share addresses round-robin.
    #[arg(long, env = "SHADDOCK_LOADTEST_SOURCE_ADDRS", value_parser = SourceAddrs::parse)]
    pub source_addrs: Option<SourceAddrs>,
    /// Run as one of the processes `--procs` started (not for people).
    #[arg(long, hide = true)]
    pub child: bool,
}

impl SpreadArgs {
    /// The source address of this process's `k`-th socket, if any were given.
    pub fn source(&self, k: usize) -> Option<IpAddr> {
        let addrs = &self.source_addrs.as_ref()?.0;
        Some(addrs[k % addrs.len()])
    }

    /// The flags child `i` gets: `--source-addrs` its share of the addresses (every
    /// `procs`-th from the `i`-th, or the `i`-th round-robin when there are fewer), and
    /// `--child`.
    fn child_args(&self, i: usize) -> Vec<String> {
        let mut args = vec!["--child".to_owned()];
        if let Some(SourceAddrs(addrs)) = &self.source_addrs {
            let procs = self.procs as usize;
            let share: Vec<String> = match addrs.len() < procs {
                true => vec![addrs[i % addrs.len()].to_string()],
                false => (addrs.iter().skip(i).step_by(procs))
                    .map(IpAddr::to_string)
                    .collect(),
            };
            args.extend(["--source-addrs".to_owned(), share.join(",")]);
        }
        args
    }
}

/// Local addresses for client sockets, each checked to be one of this host's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SourceAddrs(pub Vec<IpAddr>);

impl SourceAddrs {
    /// `--source-addrs`: comma-separated addresses and IPv4 ranges `first-last`.
    pub fn parse(text: &str) -> Result<SourceAddrs, String> {
        let mut addrs = Vec::new();
        for item in text.split(',').map(str::trim) {
            let room = MAX_SOURCE_ADDRS.saturating_sub(addrs.len());
            let Some((first, last)) = item.split_once('-') else {
                addrs.push(item.parse().map_err(|e| format!("{item:?}: {e}"))?);
                continue;
            };
            let bound = |ip: &str| {
                ip.trim().parse::<Ipv4Addr>().map(u32::from).map_err(|e| {
                    format!("{item:?}: a range is two IPv4 addresses, first-last ({e})")
                })
            };
            let (first, last) = (bound(first)?, bound(last)?);
            ensure_str(first <= last, || {
                format!("{item:?}: the range runs backwards")
            })?;
            ensure_str(((last - first) as usize) < room, || {
                format!("{item:?}: more than {MAX_SOURCE_ADDRS} source addresses in all")
            })?;
            addrs.extend((first..=last).map(|ip| IpAddr::V4(ip.into())));
        }
        ensure_str(addrs.len() <= MAX_SOURCE_ADDRS, || {
            format!("more than {MAX_SOURCE_ADDRS} source addresses")
        })?;
        for ip in &addrs {
            std::net::UdpSocket::bind((*ip, 0))
                .map_err(|e| format!("{ip} is not an address of this host: {e}"))?;
        }
        Ok(SourceAddrs(addrs))
    }
}

fn ensure_str(ok: bool, why: impl FnOnce() -> String) -> Result<(), String> {
    if ok { Ok(()) } else { Err(why()) }
}

/// Load processes started by this one: copies of this program ([`testkit::copies`]).
pub struct Children(pub Copies);

impl Children {
    /// Starts `spread.procs` copies of this program running `subcommand` on the gates
    /// `urls` with `flags`, child `i` with its share of the `share` count flag (`i < n
    /// mod procs` get one more) and of `spread`'s flags.
    pub fn start(
        spread: &SpreadArgs,
        subcommand: &str,
        urls: &[String],
        (count_flag, count): (&str, u64),
        flags: Vec<String>,
    ) -> anyhow::Result<Self> {
        let exe = std::env::current_exe().context("finding this program")?;
        // `shaddock loadtest <subcommand>` or `shaddock-loadtest <subcommand>`.
        let prefix = exe.file_stem().filter(|name| *name == "shaddock");
        let prefix = prefix.map(|_| "loadtest");
        let (procs, urls) = (u64::from(spread.procs), urls.join(","));
        let copies = Copies::start(spread.procs as usize, |i| {
            let share = (count / procs + u64::from((i as u64) < count % procs)).to_string();
            let head = [subcommand, "--url", &urls, count_flag, &share];
            let head = prefix.into_iter().chain(head).map(str::to_owned);
            head.chain(flags.iter().cloned())
                .chain(spread.child_args(i))
                .collect()
        });
        Ok(Children(copies?))
    }

    /// Each child, as a process whose CPU a run reports.
    pub fn watched(&self) -> Vec<Watched> {
        let pids = self.0.pids().into_iter().enumerate();
        let child = |(i, pid)| Watched::new(format!("loadtest-{i}"), pid, Threads::All);
        pids.map(child).collect()
    }
}

/// Nanoseconds since the Unix epoch: the one clock the load processes share.
pub fn unix_nanos() -> u64 {
    let now = SystemTime::now().duration_since(UNIX_EPOCH);
    u64::try_from(now.unwrap_or_default().as_nanos()).unwrap_or(u64::MAX)
}

/// [`unix_nanos`] in milliseconds.
pub fn unix_ms() -> f64 {
    unix_nanos() as f64 / 1e6
}

/// `error` (a failed connect), with the open-file limit when that is what it hit.
pub fn explain(error: String) -> String {
    if !error.contains("os error 24") {
        return error;
    }
    let limit = net::nofile::raise().map_or_else(|e| e.to_string(), |l| l.now.to_string());
    format!(
        "{error} (this process's open-file limit is {limit}: spread the sessions over processes with --procs)"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn source_addrs_are_ranges_and_lists_of_this_hosts_addresses() {
        let ips = |text| SourceAddrs::parse(text).map(|a| a.0.len());
        assert_eq!(ips("127.0.0.1-127.0.0.8"), Ok(8));
        assert_eq!(ips("127.0.0.1, 127.0.0.5-127.0.0.6,::1"), Ok(4));
        let refused = |text| SourceAddrs::parse(text).unwrap_err();
        assert!(refused("127.0.0.8-127.0.0.1").contains("runs backwards"));
        assert!(refused("127.0.0.1-::1").contains("two IPv4 addresses"));
        assert!(refused("localhost").contains("invalid IP address"));
        assert!(refused("192.0.2.1").contains("192.0.2.1 is not an address of this host"));
        // The limit's edge: a /24's 256 addresses, not 257.
        assert_eq!(ips("127.0.1.0-127.0.1.255"), Ok(MAX_SOURCE_ADDRS));
        assert!(refused("127.0.1.0-127.0.2.0").contains("more than 256"));
        assert!(refused("127.0.2.1,127.0.1.0-127.0.1.255").contains("more than 256"));
    }

    #[test]
    fn children_share_the_addresses_round_robin() {
        let spread = |procs, text| SpreadArgs {
            procs,
            source_addrs: Some(SourceAddrs::parse(text).unwrap()),
            child: false,
        };
        let addrs = |s: &SpreadArgs, i| s.child_args(i)[2].clone();
        let four = spread(2, "127.0.0.1-127.0.0.4");
        assert_eq!(addrs(&four, 1), "127.0.0.2,127.0.0.4");
        let one = spread(3, "127.0.0.1-127.0.0.2");
        assert_eq!(addrs(&one, 2), "127.0.0.1");
        assert_eq!(one.source(3), Some("127.0.0.2".parse().unwrap()));
    }
}
