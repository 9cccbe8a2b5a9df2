//! Criterion benches, one module per area (STYLE.md section 8).

use criterion::criterion_main;

mod core_engine;
mod cpu_time;
mod events;
mod router;
mod router_native;

criterion_main!(
    core_engine::benches,
    events::codec_benches,
    events::publish_benches,
    router::benches,
    router_native::benches
);
