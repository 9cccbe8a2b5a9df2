//! The call log: what an engine records replays into a fresh engine with
//! every output matching, a tampered log is caught at the call it was
//! tampered at, a log cut short replays up to the cut, and the recording's
//! refusals and write failures are reported.

mod calls_support;

use std::io::{self, Write};
use std::sync::{Arc, Mutex};

use calls_support::{Driver, Op, Workload, config};
use kvcore::{
    CallKind, CallLogError, CallLogReader, CallRecord, Engine, LoggedCall, OutputKind, Publisher, PublisherConfig,
    replay_calls,
};

const CALLS: usize = 2500;

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

/// Records `CALLS` random calls of `seed` (a real publisher attached for the
/// middle third); returns the log and how many calls the engine recorded.
fn record(seed: u64) -> (Vec<u8>, u64) {
    let sink = Shared::default();
    let mut engine = Engine::new(config(false)).unwrap();
    engine.record_calls(Box::new(sink.clone())).unwrap();
    let mut d = Driver::new(engine);
    let mut work = Workload::new(seed);
    for i in 0..CALLS {
        if i == CALLS / 3 {
            let p = Publisher::bind(PublisherConfig { endpoint: "tcp://127.0.0.1:*".into(), ..Default::default() });
            d.engine.attach_publisher(p.unwrap());
        }
        if i == 2 * CALLS / 3 {
            drop(d.engine.detach_publisher());
        }
        d.apply(&work.next_op());
    }
    let calls = d.engine.stop_recording().unwrap();
    let log = sink.0.lock().unwrap().clone();
    (log, calls)
}

fn records(log: &[u8]) -> Vec<CallRecord> {
    let mut reader = CallLogReader::new(log).unwrap();
    let mut out = Vec::new();
    while let Some(r) = reader.next_record().unwrap() {
        out.push(r);
    }
    assert_eq!(reader.truncated_at(), None);
    out
}

/// Every call of a long random run (admissions with images and LoRA,
/// growth, commits, ends, evictions, clears, tier moves, partial reuse,
/// drains, snapshots, a publisher attached and detached) replays into a
/// fresh engine with every output digest equal; the log holds one record
/// per call, each call kind present.
#[test]
fn a_recorded_run_replays_with_every_output_matching() {
    let (log, calls) = record(21);
    let recs = records(&log);
    assert_eq!(recs.len() as u64, calls);
    for kind in [
        CallKind::AddRequest,
        CallKind::Grow,
        CallKind::Commit,
        CallKind::Finish,
        CallKind::Cancel,
        CallKind::Evict,
        CallKind::Clear,
        CallKind::Step,
        CallKind::Drain,
        CallKind::Snapshot,
        CallKind::AttachPublisher,
        CallKind::DetachPublisher,
    ] {
        assert!(recs.iter().any(|r| r.call.kind() == kind), "the log holds a {kind:?}");
    }
    let report = replay_calls(log.as_slice()).unwrap();
    assert_eq!(report.divergence, None);
    assert_eq!(report.calls_matched, calls);
    assert_eq!(report.config, config(false));
    // Compact: a few bytes per call beyond its tokens and digests.
    let digests: usize = recs.iter().map(|r| r.outputs.len() * 9).sum();
    eprintln!("{} calls, {} bytes, of which {digests} output digests", calls, log.len());
}

/// A digest changed in the log is reported at its call and output; an
/// argument changed (a prompt token) is reported at that call or a later
/// one, never before.
#[test]
fn replay_reports_the_first_tampered_output() {
    let (log, _) = record(22);
    let recs = records(&log);
    // The last byte of record k's last digest (the counters, logged last).
    let k = 1234;
    let end = recs[k + 1].offset as usize;
    let mut tampered = log.clone();
    tampered[end - 1] ^= 0x40;
    let d = replay_calls(tampered.as_slice()).unwrap().divergence.expect("a divergence");
    assert_eq!((d.call, d.output), (k as u64, OutputKind::Counters));
    assert_eq!(d.offset, recs[k].offset);
    assert_ne!(d.recorded, d.replayed);

    // A prompt's first token (the byte after the kind and the token count),
    // in ten admissions: a rejected request or one that ends before its
    // first block is computed answers the same with another token, so not
    // every change shows; those that show are reported at the changed call
    // or later, never before.
    let candidates: Vec<(usize, &CallRecord)> = recs
        .iter()
        .enumerate()
        .skip(1500)
        .filter(|(_, r)| matches!(&r.call, LoggedCall::AddRequest(a) if !a.tokens.is_empty() && a.tokens[0] < 100))
        .take(10)
        .collect();
    let mut caught = 0;
    for (j, rec) in candidates {
        let mut tampered = log.clone();
        let at = rec.offset as usize + 2;
        assert!(tampered[at] < 0x80, "a one-byte token");
        tampered[at] = 0x7f;
        if let Some(d) = replay_calls(tampered.as_slice()).unwrap().divergence {
            assert!(d.call >= j as u64, "reported at {} before the tampered call {j}", d.call);
            eprintln!("a token changed at call {j} is reported at call {}: {d}", d.call);
            caught += 1;
        }
    }
    assert!(caught > 0, "no changed token showed in any output");
}

