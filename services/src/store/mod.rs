//! Where services keep player data that outlives their processes (docs/stores.md): a
//! key-value store behind a small handle, [`Store`], with get, put, compare-and-set per
//! key, and a load of every key under a prefix (a keyed service's partition).
//!
//! Backends ([`StoreKind`]): an embedded file ([`embedded`], redb) for `shaddock up` and
//! one box, the default; JetStream key-value on nats-server ([`nats_kv`]) for a fleet;
//! memory, for tests.
//!
//! Writes (puts and compare-and-sets) queue, bounded ([`StoreConfig::store_queue`]),
//! for one writer task that commits what has gathered while the last commit ran as one
//! transaction (group commit): one fsync carries many writes, so many players' sets
//! cost about what one does. A write is queued when [`Store::put`] is called, not when
//! its future is first polled, so writes to a key land in the order they were asked.
//! Reads go to the backend directly.

mod embedded;
mod memory;
mod nats_kv;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures::FutureExt as _;
use futures::future::BoxFuture;
use tokio::sync::{mpsc, oneshot};

pub use embedded::FILE_NAME;

use crate::bus::BusSecurity;

/// Where `--data-dir` points when not given: beside the process, created on demand.
pub const DEFAULT_DATA_DIR: &str = "./shaddock-data";
/// The JetStream key-value bucket `--store nats-kv` keeps its keys in.
pub const DEFAULT_BUCKET: &str = "shaddock";
/// Copies of each key JetStream keeps: 1 for one nats-server; a cluster wants 3.
pub const DEFAULT_REPLICAS: usize = 1;
/// How long `--store nats-kv` waits for JetStream at start.
pub const DEFAULT_WAIT: Duration = Duration::from_secs(30);
/// Writes that may wait for the writer: past it a write fails at once (a 503 for the
/// player), rather than piling up behind a slow disk.
pub const DEFAULT_QUEUE: usize = 8_192;
/// Most writes committed in one transaction.
pub const DEFAULT_BATCH: usize = 1_024;

/// Which backend keeps the data.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum StoreKind {
    /// A file under `--data-dir` (redb, fsync on every commit).
    Embedded,
    /// JetStream key-value on the nats-server the worker connects to.
    NatsKv,
    /// In memory, lost at exit: for tests.
    Memory,
}

/// The store's flags, shared by `shaddock up` and `shaddock worker`.
#[derive(Debug, Clone, clap::Args)]
pub struct StoreConfig {
    /// Where services that keep player data (profile) keep it: `embedded` (a file under
    /// --data-dir), `nats-kv` (JetStream key-value on the nats-server of --nats; not on
    /// the embedded broker, which has no JetStream), or `memory` (lost at exit: tests).
    #[arg(long = "store", value_enum, env = "SHADDOCK_STORE", default_value_t = StoreKind::Embedded)]
    pub kind: StoreKind,
    /// The directory of the embedded store's file (`shaddock.redb`), created if absent.
    /// One process at a time: a second one on the same directory is refused at start.
    #[arg(long, env = "SHADDOCK_DATA_DIR", default_value = DEFAULT_DATA_DIR)]
    pub data_dir: PathBuf,
    /// The JetStream key-value bucket of `--store nats-kv` (created if absent).
    #[arg(long, env = "SHADDOCK_STORE_BUCKET", default_value = DEFAULT_BUCKET)]
    pub store_bucket: String,
    /// Replicas of the bucket when this worker creates it (3 on a 3-node cluster).
    #[arg(long, env = "SHADDOCK_STORE_REPLICAS", default_value_t = DEFAULT_REPLICAS)]
    pub store_replicas: usize,
    /// How long a worker starting with `--store nats-kv` waits for JetStream to answer
    /// (a cluster elects its leader for seconds after it starts) before it gives up.
    #[arg(long, env = "SHADDOCK_STORE_WAIT", default_value = "30s", value_parser = net::duration::parse)]
    pub store_wait: Duration,
    /// Writes that may wait for the store; past it a write is answered 503 at once.
    #[arg(long, env = "SHADDOCK_STORE_QUEUE", default_value_t = DEFAULT_QUEUE)]
    pub store_queue: usize,
    /// Most writes committed together in one transaction.
    #[arg(long, env = "SHADDOCK_STORE_BATCH", default_value_t = DEFAULT_BATCH)]
    pub store_batch: usize,
}

