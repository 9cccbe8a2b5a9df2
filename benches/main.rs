//! Criterion benches, one module per area (STYLE.md section 8).

use criterion::criterion_main;

mod core_engine;
mod cpu_time;

criterion_main!(core_engine::benches);
