//! Monitoring over HTTP, with the endpoints and field names of nats-server's so its
//! dashboards and scripts read ours: `/varz`, `/connz`, `/subsz`, `/healthz`, and
//! Prometheus text on `/metrics`.
//!
//! Figures are read from the server's counters when a page is asked for; nothing here
//! touches the message path.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::extract::{Query, State};
use axum::response::{IntoResponse, Json};
use axum::routing::get;
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusRecorder};
use net::{AcceptErrorKind, Acceptor};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::server::Server;
use crate::state::{Stats, VERSION};

/// Connections `/connz` lists when the request names no limit (nats-server's default).
pub const DEFAULT_CONNZ_LIMIT: usize = 1024;

struct Monitor {
    server: Server,
    /// A recorder of this server's own, so several servers in one process (tests)
    /// never mix their figures in a global one.
    recorder: PrometheusRecorder,
}

/// Serves the monitoring endpoints on `listener` until `shutdown` is cancelled.
pub async fn serve(
    listener: TcpListener,
    server: Server,
    shutdown: CancellationToken,
) -> std::io::Result<()> {
    let state = Arc::new(Monitor {
        server,
        recorder: PrometheusBuilder::new().build_recorder(),
    });
    let app = axum::Router::new()
        .route(
            "/",
            get(|| async {
                Json(json!({"endpoints": ["/varz", "/connz", "/subsz", "/healthz", "/metrics"]}))
            }),
        )
        .route("/varz", get(varz))
        .route("/connz", get(connz))
        .route("/subsz", get(subsz))
        .route("/healthz", get(|| async { Json(json!({"status": "ok"})) }))
        .route("/metrics", get(metrics))
        .with_state(state);
    axum::serve(Acceptor::new(listener, "monitor"), app)
        .with_graceful_shutdown(async move { shutdown.cancelled().await })
        .await
}

/// nats-server's duration format: `1d2h3m4s`.
fn uptime(d: Duration) -> String {
    let s = d.as_secs();
    let (days, h, m, sec) = (s / 86_400, s / 3600 % 24, s / 60 % 60, s % 60);
    let mut out = String::new();
    for (n, unit) in [(days, "d"), (h, "h"), (m, "m")] {
        if n > 0 || !out.is_empty() {
            out.push_str(&format!("{n}{unit}"));
        }
    }
    out.push_str(&format!("{sec}s"));
    out
}

/// Resident memory and CPU seconds of this process, from /proc where there is one.
fn process_usage() -> (u64, f64) {
    let rss = std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        })
        .map_or(0, |kb| kb * 1024);
    // Fields 14 and 15 of /proc/self/stat, after the parenthesised command name.
    let cpu_secs = std::fs::read_to_string("/proc/self/stat")
        .ok()
        .and_then(|s| {
            let rest = s.rsplit_once(')')?.1;
            let fields: Vec<&str> = rest.split_whitespace().collect();
            let ticks =
                fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?;
            // The kernel's USER_HZ is 100 on every Linux this runs on.
            Some(ticks as f64 / 100.0)
        })
        .unwrap_or(0.0);
    (rss, cpu_secs)
}

async fn varz(State(m): State<Arc<Monitor>>) -> impl IntoResponse {
    let s = &m.server.0;
    let st = &s.stats;
    let up = s.started_at.elapsed();
    let (mem, cpu_secs) = process_usage();
    let listen = s.listen.get();
    Json(json!({
        "server_id": s.id,
        "server_name": s.name,
        "version": VERSION,
        "proto": 1,
        "go": "rust",
        "host": listen.map(|a| a.ip().to_string()),
        "port": listen.map(|a| a.port()),
        "max_connections": s.config.max_connections,
        "max_payload": s.config.max_payload,
        "max_control_line": s.config.max_control_line,
        "max_pending": s.config.max_pending,
        "ping_interval": s.config.ping_interval.as_nanos() as u64,
        "ping_max": s.config.max_pings_out,
        "write_deadline": s.config.write_deadline.as_nanos() as u64,
        "auth_required": s.config.auth.required(),
        "tls_required": s.config.tls.is_some(),
        "tls_verify": s.config.tls.as_ref().is_some_and(|tls| tls.verify()),
        "tls_timeout": s.config.tls.as_ref().map_or(0.0, |tls| tls.timeout().as_secs_f64()),
        "start_unix": s.started.duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0),
        "uptime": uptime(up),
        "mem": mem,
        "cpu": if up.as_secs_f64() > 0.0 { 100.0 * cpu_secs / up.as_secs_f64() } else { 0.0 },
        "cores": std::thread::available_parallelism().map_or(1, |n| n.get()),
        "connections": s.clients().len(),
        "total_connections": Stats::get(&st.total_connections),
        "in_msgs": Stats::get(&st.in_msgs),
        "out_msgs": Stats::get(&st.out_msgs),
        "in_bytes": Stats::get(&st.in_bytes),
        "out_bytes": Stats::get(&st.out_bytes),
        "slow_consumers": Stats::get(&st.slow_consumers),
        "subscriptions": s.index.stats().subscriptions,
    }))
}

#[derive(Deserialize)]
struct ConnzQuery {
    limit: Option<usize>,
    offset: Option<usize>,
    sort: Option<String>,
    subs: Option<String>,
}

#[derive(Serialize)]
struct ConnInfo {
    cid: u64,
    ip: String,
    port: u16,
    uptime: String,
    pending_bytes: usize,
    in_msgs: u64,
    out_msgs: u64,
    in_bytes: u64,
    out_bytes: u64,
    subscriptions: usize,
    name: String,
    lang: String,
    version: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    subscriptions_list: Option<Vec<String>>,
}

