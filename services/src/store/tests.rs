//! The store's contract on the embedded and memory backends (the JetStream one is
//! tested against nats-server in the root package's tests/store.rs).

use std::path::Path;

use super::*;

fn embedded(dir: &Path) -> StoreConfig {
    StoreConfig {
        data_dir: dir.to_owned(),
        ..StoreConfig::default()
    }
}

async fn open(config: &StoreConfig) -> anyhow::Result<Store> {
    Store::open(config, &[], &BusSecurity::default()).await
}

/// Puts, compare-and-sets, gets and loads, on any backend.
async fn the_contract_holds(store: &Store) {
    let put = |key: &str, value: &'static str| store.put(key, Bytes::from_static(value.as_bytes()));
    let first = put("profile.p1.ann", "a1").await.unwrap();
    let second = put("profile.p1.ann", "a2").await.unwrap();
    assert!(second > first, "revisions grow");
    put("profile.p1.bob", "b1").await.unwrap();
    put("profile.p10.cat", "c1").await.unwrap();
    let ann = store.get("profile.p1.ann").await.unwrap().unwrap();
    assert_eq!((&ann.value[..], ann.revision), (&b"a2"[..], second));
    assert_eq!(store.get("profile.p1.nobody").await.unwrap(), None);

    let stale = store.compare_and_set("profile.p1.ann", Bytes::from_static(b"x"), Some(first));
    assert!(matches!(stale.await, Err(StoreError::Conflict { .. })));
    let fresh = store.compare_and_set("profile.p1.ann", Bytes::from_static(b"a3"), Some(second));
    assert!(fresh.await.unwrap() > second);
    let taken = store.compare_and_set("profile.p1.bob", Bytes::from_static(b"x"), None);
    assert!(matches!(taken.await, Err(StoreError::Conflict { .. })));
    store
        .compare_and_set("profile.p1.dan", Bytes::from_static(b"d1"), None)
        .await
        .unwrap();

    let mut loaded: Vec<(String, Bytes)> = (store.load("profile.p1.").await.unwrap())
        .into_iter()
        .map(|(key, entry)| (key, entry.value))
        .collect();
    loaded.sort();
    assert_eq!(
        loaded,
        [
            ("profile.p1.ann".to_owned(), Bytes::from_static(b"a3")),
            ("profile.p1.bob".to_owned(), Bytes::from_static(b"b1")),
            ("profile.p1.dan".to_owned(), Bytes::from_static(b"d1")),
        ],
        "a prefix is whole tokens: p10 is not under p1."
    );
}

#[tokio::test]
async fn the_memory_store_keeps_the_contract() {
    the_contract_holds(&Store::memory()).await;
}

#[tokio::test]
async fn the_embedded_store_keeps_the_contract_and_its_data_when_reopened() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("created/on/demand");
    let store = open(&embedded(&data)).await.unwrap();
    the_contract_holds(&store).await;
    drop(store);
    // The writer task holds the file until its queue closes: wait for the lock to go.
    let reopened = loop {
        match open(&embedded(&data)).await {
            Ok(store) => break store,
            Err(error) if error.to_string().contains("in use") => tokio::task::yield_now().await,
            Err(error) => panic!("{error:#}"),
        }
    };
    let ann = reopened.get("profile.p1.ann").await.unwrap().unwrap();
    assert_eq!(&ann.value[..], b"a3");
}

#[tokio::test]
async fn many_writes_at_once_are_committed_together_and_all_land() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(&embedded(dir.path())).await.unwrap();
    let writes: Vec<_> = (0..500)
        .map(|i| store.put(format!("k.{i}"), Bytes::from(i.to_string())))
        .collect();
    for result in futures::future::join_all(writes).await {
        result.unwrap();
    }
    assert_eq!(store.load("k.").await.unwrap().len(), 500);
}

#[tokio::test]
async fn a_second_open_of_a_data_dir_is_refused_naming_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let _first = open(&embedded(dir.path())).await.unwrap();
    let error = open(&embedded(dir.path())).await.unwrap_err().to_string();
    let file = dir.path().join(FILE_NAME);
    assert!(error.contains(&file.display().to_string()), "{error}");
    assert!(error.contains("in use by another process"), "{error}");
}

#[tokio::test]
async fn a_corrupt_or_foreign_file_is_refused_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join(FILE_NAME);
    std::fs::write(
        &file,
        b"SQLite format 3\0 and then some bytes of another program",
    )
    .unwrap();
    let error = format!("{:#}", open(&embedded(dir.path())).await.unwrap_err());
    assert!(error.contains(&file.display().to_string()), "{error}");
    assert!(error.contains("not a Shaddock store"), "{error}");

    // A redb file, but another program's: tables without the mark.
    std::fs::remove_file(&file).unwrap();
    {
        let db = redb::Database::create(&file).unwrap();
        let tx = db.begin_write().unwrap();
        let other: redb::TableDefinition<&str, u64> = redb::TableDefinition::new("scores");
        tx.open_table(other).unwrap().insert("ann", 7).unwrap();
        tx.commit().unwrap();
    }
    let error = format!("{:#}", open(&embedded(dir.path())).await.unwrap_err());
    assert!(error.contains(&file.display().to_string()), "{error}");
    assert!(error.contains("another program's tables"), "{error}");
}

#[tokio::test]
async fn a_full_write_queue_refuses_at_once() {
    let config = StoreConfig {
        kind: StoreKind::Memory,
        store_queue: 1,
        ..StoreConfig::default()
    };
    let store = open(&config).await.unwrap();
    // Queued before the writer can run (it waits for this task to yield): the first
    // fills the queue, the second finds it full.
    let first = store.put("a", Bytes::new());
    let second = store.put("b", Bytes::new());
    assert_eq!(
        second.await,
        Err(StoreError::Unavailable(
            "too many writes waiting (--store-queue)".into()
        ))
    );
    first.await.unwrap();
}