impl Default for StoreConfig {
    fn default() -> Self {
        StoreConfig {
            kind: StoreKind::Embedded,
            data_dir: DEFAULT_DATA_DIR.into(),
            store_bucket: DEFAULT_BUCKET.into(),
            store_replicas: DEFAULT_REPLICAS,
            store_wait: DEFAULT_WAIT,
            store_queue: DEFAULT_QUEUE,
            store_batch: DEFAULT_BATCH,
        }
    }
}

/// A value and its revision: it grows with every write of the key (a JetStream KV
/// revision is the stream's sequence, an embedded one counts the key's writes).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub value: Bytes,
    pub revision: u64,
}

/// Why a store operation failed. Each says what a player's 503 message says.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StoreError {
    /// The backend failed (disk full, I/O error, nats-server away) or is busy.
    #[error("store unavailable: {0}")]
    Unavailable(String),
    /// A compare-and-set found another revision.
    #[error("{key}: changed meanwhile (revision {found:?})")]
    Conflict { key: String, found: Option<u64> },
}

/// One write: a put, or a compare-and-set on the revision it expects (`None`: the key
/// must not exist).
#[derive(Debug, Clone)]
struct Write {
    key: String,
    value: Bytes,
    expect: Option<Option<u64>>,
}

type Written = Result<u64, StoreError>;

/// A write waiting for the writer, and where its result goes.
struct Queued {
    write: Write,
    done: oneshot::Sender<Written>,
}

#[derive(Clone)]
enum Backend {
    Memory(memory::Memory),
    Embedded(Arc<embedded::Embedded>),
    NatsKv(Arc<nats_kv::NatsKv>),
}

impl Backend {
    /// Commits `writes` in order, each with its own result: a compare-and-set that
    /// conflicts fails alone; a commit that fails fails them all.
    async fn commit(&self, writes: Vec<Write>) -> Vec<Written> {
        match self {
            Backend::Memory(memory) => memory.commit(&writes),
            Backend::Embedded(file) => {
                let (file, count) = (file.clone(), writes.len());
                tokio::task::spawn_blocking(move || file.commit(&writes))
                    .await
                    .unwrap_or_else(|error| {
                        let error = StoreError::Unavailable(format!("commit panicked: {error}"));
                        vec![Err(error); count]
                    })
            }
            Backend::NatsKv(kv) => kv.commit(writes).await,
        }
    }

    async fn get(&self, key: String) -> Result<Option<Entry>, StoreError> {
        match self {
            Backend::Memory(memory) => memory.get(&key),
            Backend::Embedded(file) => blocking(file, move |file| file.get(&key)).await,
            Backend::NatsKv(kv) => kv.get(&key).await,
        }
    }

    async fn load(&self, prefix: String) -> Result<Vec<(String, Entry)>, StoreError> {
        match self {
            Backend::Memory(memory) => memory.load(&prefix),
            Backend::Embedded(file) => blocking(file, move |file| file.load(&prefix)).await,
            Backend::NatsKv(kv) => kv.load(&prefix).await,
        }
    }
}

/// Runs a read of the embedded file on the blocking pool.
async fn blocking<T: Send + 'static>(
    file: &Arc<embedded::Embedded>,
    read: impl FnOnce(&embedded::Embedded) -> Result<T, StoreError> + Send + 'static,
) -> Result<T, StoreError> {
    let file = file.clone();
    tokio::task::spawn_blocking(move || read(&file))
        .await
        .unwrap_or_else(|error| Err(StoreError::Unavailable(format!("read panicked: {error}"))))
}

/// A handle on a store: cheap to clone, shared by the services of a process.
#[derive(Clone)]
pub struct Store {
    backend: Backend,
    writes: mpsc::Sender<Queued>,
    /// What the store is, for logs: the file, the bucket, or memory.
    describe: Arc<str>,
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("Store").field(&self.describe).finish()
    }
}

