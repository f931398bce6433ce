//! The JetStream key-value backend (`--store nats-kv`, docs/stores.md, "JetStream
//! key-value"): one bucket on the nats-server the worker connects to, created if absent
//! with `--store-replicas` copies and one value per key (no history).
//!
//! A write resolves when JetStream has acknowledged it: stored on a majority of the
//! bucket's replicas. Writes to one key in a batch go one after another (each waits for
//! the last's acknowledgement), writes to different keys together. A load reads the
//! latest value of every key under a prefix through an ephemeral consumer.

use std::collections::HashMap;
use std::time::Duration;

use async_nats::jetstream::consumer::{AckPolicy, DeliverPolicy, pull};
use async_nats::jetstream::{self, kv};
use futures::StreamExt as _;

use super::{Entry, StoreError, Write, Written};

/// What a worker told to use JetStream on a bus without it hears, at start.
pub(super) const NO_JETSTREAM: &str = "this bus has no JetStream (the embedded broker does not implement it): use --store embedded or point --nats at nats-server with JetStream enabled";
/// The pause between two attempts to open the bucket while JetStream is not ready.
const OPEN_RETRY: Duration = Duration::from_millis(250);
/// How long a load's consumer outlives a load that stopped midway (the worker died).
const LOAD_CONSUMER_IDLE: Duration = Duration::from_secs(30);
/// Keys a load takes per round trip.
const LOAD_BATCH: usize = 1_000;

/// Why opening failed: for good, or for now.
enum Retry {
    Never(anyhow::Error),
    Later(anyhow::Error),
}

pub(super) struct NatsKv {
    kv: kv::Store,
}

fn unavailable(error: impl std::fmt::Display) -> StoreError {
    StoreError::Unavailable(format!("JetStream: {error}"))
}

