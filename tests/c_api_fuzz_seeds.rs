//! The `c_api` fuzz target's checked-in seeds, run as ordinary tests: each seed goes through the
//! same entry point libFuzzer calls (`kvcore::ffi::c_api_calls`), which checks every status
//! against the header's documentation, the engine's invariants and its memory bounds after every
//! call. Together the seeds must reach the calls the target is for.

use std::path::Path;

/// Every seed runs clean, and the seeds together admit requests, drain events both ways, refuse
/// never-issued ids and exercise the publisher.
#[test]
fn c_api_seeds() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/seeds/c_api");
    let mut paths: Vec<_> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.expect("dir entry").path())
        .collect();
    paths.sort();
    assert!(paths.len() >= 8, "the seed corpus is checked in");
    let mut total = kvcore::ffi::CallTally::default();
    for path in &paths {
        let log = kvcore::ffi::c_api_calls(&std::fs::read(path).expect("read seed"));
        total.engine_built |= log.engine_built;
        for (function, statuses) in log.calls {
            for (status, n) in statuses {
                *total.calls.entry(function).or_default().entry(status).or_default() += n;
            }
        }
    }
    let reached = [
        ("kvc_engine_add_request", "OK"),
        ("kvc_engine_commit", "OK"),
        ("kvc_engine_commit", "UNKNOWN_ID"),
        ("kvc_engine_step", "OK"),
        ("kvc_engine_drain_events", "OK"),
        ("kvc_engine_drain_events_wire", "OK"),
        ("kvc_engine_drain_events_wire", "BUFFER_TOO_SMALL"),
        ("kvc_engine_publisher_start", "OK"),
        ("kvc_engine_block_table_group", "OK"),
        ("kvc_engine_group_usage", "OK"),
    ];
    for (function, status) in reached {
        assert!(total.count(function, status) > 0, "no seed reaches {function} -> {status}: {:#?}", total.calls);
    }
}
