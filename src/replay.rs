//! Replaying a call log into a fresh engine, to reproduce what the logged
//! engine did and find the first call where a build answers differently.

use std::io::{self, BufRead};

use crate::call_log::{CallKind, CallLogError, CallLogReader, LoggedCall, LoggedRequest, OutputKind};
use crate::config::EngineConfig;
use crate::engine::{Engine, MmContent, MmItemSpec, RequestSpec};
use crate::events::publisher::{Publisher, PublisherConfig};
use crate::ids::{FfiId, RequestId};

/// The first output of a replay that differs from the log.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Divergence {
    /// Index of the call in the log (0 for the first).
    pub call: u64,
    /// Byte offset of its record.
    pub offset: u64,
    /// The call.
    pub kind: CallKind,
    /// The output that differs (the log's, or the replay's when the log has
    /// fewer outputs for the call).
    pub output: OutputKind,
    /// Its digest in the log; `None` when the log has no such output.
    pub recorded: Option<u64>,
    /// Its digest in the replay; `None` when the replay has no such output.
    pub replayed: Option<u64>,
}

impl std::fmt::Display for Divergence {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let hex = |d: Option<u64>| d.map_or_else(|| "none".to_owned(), |d| format!("{d:016x}"));
        write!(
            f,
            "call {} ({:?}, byte {}): output {:?} differs: logged {}, replayed {}",
            self.call,
            self.kind,
            self.offset,
            self.output,
            hex(self.recorded),
            hex(self.replayed)
        )
    }
}

/// What a replay found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReplayReport {
    /// The logged configuration the replay ran with.
    pub config: EngineConfig,
    /// Calls replayed whose every output matched.
    pub calls_matched: u64,
    /// The first output that differed; `None` when every call matched.
    pub divergence: Option<Divergence>,
    /// Set when the log ends inside a record (the logging process died while
    /// writing it): the record's offset. The calls before it were replayed.
    pub truncated_at: Option<u64>,
}

/// Replays a call log (see `Engine::record_calls`) into a fresh engine built
/// with the logged configuration, call by call, and compares each call's
/// output digests with the logged ones; stops at the first that differs.
/// A logged publisher is attached for real, on a loopback port, so that the
/// steps treat their batches as the logged engine did.
pub fn replay_calls(input: impl BufRead) -> Result<ReplayReport, CallLogError> {
    let mut reader = CallLogReader::new(input)?;
    let config = reader.config().clone();
    let mut engine = Engine::new(config.clone())?;
    engine.record_calls(Box::new(io::sink()))?;
    let mut calls_matched = 0u64;
    while let Some(record) = reader.next_record()? {
        apply(&mut engine, &record.call).map_err(|what| CallLogError::Format { offset: record.offset, what })??;
        let replayed = engine.last_call_outputs();
        let n = record.outputs.len().max(replayed.len());
        for i in 0..n {
            let (logged, mine) = (record.outputs.get(i), replayed.get(i));
            if logged != mine {
                let output = logged.or(mine).map(|o| o.0).expect("one side has output i");
                let same_kind = |o: Option<&(OutputKind, u64)>| o.filter(|o| o.0 == output).map(|o| o.1);
                let divergence = Divergence {
                    call: calls_matched,
                    offset: record.offset,
                    kind: record.call.kind(),
                    output,
                    recorded: same_kind(logged),
                    replayed: same_kind(mine),
                };
                return Ok(ReplayReport { config, calls_matched, divergence: Some(divergence), truncated_at: None });
            }
        }
        calls_matched += 1;
    }
    Ok(ReplayReport { config, calls_matched, divergence: None, truncated_at: reader.truncated_at() })
}

/// Makes one logged call. The outer error is a record that cannot be a call
/// the engine took (text that was not UTF-8); the inner one a publisher that
/// cannot be attached.
fn apply(engine: &mut Engine, call: &LoggedCall) -> Result<Result<(), CallLogError>, String> {
    let id = |v: u64| RequestId::from_ffi(v);
    match call {
        LoggedCall::AddRequest(r) => {
            let spec = spec_of(r)?;
            let _ = engine.add_request(&spec);
        }
        LoggedCall::Grow(r, tokens) => {
            let _ = engine.grow(id(*r), tokens);
        }
        LoggedCall::Commit(r, n) => {
            let _ = engine.commit(id(*r), *n);
        }
        LoggedCall::Finish(r) => {
            let _ = engine.finish(id(*r));
        }
        LoggedCall::Cancel(r) => {
            let _ = engine.cancel(id(*r));
        }
        LoggedCall::Evict(n) => {
            engine.evict(usize::try_from(*n).unwrap_or(usize::MAX));
        }
        LoggedCall::Clear => engine.clear(),
        LoggedCall::Step => {
            engine.step();
        }
        LoggedCall::Drain => {
            engine.drain_batches();
        }
        LoggedCall::Snapshot => {
            engine.snapshot();
        }
        LoggedCall::AttachPublisher => {
            let config = PublisherConfig { endpoint: "tcp://127.0.0.1:*".to_owned(), ..Default::default() };
            match Publisher::bind(config) {
                Ok(p) => engine.attach_publisher(p),
                Err(e) => return Ok(Err(CallLogError::Publisher(e.to_string()))),
            }
        }
        LoggedCall::DetachPublisher => {
            drop(engine.detach_publisher());
        }
    }
    Ok(Ok(()))
}

fn text(b: &Option<Vec<u8>>) -> Result<Option<&str>, String> {
    b.as_deref().map(std::str::from_utf8).transpose().map_err(|_| "logged text is not UTF-8".to_owned())
}

fn spec_of(r: &LoggedRequest) -> Result<RequestSpec<'_>, String> {
    Ok(RequestSpec {
        tokens: &r.tokens,
        lora_id: r.lora_id,
        lora_name: text(&r.lora_name)?,
        cache_salt: text(&r.cache_salt)?,
        items: r
            .items
            .iter()
            .map(|i| MmItemSpec { content: MmContent::Digest(&i.digest), runs: i.runs.clone() })
            .collect(),
        uuids: r.uuids.as_ref().map(|l| l.iter().map(|u| u.as_deref()).collect()),
        dummy: r.dummy,
    })
}
