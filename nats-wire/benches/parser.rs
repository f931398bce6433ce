//! Parser throughput: how fast one connection's reader turns a full read buffer into
//! ops, in bytes and ops per second. Each input is a 64 KiB buffer (a large socket
//! read) of one kind of op, parsed the way a connection does: advance by the length
//! each op used until the buffer holds no complete op.

use std::hint::black_box;
use std::time::Duration;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use nats_wire::{DEFAULT_MAX_CONTROL_LINE, DEFAULT_MAX_PAYLOAD, Limits, parse};

const BUFFER: usize = 64 * 1024;

const LIMITS: Limits = Limits {
    max_control_line: DEFAULT_MAX_CONTROL_LINE,
    max_payload: DEFAULT_MAX_PAYLOAD,
};

/// Whole ops from `op(i)` until the next one would overflow the buffer.
fn fill(op: impl Fn(usize) -> Vec<u8>) -> (Vec<u8>, u64) {
    let mut buf = Vec::with_capacity(BUFFER);
    let mut count = 0;
    loop {
        let next = op(count);
        if buf.len() + next.len() > BUFFER {
            return (buf, count as u64);
        }
        buf.extend_from_slice(&next);
        count += 1;
    }
}

/// Parses every op in `buf`, returning how many there were.
fn parse_all(buf: &[u8]) -> u64 {
    let mut pos = 0;
    let mut ops = 0;
    while let Ok(Some((op, used))) = parse(&buf[pos..], &LIMITS) {
        black_box(op);
        pos += used;
        ops += 1;
    }
    ops
}

fn parser(c: &mut Criterion) {
    let inputs = [
        (
            "pub_16b",
            fill(|i| {
                format!("PUB game.zone{}.move 16\r\n0123456789abcdef\r\n", i % 64).into_bytes()
            }),
        ),
        (
            "hpub_16b",
            fill(|i| {
                format!("HPUB game.zone{}.move _INBOX.r{i} 18 34\r\nNATS/1.0\r\nA: b\r\n\r\n0123456789abcdef\r\n", i % 64)
                    .into_bytes()
            }),
        ),
        (
            "sub",
            fill(|i| format!("SUB game.zone{}.* workers {i}\r\n", i % 64).into_bytes()),
        ),
    ];
    let mut group = c.benchmark_group("parse_64k");
    for (name, (buf, ops)) in &inputs {
        assert_eq!(
            parse_all(buf),
            *ops,
            "{name}: the buffer must parse completely"
        );
        group.throughput(Throughput::ElementsAndBytes {
            elements: *ops,
            bytes: buf.len() as u64,
        });
        group.bench_function(*name, |b| b.iter(|| parse_all(black_box(buf))));
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
    targets = parser
}
criterion_main!(benches);
