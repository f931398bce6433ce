//! Oracles for the fuzz targets in `fuzz_targets/`: each target is a thin wrapper that
//! hands libFuzzer's bytes to one of these modules. `parser_check` is also compiled into
//! the broker's seeded CI test, so a property holds under both drivers.

pub mod parser_check;
pub mod subjects_check;
