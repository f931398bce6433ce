//! The worker's side of the bus: connecting, the subjects requests arrive on, and
//! publishing answers.
//!
//! Subjects: a gate publishes a request for route `service.method` to
//! `<prefix>.svc.<service>.<method>` with a reply subject; the workers of a service all
//! subscribe `<prefix>.svc.<service>.>` in queue group `<service>`, so the bus hands each
//! request to exactly one of them, and adding a worker adds capacity.
//!
//! What workers publish besides answers (pushes to groups and players, a service's own
//! subjects) is in [`crate::push`]; answers and pushes both leave through
//! [`crate::Pusher`], one connection, so they keep their order.
//!
//! Credentials and TLS for the connection are [`BusSecurity`] ([`security`]); the
//! backoff between reconnect attempts and the lame-duck signal are in [`reconnect`].
//! A worker reaches its bus through a [`Client`]: async-nats over the network
//! ([`connect`]), or an embedded broker's in-process connection ([`connect_in_process`]).

mod client;
mod local;
mod reconnect;
mod security;

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use async_nats::{ConnectOptions, Event, ServerAddr};

#[cfg(test)]
pub(crate) use client::round_trip;
pub use client::{Client, Subscriber, Unsent};
pub use local::SUBSCRIPTION_CAPACITY;
pub use reconnect::{Backoff, Signals, signals};
pub use security::BusSecurity;

/// The subject a service's workers subscribe: every method of `service`.
pub fn service_subject(prefix: &str, service: &str) -> String {
    format!("{prefix}.svc.{service}.>")
}

/// The method a request on `subject` is for: what follows `<prefix>.svc.<service>.`
/// (`method_prefix`). Anything else, a subject with extra tokens included, names no
/// registered method and is answered 404.
pub(crate) fn method_of<'a>(subject: &'a str, method_prefix: &str) -> &'a str {
    subject.strip_prefix(method_prefix).unwrap_or(subject)
}

/// Connects to NATS at `urls` (failing over between them) as connection `name` (shown by
/// the server's monitoring, e.g. `shaddock-worker-chat`), with `security`'s credentials
/// and TLS.
///
/// The first connection is retried in the background: a worker may start before its
/// broker (compose, Kubernetes), and subscriptions made meanwhile take effect once it
/// connects. Reconnects are unlimited, with jittered exponential backoff between
/// attempts (docs/workers.md, "Reconnecting and lame duck"), and subscribe everything
/// again; the worker also learns of each connection made and of a server's lame-duck
/// notice. Only unparsable URLs and unreadable credential or certificate files fail here.
pub async fn connect(
    urls: &[String],
    name: &str,
    security: &BusSecurity,
) -> anyhow::Result<Client> {
    open(urls, name, security, First::InBackground).await
}

/// Connects to one of `urls` before returning, trying each once (the first few without
/// the backoff's delay, see [`Signals::hurry`]), or fails: a worker moving off a server
/// in lame duck mode wants a connection elsewhere now, not one retried for ever in the
/// background. Later reconnects are [`connect`]'s.
pub(crate) async fn connect_now(
    urls: &[String],
    name: &str,
    security: &BusSecurity,
) -> anyhow::Result<Client> {
    open(urls, name, security, First::Now).await
}

/// How the first connection is made.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum First {
    /// Retried in the background until it succeeds; the client is returned at once.
    InBackground,
    /// Each server tried once before returning.
    Now,
}

/// Connects to the broker `attach` reaches in process (an embedded broker's
/// `attacher`) as connection `name`; returns once the broker has taken it. No socket
/// and no protocol text: publishes and deliveries are calls ([`::bus`]'s direct link).
pub async fn connect_in_process(attach: ::bus::Attach, name: &str) -> anyhow::Result<Client> {
    Ok(Client::local(local::Local::connect(attach, name).await?))
}

/// The name of a worker's connections to the bus, shown by the server's monitoring.
pub fn worker_connection_name(service: &str) -> String {
    format!("shaddock-worker-{service}")
}

async fn open(
    urls: &[String],
    name: &str,
    security: &BusSecurity,
    first: First,
) -> anyhow::Result<Client> {
    let backoff = Backoff::default();
    let addrs = urls
        .iter()
        .map(|url| {
            url.parse::<ServerAddr>()
                .with_context(|| format!("invalid NATS URL {url:?}"))
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    anyhow::ensure!(!addrs.is_empty(), "no NATS URL given");
    let options = security.apply(ConnectOptions::new()).await?;
    let signal = Arc::new(Signals::default());
    if first == First::Now {
        // Wanted now: no backoff before the first attempts.
        signal.hurry();
    }
    let raised = signal.clone();
    let hurried = signal.clone();
    let options = match first {
        First::InBackground => options.retry_on_initial_connect(),
        First::Now => options,
    };
    let client = options
        .name(name)
        .max_reconnects(None)
        .reconnect_delay_callback(move |attempt| {
            if hurried.take_hurried_attempt() {
                Duration::ZERO
            } else {
                backoff.random_delay(attempt)
            }
        })
        .event_callback(move |event| {
            raised.raise(&event);
            async move { log_event(event) }
        })
        .connect(addrs)
        .await
        .with_context(|| format!("connecting to NATS at {}", urls.join(",")))?;
    reconnect::register(&client, signal);
    Ok(client.into())
}

/// Connection events are rare (connect, disconnect, errors): logged at info and warn.
fn log_event(event: Event) {
    match event {
        Event::Connected => tracing::info!("connected to NATS"),
        Event::Disconnected => tracing::warn!("disconnected from NATS; reconnecting"),
        Event::SlowConsumer(sid) => {
            tracing::warn!(sid, "NATS slow consumer: the client dropped messages")
        }
        Event::LameDuckMode => tracing::warn!("NATS server entering lame duck mode"),
        Event::ServerError(error) => tracing::warn!(%error, "NATS server error"),
        Event::ClientError(error) => tracing::warn!(%error, "NATS client error"),
        Event::Draining | Event::Closed => tracing::debug!(%event, "NATS connection"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn subjects_follow_the_protocol() {
        assert_eq!(service_subject("shaddock", "chat"), "shaddock.svc.chat.>");
    }

    #[test]
    fn method_is_what_follows_the_service() {
        let prefix = "shaddock.svc.echo.";
        assert_eq!(method_of("shaddock.svc.echo.echo", prefix), "echo");
        assert_eq!(method_of("shaddock.svc.echo.a.b", prefix), "a.b");
    }

    #[tokio::test]
    async fn connect_rejects_bad_urls() {
        let none = BusSecurity::default();
        assert!(connect(&[], "t", &none).await.is_err());
        assert!(
            connect(&["nats://[::1".to_string()], "t", &none)
                .await
                .is_err()
        );
    }
}
