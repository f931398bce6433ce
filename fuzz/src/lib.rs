//! Oracles for the fuzz targets in `fuzz_targets/`: each target is a thin wrapper that
//! hands libFuzzer's bytes to one of these modules. `parser_check` is also compiled into
//! the NATS parser's seeded CI test, and the gate's oracles (`gate_fixture` and the
//! `*_check` modules beside it) into `gateway/tests/decoder_props.rs`, so a property
//! holds under both drivers.

pub mod gate_fixture;
pub mod heap;
pub mod json_check;
pub mod parser_check;
pub mod pomelo_check;
pub mod protobuf_check;
pub mod subjects_check;
pub mod upgrade_check;