/// A log cut inside a record (the process died while writing it) replays
/// every call before the cut and says where it ends.
#[test]
fn a_log_cut_short_replays_up_to_the_cut() {
    let (log, _) = record(23);
    let recs = records(&log);
    let cut = recs[700].offset as usize + 3;
    let report = replay_calls(&log[..cut]).unwrap();
    assert_eq!(report.divergence, None);
    assert_eq!(report.calls_matched, 700);
    assert_eq!(report.truncated_at, Some(recs[700].offset));
}

/// Recording starts only on a fresh engine, once; stopping needs a log; a
/// header that is not a call log is refused; a sink that fails stops the
/// recording without disturbing the engine, and the failure is reported.
#[test]
fn refusals_and_write_failures_are_reported() {
    let mut e = Engine::new(config(false)).unwrap();
    assert!(matches!(e.stop_recording(), Err(CallLogError::NotRecording)));
    e.record_calls(Box::new(io::sink())).unwrap();
    assert!(matches!(e.record_calls(Box::new(io::sink())), Err(CallLogError::AlreadyRecording)));
    e.stop_recording().unwrap();
    let mut e = Engine::new(config(false)).unwrap();
    e.step();
    assert!(matches!(e.record_calls(Box::new(io::sink())), Err(CallLogError::NotFresh)));
    assert!(matches!(replay_calls(&b"KVCCALLX\x01\x00"[..]), Err(CallLogError::Format { offset: 0, .. })));
    assert!(matches!(replay_calls(&b"KVCCALLS\x09\x00"[..]), Err(CallLogError::Format { offset: 8, .. })));

    /// Accepts `left` bytes, then fails.
    struct Failing {
        left: usize,
    }
    impl Write for Failing {
        fn write(&mut self, b: &[u8]) -> io::Result<usize> {
            if self.left < b.len() {
                return Err(io::Error::other("disk full"));
            }
            self.left -= b.len();
            Ok(b.len())
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }
    let mut d = Driver::new(Engine::new(config(false)).unwrap());
    d.engine.record_calls(Box::new(Failing { left: 4096 })).unwrap();
    let mut work = Workload::new(24);
    for _ in 0..400 {
        d.apply(&work.next_op());
    }
    d.apply(&Op::Step);
    assert!(d.engine.counters().requests_admitted > 0, "the engine kept serving");
    match d.engine.stop_recording() {
        Err(CallLogError::Io(e)) => assert_eq!(e.to_string(), "disk full"),
        other => panic!("expected the write error, got {other:?}"),
    }
}

/// A damaged log never panics the reader or the replay: 300 copies of a
/// short log with random bytes changed after the header, or cut at random,
/// each replay to a report or a format error (a changed record may ask the
/// engine anything; the engine refuses what is invalid and goes on).
#[test]
fn a_damaged_log_gives_a_report_or_an_error_never_a_panic() {
    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};

    let sink = Shared::default();
    let mut d = Driver::new(Engine::new(config(true)).unwrap());
    d.engine.record_calls(Box::new(sink.clone())).unwrap();
    let mut work = Workload::new(25);
    for _ in 0..300 {
        d.apply(&work.next_op());
    }
    d.engine.stop_recording().unwrap();
    let log = sink.0.lock().unwrap().clone();
    let body = records(&log)[0].offset as usize;
    let mut rng = StdRng::seed_from_u64(26);
    let (mut reports, mut errors) = (0, 0);
    for _ in 0..300 {
        let mut damaged = log.clone();
        if rng.random_bool(0.2) {
            damaged.truncate(rng.random_range(body..log.len()));
        } else {
            for _ in 0..rng.random_range(1..=4) {
                let at = rng.random_range(body..log.len());
                damaged[at] = rng.random();
            }
        }
        match replay_calls(damaged.as_slice()) {
            Ok(_) => reports += 1,
            Err(CallLogError::Format { .. }) => errors += 1,
            Err(e) => panic!("unexpected error {e}"),
        }
    }
    assert!(reports > 0 && errors > 0, "{reports} reports, {errors} format errors");
}
