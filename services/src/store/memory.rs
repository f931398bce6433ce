//! The memory backend: a map behind a lock, for tests. It can be made to fail, as a full
//! disk or a lost server would ([`super::Store::fail`]).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use super::{Entry, StoreError, Write, Written};

#[derive(Clone, Default)]
pub(super) struct Memory {
    entries: Arc<Mutex<BTreeMap<String, Entry>>>,
    failing: Arc<AtomicBool>,
}

impl Memory {
    pub fn fail(&self, fail: bool) {
        self.failing.store(fail, Ordering::Relaxed);
    }

    fn check(&self) -> Result<(), StoreError> {
        if self.failing.load(Ordering::Relaxed) {
            return Err(StoreError::Unavailable(
                "failing (a test's full disk)".into(),
            ));
        }
        Ok(())
    }

    pub fn commit(&self, writes: &[Write]) -> Vec<Written> {
        if let Err(error) = self.check() {
            return vec![Err(error); writes.len()];
        }
        // Each change is one insert: a poisoned lock's data is still whole.
        let mut entries = self.entries.lock().unwrap_or_else(PoisonError::into_inner);
        writes
            .iter()
            .map(|write| {
                let found = entries.get(&write.key).map(|e| e.revision);
                apply(found, write)?;
                let revision = found.unwrap_or(0) + 1;
                let entry = Entry {
                    value: write.value.clone(),
                    revision,
                };
                entries.insert(write.key.clone(), entry);
                Ok(revision)
            })
            .collect()
    }

    pub fn get(&self, key: &str) -> Result<Option<Entry>, StoreError> {
        self.check()?;
        let entries = self.entries.lock().unwrap_or_else(PoisonError::into_inner);
        Ok(entries.get(key).cloned())
    }

    pub fn load(&self, prefix: &str) -> Result<Vec<(String, Entry)>, StoreError> {
        self.check()?;
        let entries = self.entries.lock().unwrap_or_else(PoisonError::into_inner);
        Ok(entries
            .range(prefix.to_owned()..)
            .take_while(|(key, _)| key.starts_with(prefix))
            .map(|(key, entry)| (key.clone(), entry.clone()))
            .collect())
    }
}

/// Whether `write` may go on a key at revision `found` (`None`: absent): a put always,
/// a compare-and-set when it expects just that. Shared by the backends that check it
/// themselves (memory, embedded).
pub(super) fn apply(found: Option<u64>, write: &Write) -> Result<(), StoreError> {
    match write.expect {
        Some(expected) if expected != found => Err(StoreError::Conflict {
            key: write.key.clone(),
            found,
        }),
        _ => Ok(()),
    }
}