impl NatsKv {
    /// Opens `bucket`, creating it with `replicas` copies if absent. A bus that does not
    /// answer JetStream's API (no responders) is refused at once with [`NO_JETSTREAM`];
    /// one whose JetStream does not answer yet (a cluster electing its leader, as it
    /// does for seconds after it starts) is asked again until `wait` has passed.
    pub async fn open(
        client: async_nats::Client,
        bucket: &str,
        replicas: usize,
        wait: Duration,
    ) -> anyhow::Result<NatsKv> {
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            match NatsKv::try_open(&client, bucket, replicas).await {
                Ok(kv) => return Ok(kv),
                Err(Retry::Never(error)) => return Err(error),
                Err(Retry::Later(error)) if tokio::time::Instant::now() < deadline => {
                    tracing::info!(%error, "JetStream not ready: asking again");
                    tokio::time::sleep(OPEN_RETRY).await;
                }
                Err(Retry::Later(error)) => {
                    anyhow::bail!("JetStream not ready after {wait:?} (--store-wait): {error:#}")
                }
            }
        }
    }

    async fn try_open(
        client: &async_nats::Client,
        bucket: &str,
        replicas: usize,
    ) -> Result<NatsKv, Retry> {
        // The API's own info request: nobody answers it on a bus without JetStream.
        match client.request("$JS.API.INFO", Default::default()).await {
            Err(error) if error.kind() == async_nats::RequestErrorKind::NoResponders => {
                return Err(Retry::Never(anyhow::anyhow!("{NO_JETSTREAM}")));
            }
            Err(error) => return Err(Retry::Later(error.into())),
            Ok(_) => {}
        }
        let js = jetstream::new(client.clone());
        if let Ok(kv) = js.get_key_value(bucket).await {
            return Ok(NatsKv { kv });
        }
        let config = kv::Config {
            bucket: bucket.to_owned(),
            history: 1,
            num_replicas: replicas.max(1),
            ..kv::Config::default()
        };
        match js.create_key_value(config).await {
            Ok(kv) => Ok(NatsKv { kv }),
            Err(error) => Err(Retry::Later(anyhow::anyhow!(
                "creating the key-value bucket {bucket:?}: {error}"
            ))),
        }
    }

    pub async fn commit(&self, writes: Vec<Write>) -> Vec<Written> {
        let count = writes.len();
        // Each key's writes in order, as a chain; the chains run together.
        let mut chains: Vec<Vec<(usize, Write)>> = Vec::new();
        let mut chain_of: HashMap<String, usize> = HashMap::new();
        for (index, write) in writes.into_iter().enumerate() {
            let next = chains.len();
            let chain = *chain_of.entry(write.key.clone()).or_insert(next);
            if chain == next {
                chains.push(Vec::new());
            }
            chains[chain].push((index, write));
        }
        let done = futures::future::join_all(chains.into_iter().map(|chain| async move {
            let mut results = Vec::with_capacity(chain.len());
            for (index, write) in chain {
                results.push((index, self.write(write).await));
            }
            results
        }))
        .await;
        let mut results = vec![Err(unavailable("no result")); count];
        for (index, result) in done.into_iter().flatten() {
            results[index] = result;
        }
        results
    }

    async fn write(&self, write: Write) -> Written {
        let Write { key, value, expect } = write;
        let conflict = |found| StoreError::Conflict {
            key: key.clone(),
            found,
        };
        match expect {
            None => self.kv.put(&key, value).await.map_err(unavailable),
            Some(None) => self.kv.create(&key, value).await.map_err(|error| {
                if error.kind() == kv::CreateErrorKind::AlreadyExists {
                    conflict(None)
                } else {
                    unavailable(error)
                }
            }),
            Some(Some(revision)) => self
                .kv
                .update(&key, value, revision)
                .await
                .map_err(|error| match error.kind() {
                    kv::UpdateErrorKind::WrongLastRevision => conflict(Some(revision)),
                    _ => unavailable(error),
                }),
        }
    }

    pub async fn get(&self, key: &str) -> Result<Option<Entry>, StoreError> {
        let entry = self.kv.entry(key).await.map_err(unavailable)?;
        Ok(entry
            .filter(|entry| entry.operation == kv::Operation::Put)
            .map(|entry| Entry {
                value: entry.value,
                revision: entry.revision,
            }))
    }

    /// The latest entry of every key under `prefix`: an ephemeral consumer on the
    /// bucket's stream, filtered to the prefix, last message per subject; deletions
    /// are skipped.
    pub async fn load(&self, prefix: &str) -> Result<Vec<(String, Entry)>, StoreError> {
        let config = pull::Config {
            filter_subject: format!("{}{prefix}>", self.kv.prefix),
            deliver_policy: DeliverPolicy::LastPerSubject,
            ack_policy: AckPolicy::None,
            inactive_threshold: LOAD_CONSUMER_IDLE,
            ..pull::Config::default()
        };
        let consumer = self
            .kv
            .stream
            .create_consumer(config)
            .await
            .map_err(unavailable)?;
        let (name, pending) = {
            let info = consumer.cached_info();
            (info.name.clone(), info.num_pending)
        };
        let mut found = Vec::new();
        if pending > 0 {
            let mut messages = consumer
                .stream()
                .max_messages_per_batch(LOAD_BATCH)
                .messages()
                .await
                .map_err(unavailable)?;
            for _ in 0..pending {
                let message = messages
                    .next()
                    .await
                    .ok_or_else(|| unavailable("a load's consumer ended early"))?
                    .map_err(unavailable)?;
                let deleted = message
                    .headers
                    .as_ref()
                    .and_then(|headers| headers.get("KV-Operation"))
                    .is_some_and(|op| op.as_str() != "PUT");
                let revision = message.info().map_err(unavailable)?.stream_sequence;
                let Some(key) = message.subject.strip_prefix(self.kv.prefix.as_str()) else {
                    continue;
                };
                if !deleted {
                    let entry = Entry {
                        value: message.payload.clone(),
                        revision,
                    };
                    found.push((key.to_owned(), entry));
                }
            }
        }
        // Its idle timeout removes it anyway; this spares the server the wait.
        let _ = self.kv.stream.delete_consumer(&name).await;
        Ok(found)
    }
}
