//! Every decision the engine exposes is a function of its configuration and
//! its calls: two engines given the same long random call sequence (see
//! `calls_support`) agree on every output after every call, and so do two
//! processes.
//!
//! Two engines in one process already hash differently: each ahash map draws
//! its own seed. Two processes add a different process-wide random source,
//! different addresses and a different thread timing; the process test runs
//! this file's first test twice as a child and compares their transcripts
//! (one digest of every call's outputs per line).

mod calls_support;

use std::io::{self, Write};
use std::path::Path;
use std::process::Command;
use std::sync::{Arc, Mutex};

use calls_support::{Driver, Workload, config, line_digest};
use kvcore::Engine;

const CALLS: usize = 3000;

/// Where a child writes its transcript.
const TRANSCRIPT_ENV: &str = "KVCORE_DETERMINISM_TRANSCRIPT";

/// A sink that keeps what is written, shared with the test.
#[derive(Clone, Default)]
struct Shared(Arc<Mutex<Vec<u8>>>);

impl Write for Shared {
    fn write(&mut self, b: &[u8]) -> io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// Runs two engines through the calls of `seed`, comparing every output
/// after every call; with `record`, both record a call log, and the two logs
/// (arguments and output digests, as two ranks would write them) must be
/// equal byte for byte. Returns the last counters.
fn run_two(seed: u64, offload_first: bool, record: bool) -> kvcore::Counters {
    let mut work = Workload::new(seed);
    let mut a = Driver::new(Engine::new(config(offload_first)).unwrap());
    let mut b = Driver::new(Engine::new(config(offload_first)).unwrap());
    let logs = [Shared::default(), Shared::default()];
    if record {
        a.engine.record_calls(Box::new(logs[0].clone())).unwrap();
        b.engine.record_calls(Box::new(logs[1].clone())).unwrap();
    }
    for i in 0..CALLS {
        let op = work.next_op();
        let (la, lb) = (a.apply(&op), b.apply(&op));
        if la != lb {
            let at = la.bytes().zip(lb.bytes()).take_while(|(x, y)| x == y).count();
            let from = at.saturating_sub(200);
            panic!(
                "seed {seed}: the engines diverge at call {i} ({op:?}), byte {at} of its outputs:\n  a: ...{}\n  b: ...{}",
                &la[from..(at + 200).min(la.len())],
                &lb[from..(at + 200).min(lb.len())]
            );
        }
    }
    if record {
        assert_eq!(a.engine.stop_recording().unwrap(), b.engine.stop_recording().unwrap());
        let (la, lb) = (logs[0].0.lock().unwrap(), logs[1].0.lock().unwrap());
        assert!(la.len() > 10_000, "the log holds the run");
        assert!(*la == *lb, "seed {seed}: the two engines' call logs differ");
    }
    a.engine.counters()
}

/// Two engines, one process: the same calls give the same admissions,
/// block tables, pages, copies and waves, events in the same order,
/// evictions and counters, checked after each of 3000 calls for three
/// seeds (one with `offload_first`, one recording call logs, which must come
/// out equal). The workload reaches every path it is
/// meant to (asserted on the counters), so agreement is not vacuous.
#[test]
fn two_engines_agree_after_every_call() {
    if let Some(path) = std::env::var_os(TRANSCRIPT_ENV) {
        // As the child of the process test: one engine, its transcript.
        let mut work = Workload::new(7);
        let mut d = Driver::new(Engine::new(config(false)).unwrap());
        let transcript: Vec<String> =
            (0..CALLS).map(|i| format!("{i} {:016x}", line_digest(&d.apply(&work.next_op())))).collect();
        std::fs::write(path, transcript.join("\n")).unwrap();
        return;
    }
    for (seed, offload_first, record) in [(7, false, false), (8, true, false), (9, false, true)] {
        let c = run_two(seed, offload_first, record);
        assert!(c.requests_admitted > 200 && c.requests_rejected > 0, "seed {seed}: admissions {c:?}");
        assert!(c.blocks_offloaded > 0 && c.blocks_onboarded > 0, "seed {seed}: tier moves {c:?}");
        assert!(c.blocks_evicted_device > 0 && c.blocks_evicted_host > 0, "seed {seed}: evictions {c:?}");
        assert!(c.blocks_partially_reused > 0, "seed {seed}: partial reuse {c:?}");
        assert!(c.hint_hits > 0 && c.hint_conflicts > 0 && c.hint_evictions > 0, "seed {seed}: hints {c:?}");
        assert!(c.event_batches_dropped > 0, "seed {seed}: retention bound {c:?}");
    }
}

/// Two processes: the test above, run twice as a child process with the
/// same seed, drives one engine each and writes the same transcript (a
/// digest of every call's outputs).
#[test]
fn two_processes_agree_after_every_call() {
    let exe = std::env::current_exe().unwrap();
    let dir = std::env::temp_dir().join(format!("kvcore-determinism-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let run = |name: &str| -> Vec<String> {
        let path = dir.join(name);
        let out = Command::new(&exe)
            .args(["--exact", "two_engines_agree_after_every_call", "--test-threads=1"])
            .env(TRANSCRIPT_ENV, &path)
            .output()
            .unwrap();
        assert!(out.status.success(), "child {name}: {}", String::from_utf8_lossy(&out.stdout));
        read_lines(&path)
    };
    let (first, second) = (run("first"), run("second"));
    std::fs::remove_dir_all(&dir).ok();
    assert_eq!(first.len(), CALLS, "the child wrote one line per call");
    if let Some(i) = (0..CALLS).find(|i| first[*i] != second[*i]) {
        panic!("the processes diverge at call {i}: {} vs {}", first[i], second[i]);
    }
}

fn read_lines(path: &Path) -> Vec<String> {
    std::fs::read_to_string(path).unwrap().lines().map(str::to_owned).collect()
}
