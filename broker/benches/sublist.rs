//! Subject trie costs at a small and a large subscription count: building the trie,
//! one subscribe/unsubscribe at that size, matching a subject through each kind of
//! level (literal, `*`, `>`), and the per-connection cache's hit path against a trie
//! match under the index lock, which is what the cache exists to avoid.
//!
//! Each shape gets its own trie of N per-player subscriptions, so a published subject
//! reaches exactly one of them and the figures compare lookups, not fan-out.

use std::hint::black_box;
use std::sync::Arc;
use std::time::Duration;

use broker::sublist::{MATCH_CACHE_CAPACITY, MatchCache, SubjectIndex, Sublist};
use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};

const SIZES: [usize; 2] = [1_000, 100_000];

/// A subscription shape: the subject subscribed for player `i`, and a subject
/// published to player `i` that it matches.
struct Shape {
    name: &'static str,
    subscribe: fn(usize) -> String,
    publish: fn(usize) -> String,
}

const SHAPES: [Shape; 3] = [
    Shape {
        name: "literal",
        subscribe: |i| format!("game.player{i}.move"),
        publish: |i| format!("game.player{i}.move"),
    },
    Shape {
        name: "pwc",
        subscribe: |i| format!("game.player{i}.*"),
        publish: |i| format!("game.player{i}.move"),
    },
    Shape {
        name: "fwc",
        subscribe: |i| format!("game.player{i}.>"),
        publish: |i| format!("game.player{i}.zone.move"),
    },
];

fn subjects(shape: &Shape, n: usize) -> Vec<(Vec<u8>, Arc<usize>)> {
    (0..n)
        .map(|i| ((shape.subscribe)(i).into_bytes(), Arc::new(i)))
        .collect()
}

fn build(subs: &[(Vec<u8>, Arc<usize>)]) -> Sublist<usize> {
    let mut trie = Sublist::default();
    for (subject, sub) in subs {
        trie.insert(subject, None, sub.clone());
    }
    trie
}

fn insert(c: &mut Criterion) {
    let mut group = c.benchmark_group("sublist_insert");
    group.sample_size(10);
    for shape in &SHAPES {
        for n in SIZES {
            let subs = subjects(shape, n);
            group.throughput(Throughput::Elements(n as u64));
            group.bench_with_input(BenchmarkId::new(shape.name, n), &subs, |b, subs| {
                b.iter_with_large_drop(|| build(subs))
            });
        }
    }
    group.finish();
}

fn churn(c: &mut Criterion) {
    let mut group = c.benchmark_group("sublist_sub_unsub");
    for n in SIZES {
        let mut trie = build(&subjects(&SHAPES[0], n));
        let (subject, sub) = (b"game.player_new.inbox".as_slice(), Arc::new(usize::MAX));
        group.bench_function(BenchmarkId::from_parameter(n), |b| {
            b.iter(|| {
                trie.insert(black_box(subject), None, sub.clone());
                trie.remove(black_box(subject), None, &sub)
            })
        });
    }
    group.finish();
}

fn matching(c: &mut Criterion) {
    let mut group = c.benchmark_group("sublist_match");
    for shape in &SHAPES {
        for n in SIZES {
            let trie = build(&subjects(shape, n));
            let subject = (shape.publish)(n / 2).into_bytes();
            assert_eq!(trie.matches(&subject).psubs.len(), 1, "{}", shape.name);
            group.bench_function(BenchmarkId::new(shape.name, n), |b| {
                b.iter(|| trie.matches(black_box(&subject)))
            });
        }
    }
    group.finish();
}

fn cache(c: &mut Criterion) {
    let mut group = c.benchmark_group("match_cache");
    for n in SIZES {
        let index = SubjectIndex::default();
        for (subject, sub) in subjects(&SHAPES[1], n) {
            index.insert(&subject, None, sub);
        }
        let subject = (SHAPES[1].publish)(n / 2).into_bytes();
        let mut cache = MatchCache::new(MATCH_CACHE_CAPACITY);
        assert_eq!(cache.get(&index, &subject).psubs.len(), 1);
        group.bench_function(BenchmarkId::new("cache_hit", n), |b| {
            b.iter(|| cache.get(&index, black_box(&subject)))
        });
        group.bench_function(BenchmarkId::new("index_match", n), |b| {
            b.iter(|| index.matches(black_box(&subject)))
        });
    }
    group.finish();
}

fn config() -> Criterion {
    // Short by default: these track regressions, and the machine has two cores shared
    // with builds. Pass --measurement-time for steadier figures.
    Criterion::default()
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2))
}

criterion_group! {
    name = benches;
    config = config();
    targets = insert, churn, matching, cache
}
criterion_main!(benches);