async fn connz(State(m): State<Arc<Monitor>>, Query(q): Query<ConnzQuery>) -> impl IntoResponse {
    let s = &m.server.0;
    let with_subs = matches!(q.subs.as_deref(), Some("1" | "true" | "detail"));
    let now = SystemTime::now();
    let mut conns: Vec<ConnInfo> = s
        .clients()
        .iter()
        .map(|c| {
            let (pending_bytes, out_msgs, out_bytes) = c.out_stats();
            let meta = c.meta.lock().map(|m| m.clone()).unwrap_or_default();
            let subs = c
                .subs
                .lock()
                .map(|subs| {
                    subs.values()
                        .map(|s| String::from_utf8_lossy(&s.subject).into_owned())
                        .collect::<Vec<_>>()
                })
                .unwrap_or_default();
            ConnInfo {
                cid: c.cid,
                ip: c.addr.ip().to_string(),
                port: c.addr.port(),
                uptime: uptime(now.duration_since(c.started).unwrap_or_default()),
                pending_bytes,
                in_msgs: c.in_msgs.load(Ordering::Relaxed),
                out_msgs,
                in_bytes: c.in_bytes.load(Ordering::Relaxed),
                out_bytes,
                subscriptions: subs.len(),
                name: meta.name,
                lang: meta.lang,
                version: meta.version,
                subscriptions_list: with_subs.then_some(subs),
            }
        })
        .collect();
    let sort = q.sort.as_deref().unwrap_or("cid");
    match sort {
        "bytes_to" => conns.sort_by_key(|c| std::cmp::Reverse(c.out_bytes)),
        "bytes_from" => conns.sort_by_key(|c| std::cmp::Reverse(c.in_bytes)),
        "msgs_to" => conns.sort_by_key(|c| std::cmp::Reverse(c.out_msgs)),
        "msgs_from" => conns.sort_by_key(|c| std::cmp::Reverse(c.in_msgs)),
        "pending" => conns.sort_by_key(|c| std::cmp::Reverse(c.pending_bytes)),
        "subs" => conns.sort_by_key(|c| std::cmp::Reverse(c.subscriptions)),
        _ => conns.sort_by_key(|c| c.cid),
    }
    let total = conns.len();
    let offset = q.offset.unwrap_or(0).min(total);
    let limit = q.limit.unwrap_or(DEFAULT_CONNZ_LIMIT);
    let page: Vec<ConnInfo> = conns.into_iter().skip(offset).take(limit).collect();
    Json(json!({
        "server_id": s.id,
        "num_connections": page.len(),
        "total": total,
        "offset": offset,
        "limit": limit,
        "sort": sort,
        "connections": page,
    }))
}

#[derive(Deserialize)]
struct SubszQuery {
    test: Option<String>,
}

async fn subsz(State(m): State<Arc<Monitor>>, Query(q): Query<SubszQuery>) -> impl IntoResponse {
    let s = &m.server.0;
    let idx = s.index.stats();
    let hits = Stats::get(&s.stats.cache_hits);
    let misses = Stats::get(&s.stats.cache_misses);
    let lookups = hits + misses;
    let mut body = json!({
        "server_id": s.id,
        "num_subscriptions": idx.subscriptions,
        "num_inserts": idx.inserts,
        "num_removes": idx.removes,
        "num_matches": lookups,
        "num_trie_matches": idx.matches,
        "num_cache": Stats::get(&s.stats.cache_entries),
        "cache_hit_rate": if lookups > 0 { hits as f64 / lookups as f64 } else { 0.0 },
        "max_fanout": idx.max_fanout,
        "avg_fanout": idx.avg_fanout,
    });
    if let Some(subject) = q.test {
        let (_, found) = s.index.matches(subject.as_bytes());
        let list: Vec<Value> = found
            .psubs
            .iter()
            .chain(found.qsubs.iter().flat_map(|(_, members)| members.iter()))
            .map(|sub| {
                json!({
                    "subject": String::from_utf8_lossy(&sub.subject),
                    "qgroup": sub.queue.as_ref().map(|q| String::from_utf8_lossy(q).into_owned()),
                    "sid": String::from_utf8_lossy(&sub.sid),
                    "cid": sub.client.cid,
                })
            })
            .collect();
        body["test"] = json!(subject);
        body["total"] = json!(list.len());
        body["subscriptions_list"] = json!(list);
    }
    Json(body)
}

async fn metrics(State(m): State<Arc<Monitor>>) -> impl IntoResponse {
    let s = &m.server.0;
    let st = &s.stats;
    metrics::with_local_recorder(&m.recorder, || {
        for (name, counter) in [
            ("broker_in_msgs_total", &st.in_msgs),
            ("broker_out_msgs_total", &st.out_msgs),
            ("broker_in_bytes_total", &st.in_bytes),
            ("broker_out_bytes_total", &st.out_bytes),
            ("broker_slow_consumers_total", &st.slow_consumers),
            ("broker_connections_total", &st.total_connections),
        ] {
            metrics::counter!(name).absolute(Stats::get(counter));
        }
        for kind in AcceptErrorKind::ALL {
            metrics::counter!("broker_accept_errors_total", "kind" => kind.label())
                .absolute(s.accept_errors.get(kind));
        }
        metrics::counter!("broker_tls_handshake_failures_total").absolute(s.tls_failures.total());
        metrics::gauge!("broker_connections").set(s.clients().len() as f64);
        metrics::gauge!("broker_subscriptions").set(s.index.stats().subscriptions as f64);
    });
    m.recorder.handle().render()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uptime_reads_like_nats_server() {
        assert_eq!(uptime(Duration::from_secs(5)), "5s");
        assert_eq!(uptime(Duration::from_secs(3600 + 2)), "1h0m2s");
        assert_eq!(uptime(Duration::from_secs(2 * 86_400 + 61)), "2d0h1m1s");
    }
}
