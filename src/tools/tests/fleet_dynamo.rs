//! A fleet across processes behind NVIDIA Dynamo's distributed KV router
//! (PyPI `ai-dynamo-runtime==1.6.1`): etcd and nats-server on loopback, three
//! workers (a `kvcore fleet-engine` process each, fronted by Dynamo's runtime
//! and its relay of the engine's ZMQ stream) and Dynamo's `KvRouter` in its
//! own process. `tests/fleet/run_fleet.py` drives the load and the faults and
//! checks, after each, that the router's view equals every engine's own
//! answer; docs/deployment.md describes the same deployment.
//!
//! The Dynamo venv comes from `tests/interop/setup_venv.sh`, etcd and
//! nats-server from `tests/fleet/setup_services.sh` (PATH, apt-get, or the
//! projects' release binaries). `KVCORE_SKIP_INTEROP=1` skips the test on a
//! machine that cannot run it (never honoured where `CI` is set).

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

fn repo() -> PathBuf {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../..")).to_path_buf()
}

/// The last stdout lines of a setup script, which fails the test when the
/// script does.
fn setup(script: &str, lines: usize) -> Vec<String> {
    let out = Command::new("bash")
        .arg(repo().join(script))
        .stderr(Stdio::inherit())
        .output()
        .unwrap_or_else(|e| panic!("fleet_dynamo: cannot run bash for {script}: {e}"));
    assert!(
        out.status.success(),
        "fleet_dynamo: {script} failed ({}); set KVCORE_SKIP_INTEROP=1 to skip this test outside CI",
        out.status
    );
    let text = String::from_utf8_lossy(&out.stdout);
    let all: Vec<String> = text.lines().map(str::to_owned).collect();
    assert!(all.len() >= lines, "fleet_dynamo: {script} printed {all:?}");
    all[all.len() - lines..].to_vec()
}

/// Runs tests/fleet/run_fleet.py with `args` and returns its summary (the
/// last line), which must say `"ok": true`; `None` when the test is skipped.
fn run_fleet(args: &[&str]) -> Option<serde_json::Value> {
    if std::env::var("KVCORE_SKIP_INTEROP").is_ok_and(|v| v == "1") {
        assert!(std::env::var_os("CI").is_none(), "fleet_dynamo: KVCORE_SKIP_INTEROP=1 is not honoured in CI");
        eprintln!("fleet_dynamo: SKIPPED because KVCORE_SKIP_INTEROP=1");
        return None;
    }
    let python = setup("tests/interop/setup_venv.sh", 1).remove(0);
    let services = setup("tests/fleet/setup_services.sh", 2);
    let out = Command::new(&python)
        .arg(repo().join("tests/fleet/run_fleet.py"))
        .args(["--kvcore", env!("CARGO_BIN_EXE_kvcore"), "--etcd", &services[0], "--nats", &services[1]])
        .args(args)
        .stderr(Stdio::inherit())
        .output()
        .expect("running tests/fleet/run_fleet.py");
    let report = String::from_utf8_lossy(&out.stdout);
    eprintln!("{report}");
    let last = report.lines().last().unwrap_or_default();
    let summary: serde_json::Value =
        serde_json::from_str(last).unwrap_or_else(|e| panic!("run_fleet.py's last line {last:?}: {e}"));
    assert_eq!(summary["ok"], true, "run_fleet.py: {summary}");
    assert!(out.status.success(), "run_fleet.py exited with {}", out.status);
    Some(summary)
}

/// Routing by Dynamo's router matches every engine's longest prefix and beats
/// round-robin; a worker killed, a worker restarted empty, a worker restarted
/// while its engine kept the cache, the router restarted, NATS restarted, a
/// stalled relay, a worker stalled past its lease and a stalled router each end
/// with the router believing exactly what the engines hold, within the
/// script's bound. A UUID given with other pixels on a worker that never saw
/// the UUID is believed by Dynamo to name the first image (the behaviour seen,
/// docs/deployment.md).
#[test]
fn dynamo_distributed_router_over_a_fleet_of_engines_with_faults() {
    let Some(summary) = run_fleet(&[]) else { return };
    let kv = summary["kv_hit_rate"].as_f64().unwrap();
    let rr = summary["round_robin_hit_rate"].as_f64().unwrap();
    assert!(kv > rr, "KV routing {kv} against round-robin {rr}");
    let recovery = summary["recovery_s"].as_object().unwrap();
    assert_eq!(recovery.len(), 9, "{recovery:?}");
}

/// Without Dynamo's worker-local indexer a restarted router learns nothing of
/// the engines' caches; the engines' state publication brings it back.
#[test]
fn a_restarted_router_without_worker_local_indexers_is_blind_until_the_engines_republish() {
    let Some(summary) = run_fleet(&["--scenario", "router-restart-without-local-indexer"]) else { return };
    assert_eq!(summary["known_after_restart"], 0, "{summary}");
    assert!(summary["held_blocks"].as_u64().unwrap() > 0, "{summary}");
}

/// With `kvcore relay --resync` between the engines and Dynamo's relays, a UUID
/// given with other pixels on another worker: Dynamo's router believes no image
/// block by the UUID on either worker (only the text block before the image
/// where an engine holds it), finds each pixels' holder by the content-derived
/// `mm_hash` exactly as the engines hold them, and once the other copy is
/// cleared the UUID matches its holder's 6 blocks again.
#[test]
fn kvcore_relay_keeps_dynamo_right_when_a_uuid_names_other_pixels_on_another_worker() {
    let Some(summary) = run_fleet(&["--scenario", "uuid-through-kvcore-relay"]) else { return };
    let by_uuid = summary["by_uuid_on_holder"].as_object().unwrap();
    assert_eq!(by_uuid.len(), 2, "{summary}");
    assert!(by_uuid.values().all(|v| v == 6), "{summary}");
}