impl Store {
    /// Opens the store `config` names. `nats` and `security` reach the bus, for
    /// `nats-kv` (its own connection, as connection `shaddock-store`): a bus without
    /// JetStream (the embedded broker) is refused here, as are a corrupt or foreign
    /// embedded file and a data directory another process holds. Must run inside a
    /// tokio runtime (the writer is a task).
    pub async fn open(
        config: &StoreConfig,
        nats: &[String],
        security: &BusSecurity,
    ) -> anyhow::Result<Store> {
        let (backend, describe) = match config.kind {
            StoreKind::Memory => (
                Backend::Memory(memory::Memory::default()),
                "memory".to_owned(),
            ),
            StoreKind::Embedded => {
                let file = embedded::Embedded::open(&config.data_dir)?;
                let describe = file.path().display().to_string();
                (Backend::Embedded(Arc::new(file)), describe)
            }
            StoreKind::NatsKv => {
                let client = crate::bus::connect_now(nats, "shaddock-store", security).await?;
                let client = client
                    .nats()
                    .cloned()
                    .ok_or_else(|| anyhow::anyhow!("{}", nats_kv::NO_JETSTREAM))?;
                let kv = nats_kv::NatsKv::open(
                    client,
                    &config.store_bucket,
                    config.store_replicas,
                    config.store_wait,
                )
                .await?;
                let describe = format!("nats-kv bucket {}", config.store_bucket);
                (Backend::NatsKv(Arc::new(kv)), describe)
            }
        };
        tracing::info!(store = describe, "store open");
        Ok(Store::start(backend, describe, config))
    }

    /// A store in memory, for tests: its data ends with the process. Must run inside a
    /// tokio runtime.
    pub fn memory() -> Store {
        let config = StoreConfig::default();
        Store::start(
            Backend::Memory(memory::Memory::default()),
            "memory".into(),
            &config,
        )
    }

    fn start(backend: Backend, describe: String, config: &StoreConfig) -> Store {
        let (writes, queued) = mpsc::channel(config.store_queue.max(1));
        tokio::spawn(write_behind(
            backend.clone(),
            queued,
            config.store_batch.max(1),
        ));
        Store {
            backend,
            writes,
            describe: describe.into(),
        }
    }

    /// Makes a memory store fail (or work again), as a full disk or a lost server
    /// would: for tests of what a service does then. Other stores ignore it.
    pub fn fail(&self, fail: bool) {
        if let Backend::Memory(memory) = &self.backend {
            memory.fail(fail);
        }
    }

    /// Writes `value` at `key`; resolves with its revision once committed (durable as
    /// docs/stores.md says for the backend). Queued now, in call order.
    pub fn put(&self, key: impl Into<String>, value: Bytes) -> BoxFuture<'static, Written> {
        self.queue(Write {
            key: key.into(),
            value,
            expect: None,
        })
    }

    /// Writes `value` at `key` only if its revision is still `expected` (`None`: only
    /// if the key does not exist); else [`StoreError::Conflict`].
    pub fn compare_and_set(
        &self,
        key: impl Into<String>,
        value: Bytes,
        expected: Option<u64>,
    ) -> BoxFuture<'static, Written> {
        self.queue(Write {
            key: key.into(),
            value,
            expect: Some(expected),
        })
    }

    /// The value at `key` and its revision, if it has one.
    pub async fn get(&self, key: impl Into<String>) -> Result<Option<Entry>, StoreError> {
        self.backend.get(key.into()).await
    }

    /// Every key that starts with `prefix` (whole dot-separated tokens: `profile.p3.`)
    /// and its entry.
    pub async fn load(
        &self,
        prefix: impl Into<String>,
    ) -> Result<Vec<(String, Entry)>, StoreError> {
        self.backend.load(prefix.into()).await
    }

    fn queue(&self, write: Write) -> BoxFuture<'static, Written> {
        let (done, written) = oneshot::channel();
        match self.writes.try_send(Queued { write, done }) {
            Ok(()) => async move {
                written
                    .await
                    .unwrap_or_else(|_| Err(StoreError::Unavailable("the store stopped".into())))
            }
            .boxed(),
            Err(mpsc::error::TrySendError::Full(_)) => {
                let busy =
                    StoreError::Unavailable("too many writes waiting (--store-queue)".into());
                futures::future::ready(Err(busy)).boxed()
            }
            Err(mpsc::error::TrySendError::Closed(_)) => {
                let gone = StoreError::Unavailable("the store stopped".into());
                futures::future::ready(Err(gone)).boxed()
            }
        }
    }
}

/// The writer: takes the first write waiting, then every other waiting (up to
/// `batch`), commits them together, and answers each in order.
async fn write_behind(backend: Backend, mut queued: mpsc::Receiver<Queued>, batch: usize) {
    let mut buffer = Vec::with_capacity(batch);
    while queued.recv_many(&mut buffer, batch).await > 0 {
        let (writes, done): (Vec<Write>, Vec<_>) =
            buffer.drain(..).map(|q| (q.write, q.done)).unzip();
        let results = backend.commit(writes).await;
        for (done, result) in done.into_iter().zip(results) {
            // The asker gone (its request expired) has no use for the result.
            let _ = done.send(result);
        }
    }
}

#[cfg(test)]
mod tests;
