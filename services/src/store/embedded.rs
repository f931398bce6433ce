//! The embedded backend: one redb file, `<data-dir>/shaddock.redb` (docs/stores.md,
//! "Embedded"). redb was chosen on a measurement (docs/benchmarks.md, "Stores"): its
//! fsync'd commit took less time than SQLite's in WAL mode with `synchronous=FULL`, and
//! its commits are atomic and checksummed, so a crash leaves the last committed state.
//!
//! Every commit is fsync'd (`Durability::Immediate`): a write answered is on disk, so it
//! survives a process crash and a power loss (on a disk that honours fsync). The file
//! holds a format mark; a file without it (another program's, or not redb at all) is
//! refused at start, naming it, as is a file another process has open: redb locks it.

use std::path::{Path, PathBuf};

use anyhow::Context as _;
use bytes::Bytes;
use redb::{Database, DatabaseError, Durability, ReadableTable, TableDefinition};

use super::memory::apply;
use super::{Entry, StoreError, Write, Written};

/// The file's name inside `--data-dir`.
pub const FILE_NAME: &str = "shaddock.redb";
/// Keys and their revision-prefixed values.
const KEYS: TableDefinition<&str, &[u8]> = TableDefinition::new("keys");
/// The format mark: what the file is, so a foreign one is refused.
const META: TableDefinition<&str, &str> = TableDefinition::new("shaddock");
const FORMAT_KEY: &str = "format";
const FORMAT: &str = "shaddock-store 1";

pub(super) struct Embedded {
    db: Database,
    path: PathBuf,
}

impl Embedded {
    /// Opens (or creates) the store file in `data_dir`, creating the directory.
    pub fn open(data_dir: &Path) -> anyhow::Result<Embedded> {
        std::fs::create_dir_all(data_dir)
            .with_context(|| format!("creating the data directory {}", data_dir.display()))?;
        let path = data_dir.join(FILE_NAME);
        let shown = path.display();
        let db = Database::create(&path).map_err(|error| match error {
            DatabaseError::DatabaseAlreadyOpen => {
                anyhow::anyhow!("{shown} is in use by another process: one process per --data-dir")
            }
            other => anyhow::anyhow!("{shown} is not a Shaddock store, or is corrupt: {other}"),
        })?;
        check_format(&db).with_context(|| format!("{shown} is not a Shaddock store"))?;
        Ok(Embedded { db, path })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn commit(&self, writes: &[Write]) -> Vec<Written> {
        match self.try_commit(writes) {
            Ok(results) => results,
            Err(error) => {
                let error = StoreError::Unavailable(format!("{}: {error}", self.path.display()));
                vec![Err(error); writes.len()]
            }
        }
    }

    fn try_commit(&self, writes: &[Write]) -> Result<Vec<Written>, Failed> {
        let mut tx = self.db.begin_write()?;
        tx.set_durability(Durability::Immediate);
        let mut results = Vec::with_capacity(writes.len());
        {
            let mut keys = tx.open_table(KEYS)?;
            for write in writes {
                let found = keys
                    .get(write.key.as_str())?
                    .and_then(|value| decode(value.value()).map(|entry| entry.revision));
                results.push(match apply(found, write) {
                    Ok(()) => {
                        let revision = found.unwrap_or(0) + 1;
                        let mut value = revision.to_be_bytes().to_vec();
                        value.extend_from_slice(&write.value);
                        keys.insert(write.key.as_str(), value.as_slice())?;
                        Ok(revision)
                    }
                    Err(conflict) => Err(conflict),
                });
            }
        }
        tx.commit()?;
        Ok(results)
    }

    pub fn get(&self, key: &str) -> Result<Option<Entry>, StoreError> {
        self.read(|keys| Ok(keys.get(key)?.and_then(|value| decode(value.value()))))
    }

    pub fn load(&self, prefix: &str) -> Result<Vec<(String, Entry)>, StoreError> {
        self.read(|keys| {
            let mut found = Vec::new();
            for item in keys.range(prefix..)? {
                let (key, value) = item?;
                if !key.value().starts_with(prefix) {
                    break;
                }
                if let Some(entry) = decode(value.value()) {
                    found.push((key.value().to_owned(), entry));
                }
            }
            Ok(found)
        })
    }

    fn read<T>(
        &self,
        read: impl FnOnce(&redb::ReadOnlyTable<&str, &[u8]>) -> Result<T, Failed>,
    ) -> Result<T, StoreError> {
        let run = || -> Result<T, Failed> {
            let tx = self.db.begin_read()?;
            let keys = tx.open_table(KEYS)?;
            read(&keys)
        };
        run().map_err(|error| StoreError::Unavailable(format!("{}: {error}", self.path.display())))
    }
}

/// A redb error, boxed: they are large, and rare.
struct Failed(Box<redb::Error>);

impl<E: Into<redb::Error>> From<E> for Failed {
    fn from(error: E) -> Failed {
        Failed(Box::new(error.into()))
    }
}

impl std::fmt::Display for Failed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

/// A stored value: its revision (8 bytes, big-endian), then the bytes. One shorter
/// than that was not written by this module: skipped.
fn decode(stored: &[u8]) -> Option<Entry> {
    let (revision, value) = stored.split_first_chunk::<8>()?;
    Some(Entry {
        value: Bytes::copy_from_slice(value),
        revision: u64::from_be_bytes(*revision),
    })
}

/// Marks a new file as a Shaddock store, and refuses one that holds tables but not the
/// mark (another program's redb file).
fn check_format(db: &Database) -> anyhow::Result<()> {
    let tx = db.begin_write()?;
    {
        let empty = tx.list_tables()?.next().is_none();
        let mut meta = tx.open_table(META)?;
        let format = meta.get(FORMAT_KEY)?.map(|mark| mark.value().to_owned());
        match format.as_deref() {
            Some(FORMAT) => {}
            None if empty => {
                meta.insert(FORMAT_KEY, FORMAT)?;
                tx.open_table(KEYS)?;
            }
            Some(other) => anyhow::bail!("its format is {other:?}, not {FORMAT:?}"),
            None => anyhow::bail!("it holds another program's tables"),
        }
    }
    tx.commit()?;
    Ok(())
}
