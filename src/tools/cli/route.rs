//! `kvcore route` and `kvcore route-bench`.
//!
//! `route` subscribes to workers' streams, asks each for a snapshot, hashes a
//! request from a JSON file and prints every worker's overlap per tier and
//! the decision: a router checked by hand.
//!
//! `route-bench` measures our indexer on the workload that
//! `tests/interop/dynamo_bench.py` feeds Dynamo's (with `--dynamo`, the very
//! same events file, Dynamo measured in the same run), and prints both side
//! by side.

use std::cell::RefCell;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use clap::Args;
use kvcore::ImageDigest;
use kvcore::wire::WireEvent;
use kvcore::wire::decode_payload;
use kvcore_router::{
    EventWorkload, EventWorkloadSpec, HashedRequest, ImageInput, ImagePlacement, ImageRef, Indexer, IndexerConfig,
    Message, ModelProfile, NoUuids, Part, RouterKey, ScoringConfig, Subscriber, SubscriberConfig, TokenRequest,
    UuidLookup, UuidResolver, WorkerId, decide, hash_request,
};
use serde_json::{Value, json};

/// Arguments of `kvcore route`.
#[derive(Args)]
pub struct RouteArgs {
    /// Workers, comma separated: `PUB` or `PUB@REPLAY` endpoints, e.g.
    /// `tcp://10.0.0.1:5557@tcp://10.0.0.1:5567,tcp://10.0.0.2:5557`.
    #[arg(long, value_delimiter = ',', required = true)]
    endpoints: Vec<String>,
    /// The request (see docs/router.md for the fields).
    #[arg(long)]
    request: PathBuf,
    /// Tokens per block (when the request file does not say).
    #[arg(long, default_value_t = 32)]
    block_size: u32,
    /// tokenizer.json for text requests (when the request file does not say).
    #[arg(long)]
    tokenizer: Option<PathBuf>,
    /// Each worker's load in blocks, in endpoint order (default 0).
    #[arg(long, value_delimiter = ',')]
    loads: Vec<f64>,
    /// How long to listen before deciding, in milliseconds.
    #[arg(long, default_value_t = 1500)]
    listen_ms: u64,
    /// Print JSON instead of a table.
    #[arg(long)]
    json: bool,
}

type Error = Box<dyn std::error::Error>;

fn err(msg: impl Into<String>) -> Error {
    msg.into().into()
}

/// Runs `kvcore route`.
pub fn run(args: RouteArgs) -> Result<(), Error> {
    let text =
        std::fs::read_to_string(&args.request).map_err(|e| err(format!("reading {}: {e}", args.request.display())))?;
    let req: Value = serde_json::from_str(&text).map_err(|e| err(format!("{}: {e}", args.request.display())))?;
    let base = args.request.parent().unwrap_or(Path::new("."));
    let block_size = req.get("block_size").and_then(Value::as_u64).map_or(args.block_size, |b| b as u32);
    if block_size == 0 {
        return Err(err("block_size must be at least 1"));
    }
    let model = req.get("model").and_then(Value::as_str).unwrap_or("");
    let profile = ModelProfile::for_model(model);
    let (tokens_req, placeholder) = parse_request(&req, &profile, base, args.tokenizer.as_deref())?;

    let mut sub = Subscriber::new(SubscriberConfig {
        indexer: IndexerConfig { block_size, ..Default::default() },
        ..Default::default()
    });
    let mut workers = Vec::new();
    for (i, spec) in args.endpoints.iter().enumerate() {
        let (pub_ep, replay) = match spec.split_once('@') {
            Some((p, r)) => (p, Some(r)),
            None => (spec.as_str(), None),
        };
        let id = sub.connect(pub_ep, pub_ep, replay).map_err(|e| err(format!("connecting {pub_ep}: {e}")))?;
        if replay.is_some() {
            sub.resync(id)?;
        }
        workers.push((id, args.loads.get(i).copied().unwrap_or(0.0)));
    }
    let deadline = Instant::now() + Duration::from_millis(args.listen_ms);
    while Instant::now() < deadline {
        sub.poll(deadline.saturating_duration_since(Instant::now()).min(Duration::from_millis(50)))?;
    }

    let hashed = hash_request(&tokens_req, block_size, placeholder, sub.indexer())?;
    // How the fleet-wide view resolves each image named by UUID alone.
    let images: Vec<Value> = tokens_req
        .images
        .iter()
        .map(|im| match &im.image {
            ImageRef::Uuid(u) => json!({"uuid": u, "resolved": uuid_lookup_str(sub.indexer().resolve(u))}),
            ImageRef::Digest(d) => json!({"digest": d.to_hex()}),
            ImageRef::Bytes(b) => json!({"digest": ImageDigest::of_content(b).to_hex()}),
        })
        .collect();
    let overlaps = sub.find_matches(&hashed.keys);
    let decision =
        decide(&ScoringConfig::default(), hashed.blocks_full as u32, hashed.keys.first().copied(), &overlaps, &workers);
    let name = |w: u32| sub.indexer().worker_name(WorkerId(w)).unwrap_or("?").to_owned();
    if args.json {
        let out = json!({
            "block_size": block_size,
            "profile": profile.name,
            "tokens": tokens_req.tokens.len(),
            "request_blocks": hashed.blocks_full,
            "keyed_blocks": hashed.keys.len(),
            "keys_stop": hashed.stop.as_ref().map(|s| format!("{s:?}")),
            "workers": decision.scores.iter().map(|s| json!({
                "worker": name(s.worker), "device_blocks": s.device_blocks, "any_tier_blocks": s.any_tier_blocks,
                "load_blocks": s.load_blocks, "cost": s.cost })).collect::<Vec<_>>(),
            "decision": decision.worker.map(name),
            "images": images,
            "subscriber": sub.counters(),
            "indexer": sub.indexer().counters(),
            "groups": sub.groups().counters(),
            "memory": sub.indexer().memory(),
        });
        println!("{}", serde_json::to_string_pretty(&out)?);
    } else {
        print_table(&hashed, &decision, &name, tokens_req.tokens.len(), &profile.name);
        for im in &images {
            if let (Some(u), Some(r)) = (im["uuid"].as_str(), im["resolved"].as_str()) {
                println!("image uuid {u}: {r}");
            }
        }
        let (c, m) = (sub.indexer().counters(), sub.indexer().memory());
        println!(
            "uuid view: {} uuids ({} ambiguous, {} unsure slots), {} blocks; conflicts {} (resolved {}), {} evicted, {} \
             references unrecorded",
            m.uuids,
            m.uuids_ambiguous,
            m.uuid_unsure_slots,
            m.uuid_blocks,
            c.uuid_conflicts,
            c.uuid_conflicts_resolved,
            c.uuids_forgotten,
            c.uuid_refs_unrecorded
        );
    }
    Ok(())
}

/// A UUID's resolution in words, for reports.
fn uuid_lookup_str(l: UuidLookup) -> String {
    match l {
        UuidLookup::Digest(d) => format!("digest {}", d.to_hex()),
        UuidLookup::Ambiguous => "ambiguous (the fleet holds it under two digests)".into(),
        UuidLookup::Unsure => "unsure (the bounded view forgot a holder)".into(),
        UuidLookup::Unknown => "unknown (no worker holds it)".into(),
    }
}

fn print_table(
    hashed: &HashedRequest,
    decision: &kvcore_router::Decision,
    name: &dyn Fn(u32) -> String,
    tokens: usize,
    profile: &str,
) {
    println!(
        "request: {tokens} tokens, {} full blocks, {} keyed (profile {profile}){}",
        hashed.blocks_full,
        hashed.keys.len(),
        hashed.stop.as_ref().map(|s| format!("; keys stop: {s:?}")).unwrap_or_default()
    );
    println!("{:<40} {:>8} {:>9} {:>8} {:>9}", "worker", "device", "any tier", "load", "cost");
    for s in &decision.scores {
        println!(
            "{:<40} {:>8} {:>9} {:>8.1} {:>9.2}",
            name(s.worker),
            s.device_blocks,
            s.any_tier_blocks,
            s.load_blocks,
            s.cost
        );
    }
    match decision.worker {
        Some(w) => println!("decision: {}", name(w)),
        None => println!("decision: none (no worker)"),
    }
}

fn image_ref(v: &Value, base: &Path) -> Result<ImageRef, Error> {
    if let Some(p) = v.get("path").and_then(Value::as_str) {
        let path = base.join(p);
        return Ok(ImageRef::Bytes(std::fs::read(&path).map_err(|e| err(format!("image {}: {e}", path.display())))?));
    }
    if let Some(h) = v.get("digest").and_then(Value::as_str) {
        return parse_digest(h).map(ImageRef::Digest);
    }
    if let Some(u) = v.get("uuid").and_then(Value::as_str) {
        return Ok(ImageRef::Uuid(u.to_owned()));
    }
    Err(err("an image needs one of \"path\", \"digest\" (64 hex digits) or \"uuid\""))
}

fn parse_digest(h: &str) -> Result<ImageDigest, Error> {
    if h.len() != 64 || !h.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(err(format!("digest {h:?} is not 64 hex digits")));
    }
    let mut d = [0u8; 32];
    for (i, byte) in d.iter_mut().enumerate() {
        *byte = u8::from_str_radix(&h[2 * i..2 * i + 2], 16)?;
    }
    Ok(ImageDigest(d))
}

fn image_input(v: &Value, base: &Path) -> Result<ImageInput, Error> {
    let size = |k: &str| v.get(k).and_then(Value::as_u64).map(|x| x as u32);
    Ok(ImageInput { image: image_ref(v, base)?, width: size("width"), height: size("height") })
}

/// The request as token ids plus image placements, and the placeholder id.
fn parse_request(
    req: &Value,
    profile: &ModelProfile,
    base: &Path,
    tokenizer_arg: Option<&Path>,
) -> Result<(TokenRequest, u32), Error> {
    let lora = req.get("lora_name").and_then(Value::as_str).map(str::to_owned);
    let salt = req.get("cache_salt").and_then(Value::as_str).map(str::to_owned);
    let placeholder =
        req.get("image_placeholder").and_then(Value::as_u64).map_or(profile.image_placeholder, |p| p as u32);
    if let Some(ids) = req.get("token_ids").and_then(Value::as_array) {
        let tokens = ids
            .iter()
            .map(|t| t.as_u64().and_then(|t| u32::try_from(t).ok()).ok_or_else(|| err("token_ids must be u32")))
            .collect::<Result<Vec<u32>, Error>>()?;
        let mut images = Vec::new();
        for p in req.get("image_placements").and_then(Value::as_array).into_iter().flatten() {
            let runs = p
                .get("runs")
                .and_then(Value::as_array)
                .ok_or_else(|| err("an image placement needs \"runs\": [[start, len], ...]"))?
                .iter()
                .map(|r| match r.as_array().map(Vec::as_slice) {
                    Some([s, l]) => match (s.as_u64(), l.as_u64()) {
                        (Some(s), Some(l)) if s <= u32::MAX as u64 && l <= u32::MAX as u64 => Ok((s as u32, l as u32)),
                        _ => Err(err("a run is [start, len] with u32 values")),
                    },
                    _ => Err(err("a run is [start, len]")),
                })
                .collect::<Result<Vec<_>, Error>>()?;
            images.push(ImagePlacement { image: image_ref(p, base)?, runs });
        }
        return Ok((TokenRequest { tokens, images, lora, cache_salt: salt }, placeholder));
    }
    let tok_path = req
        .get("tokenizer")
        .and_then(Value::as_str)
        .map(|p| base.join(p))
        .or_else(|| tokenizer_arg.map(Path::to_path_buf))
        .ok_or_else(|| err("a text request needs a tokenizer (\"tokenizer\" in the file or --tokenizer)"))?;
    let tokenizer = tokenizers::Tokenizer::from_file(&tok_path)
        .map_err(|e| err(format!("tokenizer {}: {e}", tok_path.display())))?;
    if let Some(msgs) = req.get("messages").and_then(Value::as_array) {
        let mut messages = Vec::new();
        for m in msgs {
            let role = m.get("role").and_then(Value::as_str).unwrap_or("user").to_owned();
            let parts = match m.get("content") {
                Some(Value::String(s)) => vec![Part::Text(s.clone())],
                Some(Value::Array(items)) => items
                    .iter()
                    .map(|it| match it.get("type").and_then(Value::as_str) {
                        Some("text") => Ok(Part::Text(it.get("text").and_then(Value::as_str).unwrap_or("").to_owned())),
                        Some("image") | Some("image_url") => image_input(it, base).map(Part::Image),
                        other => Err(err(format!("unknown content part type {other:?}"))),
                    })
                    .collect::<Result<Vec<_>, Error>>()?,
                _ => return Err(err("a message needs \"content\" (a string or a list of parts)")),
            };
            messages.push(Message { role, parts });
        }
        return Ok((profile.render(&tokenizer, &messages, lora, salt)?, placeholder));
    }
    if let Some(prompt) = req.get("prompt").and_then(Value::as_str) {
        let images = req
            .get("images")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .map(|v| image_input(v, base))
            .collect::<Result<Vec<_>, Error>>()?;
        let default_marker =
            if profile.image_start.is_some() { "<|vision_start|><|image_pad|><|vision_end|>" } else { "<image>" };
        let marker = req.get("image_marker").and_then(Value::as_str).unwrap_or(default_marker);
        return Ok((profile.render_prompt(&tokenizer, prompt, marker, &images, lora, salt)?, placeholder));
    }
    Err(err("the request needs \"token_ids\", \"messages\" or \"prompt\""))
}

// ---------------------------------------------------------------------------
// route-bench

/// Arguments of `kvcore route-bench`.
#[derive(Args)]
pub struct BenchArgs {
    /// Also run Dynamo (ai-dynamo-runtime 1.6.1 through tests/interop) on the
    /// same events file, in the same run.
    #[arg(long)]
    dynamo: bool,
    /// The repository root (for tests/interop); default: the current directory.
    #[arg(long, default_value = ".")]
    repo: PathBuf,
    /// RNG seed of the workload.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Sequences stored.
    #[arg(long, default_value_t = 1024)]
    sequences: usize,
    /// Tokens per sequence (and per hashed request).
    #[arg(long, default_value_t = 4096)]
    seq_tokens: usize,
    /// Tokens per block.
    #[arg(long, default_value_t = 32)]
    block_size: u32,
    /// Blocks per stored event.
    #[arg(long, default_value_t = 16)]
    blocks_per_event: usize,
    /// Workers.
    #[arg(long, default_value_t = 4)]
    workers: usize,
    /// Keys per lookup.
    #[arg(long, default_value_t = 256)]
    lookup_keys: usize,
    /// Timed iterations of hash and lookup.
    #[arg(long, default_value_t = 2000)]
    iters: usize,
    /// Repetitions of each apply measurement, on both sides (Dynamo's too,
    /// with `--dynamo`): the wall figure is the best one, the CPU figure the
    /// mean (the thread CPU clock may advance in scheduler ticks of several
    /// milliseconds, as long as one run).
    #[arg(long, default_value_t = 10)]
    repeats: usize,
    /// Compare with Dynamo's native Rust indexer (`dynamo-kv-router` 1.6.1,
    /// linked in) instead: every row in interleaved rounds, on the uniform
    /// workload, prefixes held by one, half or all of 4, 64 and 256 workers,
    /// and the Mooncake trace (docs/benchmarks.md says what each row means).
    #[arg(long)]
    native: bool,
    /// Rounds of each native row (each gives one ratio).
    #[arg(long, default_value_t = 15)]
    rounds: usize,
    /// The Mooncake trace for the native rows (skipped when absent).
    #[arg(long, default_value = "../shared/data/traces/mooncake_conversation_trace.jsonl")]
    trace: PathBuf,
    /// Requests of the trace stored.
    #[arg(long, default_value_t = 1000)]
    trace_requests: usize,
    /// Requests of the chat simulation's stream stored (`chat` rows).
    #[arg(long, default_value_t = 2000)]
    chat_requests: usize,
    /// Only these native row groups, comma separated: apply, lookup, decode,
    /// trace, chat, memory, kept (fresh apply with the allocator keeping
    /// freed memory; run last, as it changes the allocator's settings)
    /// (default all), or `hash`: the request hash rows alone (uniform,
    /// Mooncake, chat), which no other group needs.
    #[arg(long, value_delimiter = ',')]
    only: Vec<String>,
    /// With `--native`: also compare kvcore's sharded indexer against
    /// Dynamo's `ThreadPoolIndexer<CRTC>` at each of these thread counts,
    /// comma separated (fresh apply and lookups; the uniform workload, the
    /// Mooncake trace and the chat stream, each over `--thread-workers`
    /// workers). Give it a machine with twice the largest count in cores.
    #[arg(long, value_delimiter = ',')]
    threads: Vec<usize>,
    /// Workers of the `--threads` workloads.
    #[arg(long, default_value_t = 64)]
    thread_workers: usize,
}

/// Prints one native row.
fn print_native(row: &kvcore_tools::bench::native::Row) {
    let figs: Vec<String> = row.medians.iter().map(|(s, f)| format!("{} {:.3}", s.name(), f)).collect();
    println!(
        "{:<100} | {} {} | ratio to {} min {:.2} median {:.2} max {:.2}",
        row.what,
        figs.join(", "),
        row.unit,
        row.best.name(),
        row.ratio.0,
        row.ratio.1,
        row.ratio.2
    );
}

/// `row` with the workload's name after its label.
fn with_name(mut row: kvcore_tools::bench::native::Row, name: &str) -> kvcore_tools::bench::native::Row {
    row.what = format!("{}, {name}", row.what);
    row
}

/// `route-bench --native`.
fn native_bench(args: &BenchArgs) -> Result<(), Error> {
    use kvcore_tools::bench::native::{
        Workload, apply_rows, decode_rows, fresh_kept_row, hash_row, lookup_rows, memory_row, thread_rows,
    };
    let want = |g: &str| args.only.is_empty() || args.only.iter().any(|o| o == g);
    let bs = args.block_size;
    let n = args.rounds.max(1);
    let spec = EventWorkloadSpec {
        seed: args.seed,
        sequences: args.sequences,
        seq_tokens: args.seq_tokens,
        block_size: bs,
        blocks_per_event: args.blocks_per_event,
        workers: args.workers,
    };
    println!("kvcore against dynamo-kv-router 1.6.1 in one process; medians over {n} interleaved rounds");
    let uniform = Workload::uniform(&spec);
    if args.only.iter().any(|o| o == "hash") {
        print_native(&with_name(hash_row(&uniform, bs, n, args.iters), &uniform.name));
        match Workload::mooncake(&args.trace, args.trace_requests, 4, bs) {
            Ok(w) => print_native(&with_name(hash_row(&w, bs, n, args.iters), &w.name)),
            Err(e) => println!("trace {} skipped: {e}", args.trace.display()),
        }
        let chat = Workload::chat(args.chat_requests, 4, bs);
        print_native(&with_name(hash_row(&chat, bs, n, args.iters), &chat.name));
    }
    if want("apply") {
        for r in apply_rows(&uniform, bs, n) {
            print_native(&r);
        }
    }
    if want("lookup") {
        for r in lookup_rows(&uniform, bs, n, args.iters) {
            print_native(&r);
        }
        for workers in [4usize, 64, 256] {
            for holders in [1, workers / 2, workers] {
                let w = Workload::held(workers, holders, 16, args.seq_tokens, bs);
                for r in lookup_rows(&w, bs, n, args.iters).into_iter().filter(|r| !r.what.starts_with("hash a")) {
                    print_native(&r);
                }
            }
        }
    }
    if want("decode") {
        for r in decode_rows(&uniform, bs, n) {
            print_native(&r);
        }
    }
    if want("trace") {
        for workers in [4usize, 64] {
            match Workload::mooncake(&args.trace, args.trace_requests, workers, bs) {
                Ok(w) => {
                    println!("{}: {} events, {} blocks", w.name, w.events.len(), w.blocks);
                    for r in apply_rows(&w, bs, n).into_iter().chain(lookup_rows(&w, bs, n, args.iters)) {
                        print_native(&r);
                    }
                }
                Err(e) => println!("trace {} skipped: {e}", args.trace.display()),
            }
        }
    }
    if !args.threads.is_empty() {
        let cores = std::thread::available_parallelism().map_or(0, |c| c.get());
        println!(
            "threads: kvcore's ShardedIndexer against ThreadPoolIndexer<CRTC>, {:?} threads a side ({cores} cores available)",
            args.threads
        );
        let tw = args.thread_workers.max(1);
        let mut loads = vec![Workload::uniform(&EventWorkloadSpec { workers: tw, ..spec })];
        if let Ok(w) = Workload::mooncake(&args.trace, args.trace_requests, tw, bs) {
            loads.push(w);
        }
        loads.push(Workload::chat(args.chat_requests, tw, bs));
        for w in &loads {
            for &t in &args.threads {
                for r in thread_rows(w, bs, n, args.iters, t.max(1)) {
                    print_native(&r);
                }
            }
        }
    }
    if want("chat") {
        for workers in [4usize, 64] {
            let w = Workload::chat(args.chat_requests, workers, bs);
            println!("{}: {} events, {} blocks", w.name, w.events.len(), w.blocks);
            for r in apply_rows(&w, bs, n).into_iter().chain(lookup_rows(&w, bs, n, args.iters)) {
                print_native(&r);
            }
        }
    }
    if want("memory") {
        for workers in [4usize, 64] {
            let spec = EventWorkloadSpec { sequences: 8192, workers, ..spec };
            let w = Workload::uniform(&spec);
            print_native(&memory_row(&w, bs));
        }
    }
    // Last: it changes the allocator's settings for the rest of the process.
    if want("kept") {
        print_native(&fresh_kept_row(&uniform, bs, n));
        for workers in [4usize, 64] {
            match Workload::mooncake(&args.trace, args.trace_requests, workers, bs) {
                Ok(w) if w.blocks > 0 => print_native(&fresh_kept_row(&w, bs, n)),
                Ok(_) => println!("trace {} skipped: no blocks", args.trace.display()),
                Err(e) => println!("trace {} skipped: {e}", args.trace.display()),
            }
        }
        for workers in [4usize, 64] {
            print_native(&fresh_kept_row(&Workload::chat(args.chat_requests, workers, bs), bs, n));
        }
    }
    Ok(())
}

/// Reads the events file dynamo_bench.py writes: concatenated msgpack maps
/// `{"worker_id": int, "payload": bin}`.
fn read_events_file(path: &Path) -> Result<Vec<(i64, Vec<u8>)>, Error> {
    let bytes = std::fs::read(path)?;
    let mut rd: &[u8] = &bytes;
    let mut out = Vec::new();
    while !rd.is_empty() {
        let n = rmp::decode::read_map_len(&mut rd).map_err(|e| err(format!("events file: {e}")))?;
        let (mut worker, mut payload) = (None, None);
        for _ in 0..n {
            let klen = rmp::decode::read_str_len(&mut rd).map_err(|e| err(format!("events file: {e}")))? as usize;
            if rd.len() < klen {
                return Err(err("events file truncated"));
            }
            let key = rd[..klen].to_vec();
            rd = &rd[klen..];
            match key.as_slice() {
                b"worker_id" => {
                    worker = Some(rmp::decode::read_int::<i64, _>(&mut rd).map_err(|e| err(format!("{e}")))?)
                }
                b"payload" => {
                    let len = rmp::decode::read_bin_len(&mut rd).map_err(|e| err(format!("{e}")))? as usize;
                    if rd.len() < len {
                        return Err(err("events file truncated"));
                    }
                    payload = Some(rd[..len].to_vec());
                    rd = &rd[len..];
                }
                _ => return Err(err("events file: unexpected key")),
            }
        }
        out.push((worker.ok_or_else(|| err("no worker_id"))?, payload.ok_or_else(|| err("no payload"))?));
    }
    Ok(out)
}

/// This thread's time on a CPU so far, in seconds, from the scheduler
/// (`/proc/thread-self/schedstat`, nanoseconds): unlike the wall clock it
/// does not count time spent waiting for a core on a busy machine. `None`
/// where the file does not exist.
pub(crate) fn thread_cpu_s() -> Option<f64> {
    let text = std::fs::read_to_string("/proc/thread-self/schedstat").ok()?;
    text.split_whitespace().next()?.parse::<u64>().ok().map(|ns| ns as f64 / 1e9)
}

/// Page faults this thread has taken so far (`minflt` in
/// `/proc/thread-self/stat`): new memory is mapped in one fault per page, so
/// this counts what the tables' growth costs the kernel. `None` where the
/// file does not exist.
fn thread_minor_faults() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/thread-self/stat").ok()?;
    // Fields after the command name (which may hold spaces) in parentheses:
    // state, ppid, pgrp, session, tty_nr, tpgid, flags, minflt, ...
    text.rsplit_once(')')?.1.split_whitespace().nth(7)?.parse().ok()
}

fn percentile(samples: &mut [u64], p: f64) -> f64 {
    samples.sort_unstable();
    let i = ((p / 100.0) * (samples.len() - 1) as f64).round() as usize;
    samples[i.min(samples.len() - 1)] as f64 / 1000.0
}

/// Wall and thread CPU seconds of one call of `f`.
fn measure_once(f: &mut dyn FnMut()) -> (f64, Option<f64>) {
    let cpu = thread_cpu_s();
    let t = Instant::now();
    f();
    let wall = t.elapsed().as_secs_f64();
    (wall, cpu.zip(thread_cpu_s()).map(|(a, b)| b - a))
}

fn time_calls(iters: usize, mut f: impl FnMut()) -> (f64, f64) {
    for _ in 0..iters.min(100) {
        f();
    }
    let mut ns = Vec::with_capacity(iters);
    for _ in 0..iters {
        let t = Instant::now();
        f();
        ns.push(t.elapsed().as_nanos() as u64);
    }
    (percentile(&mut ns, 50.0), percentile(&mut ns, 99.0))
}

/// Runs `kvcore route-bench`.
pub fn bench(args: BenchArgs) -> Result<(), Error> {
    if args.native {
        return native_bench(&args);
    }
    let spec = EventWorkloadSpec {
        seed: args.seed,
        sequences: args.sequences,
        seq_tokens: args.seq_tokens,
        block_size: args.block_size,
        blocks_per_event: args.blocks_per_event,
        workers: args.workers,
    };
    // The events: Dynamo's own file when it runs, so both sides apply the very
    // same bytes; otherwise our generator of the same shape.
    let mut dynamo: Option<Value> = None;
    let mut payloads: Vec<(i64, Vec<u8>)> = Vec::new();
    let events: Vec<(i64, WireEvent)>;
    if args.dynamo {
        let interop = args.repo.join("tests/interop");
        let setup = std::process::Command::new("bash").arg(interop.join("setup_venv.sh")).output()?;
        if !setup.status.success() {
            return Err(err(format!("setup_venv.sh failed: {}", String::from_utf8_lossy(&setup.stderr))));
        }
        let python = String::from_utf8(setup.stdout)?.lines().last().unwrap_or("python3").trim().to_owned();
        let file = std::env::temp_dir().join(format!("kvcore-route-bench-{}.msgpack", std::process::id()));
        let out = std::process::Command::new(&python)
            .arg(interop.join("dynamo_bench.py"))
            .args(["--seed", &args.seed.to_string(), "--sequences", &args.sequences.to_string()])
            .args(["--seq-tokens", &args.seq_tokens.to_string(), "--block-size", &args.block_size.to_string()])
            .args(["--blocks-per-event", &args.blocks_per_event.to_string(), "--workers", &args.workers.to_string()])
            .args(["--lookup-keys", &args.lookup_keys.to_string(), "--iters", &args.iters.to_string()])
            .args(["--request-tokens", &args.seq_tokens.to_string(), "--removals"])
            .args(["--repeats", &args.repeats.max(1).to_string(), "--write-events"])
            .arg(&file)
            .output()?;
        if !out.status.success() {
            return Err(err(format!("dynamo_bench.py failed: {}", String::from_utf8_lossy(&out.stderr))));
        }
        let line = String::from_utf8(out.stdout)?;
        dynamo = Some(serde_json::from_str(line.trim())?);
        payloads = read_events_file(&file)?;
        let _ = std::fs::remove_file(&file);
        let mut evs = Vec::new();
        for (w, p) in &payloads {
            for e in decode_payload(p)?.events {
                evs.push((*w, e));
            }
        }
        events = evs;
    } else {
        events = EventWorkload::generate(&spec).events.into_iter().map(|(w, e)| (w as i64 + 1, e)).collect();
    }

    // Workers by id, in order of first appearance.
    let mut ids: Vec<i64> = Vec::new();
    for (w, _) in &events {
        if !ids.contains(w) {
            ids.push(*w);
        }
    }
    let fresh = || {
        let mut ix = Indexer::new(IndexerConfig { block_size: args.block_size, ..Default::default() });
        let map: Vec<(i64, WorkerId)> = ids.iter().map(|w| (*w, ix.add_worker(&w.to_string()))).collect();
        (ix, map)
    };
    let lookup_worker = |map: &[(i64, WorkerId)], w: i64| map.iter().find(|(i, _)| *i == w).map(|(_, id)| *id);
    let stored_events = events.iter().filter(|(_, e)| matches!(e, WireEvent::BlockStored(_))).count();
    let blocks: usize = events
        .iter()
        .map(|(_, e)| match e {
            WireEvent::BlockStored(s) => s.block_hashes.len(),
            _ => 0,
        })
        .sum();

    // Apply: decoded events into a fresh indexer (cold: every table grows
    // from empty, as Dynamo's tree does in its figure); sized: fresh tables
    // reserved up front for each worker's blocks, as a router that knows
    // each worker's capacity can do (`Indexer::reserve`); warm: a
    // long-running router reuses its tables, so everything is removed
    // (timed: removals) and the same events applied again (timed: warm).
    let repeats = args.repeats.max(1);
    let wids_of = |map: &[(i64, WorkerId)]| -> Vec<WorkerId> {
        events.iter().map(|(w, _)| lookup_worker(map, *w).expect("mapped")).collect()
    };
    // Best wall time, mean CPU time and mean page faults of `repeats` runs of
    // `f`, each after an untimed `setup`.
    let measure = |setup: &mut dyn FnMut(), f: &mut dyn FnMut()| -> (f64, Option<f64>, Option<f64>) {
        let (mut best, mut cpu_sum, mut cpu_ok) = (f64::INFINITY, 0.0, true);
        let (mut faults_sum, mut faults_ok) = (0u64, true);
        for _ in 0..repeats {
            setup();
            let faults = thread_minor_faults();
            let cpu = thread_cpu_s();
            let t = Instant::now();
            f();
            best = best.min(t.elapsed().as_secs_f64());
            match (cpu, thread_cpu_s()) {
                (Some(a), Some(b)) => cpu_sum += b - a,
                _ => cpu_ok = false,
            }
            match (faults, thread_minor_faults()) {
                (Some(a), Some(b)) => faults_sum += b - a,
                _ => faults_ok = false,
            }
        }
        // A CPU time of zero (runs shorter than one tick of the clock) gives
        // no figure rather than an infinite one.
        let cpu = (cpu_ok && cpu_sum > 0.0).then(|| cpu_sum / repeats as f64);
        (best, cpu, faults_ok.then(|| faults_sum as f64 / repeats as f64))
    };
    let apply_all = |ix: &mut Indexer, wids: &[WorkerId]| {
        ix.apply_all(events.iter().zip(wids).map(|((_, e), w)| (*w, e)));
    };
    // Each run applies into a new indexer made (untimed) after the previous
    // one was dropped, as Dynamo's side applies each run into a new tree
    // after dropping the last: both sides' allocators may then reuse the
    // memory the previous run freed.
    let current: RefCell<Option<(Indexer, Vec<WorkerId>)>> = RefCell::new(None);
    let mut apply_current = || {
        let mut cur = current.borrow_mut();
        let (ix, wids) = cur.as_mut().expect("made by setup");
        apply_all(ix, wids);
    };
    let (best, best_cpu, best_faults) = measure(
        &mut || {
            current.replace(None);
            let (ix, map) = fresh();
            current.replace(Some((ix, wids_of(&map))));
        },
        &mut apply_current,
    );
    // Removals and warm applies start from the last fresh indexer, filled.
    let (mut ix, wids) = current.take().expect("repeats >= 1");
    // Stored blocks per worker, for the sized runs' reservations.
    let mut per_worker: Vec<(i64, usize)> = ids.iter().map(|w| (*w, 0)).collect();
    for (w, e) in &events {
        if let WireEvent::BlockStored(s) = e
            && let Some(slot) = per_worker.iter_mut().find(|(id, _)| id == w)
        {
            slot.1 += s.block_hashes.len();
        }
    }
    let (sized_best, sized_cpu, sized_faults) = measure(
        &mut || {
            current.replace(None);
            let (mut ix, map) = fresh();
            for ((wid, id), (pw, blocks)) in map.iter().zip(&per_worker) {
                debug_assert_eq!(wid, pw, "both follow `ids`");
                ix.reserve(*id, *blocks);
            }
            current.replace(Some((ix, wids_of(&map))));
        },
        &mut apply_current,
    );
    drop(current);
    let removals = kvcore_router::removals_of(events.iter().zip(&wids).map(|((_, e), w)| (*w, e)));
    let (mut remove_s, mut warm_s, mut warm_cpu) = (f64::INFINITY, f64::INFINITY, Some(0.0));
    for _ in 0..repeats {
        let (r, _) = measure_once(&mut || ix.apply_all(removals.iter().map(|(w, e)| (*w, e))));
        assert_eq!(ix.memory().nodes, 0, "every block removed");
        let (a, ac) = measure_once(&mut || apply_all(&mut ix, &wids));
        remove_s = remove_s.min(r);
        warm_s = warm_s.min(a);
        warm_cpu = warm_cpu.zip(ac).map(|(x, y)| x + y);
    }
    let warm_cpu = warm_cpu.filter(|c| *c > 0.0).map(|c| c / repeats as f64);
    // Decode and apply from the payload bytes (what a subscriber does), into
    // fresh tables: the best of `repeats` runs, as for the apply above.
    let decode_apply_s = if payloads.is_empty() {
        None
    } else {
        let mut best_s = f64::INFINITY;
        for _ in 0..repeats {
            let (mut ix2, map2) = fresh();
            let t = Instant::now();
            for (w, p) in &payloads {
                let wid = lookup_worker(&map2, *w).expect("mapped");
                let batch = decode_payload(p)?;
                ix2.apply_all(batch.events.iter().map(|e| (wid, e)));
            }
            best_s = best_s.min(t.elapsed().as_secs_f64());
        }
        Some(best_s)
    };

    // The first stored sequence: its tokens, from parent-linked events of its worker.
    let mut first_tokens = Vec::new();
    let mut first_worker = None;
    for (w, e) in &events {
        if let WireEvent::BlockStored(s) = e {
            match first_worker {
                None => first_worker = Some(*w),
                Some(fw) if fw != *w => continue,
                Some(_) if s.parent_block_hash.is_none() => break,
                Some(_) => {}
            }
            first_tokens.extend_from_slice(s.token_ids.as_deref().unwrap_or(&[]));
        }
    }
    let req = TokenRequest { tokens: first_tokens.clone(), ..Default::default() };
    let mut keys = hash_request(&req, args.block_size, 0, &NoUuids)?.keys;
    let hit_blocks = keys.len().min(args.lookup_keys);
    keys.truncate(args.lookup_keys);
    let mut x = args.seed ^ 0x9E37_79B9_7F4A_7C15;
    while keys.len() < args.lookup_keys {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        keys.push(RouterKey(x));
    }
    let matched = ix.find_matches(&keys).iter().map(|o| o.any_tier_blocks).max().unwrap_or(0);
    let (lookup_p50, lookup_p99) = time_calls(args.iters, || {
        std::hint::black_box(ix.find_matches(std::hint::black_box(&keys)));
    });
    // Hash: a random request of seq_tokens tokens (as dynamo_bench.py does).
    let mut y = args.seed.wrapping_add(1) | 1;
    let hash_tokens: Vec<u32> = (0..args.seq_tokens)
        .map(|_| {
            y ^= y << 13;
            y ^= y >> 7;
            y ^= y << 17;
            (y % 152_000) as u32
        })
        .collect();
    let hash_req = TokenRequest { tokens: hash_tokens, ..Default::default() };
    let (hash_p50, hash_p99) = time_calls(args.iters, || {
        std::hint::black_box(hash_request(std::hint::black_box(&hash_req), args.block_size, 0, &NoUuids).ok());
    });
    let mem = ix.memory();
    let ours = json!({
        "events": events.len(), "stored_events": stored_events, "stored_blocks": blocks,
        "apply_seconds": best,
        "stored_events_per_s": stored_events as f64 / best,
        "stored_blocks_per_s": blocks as f64 / best,
        "sized_stored_blocks_per_s": blocks as f64 / sized_best,
        "sized_stored_blocks_per_cpu_s": sized_cpu.map(|c| blocks as f64 / c),
        "stored_blocks_per_cpu_s": best_cpu.map(|c| blocks as f64 / c),
        "page_faults_per_apply": best_faults,
        "sized_page_faults_per_apply": sized_faults,
        "warm_stored_blocks_per_cpu_s": warm_cpu.map(|c| blocks as f64 / c),
        "warm_stored_events_per_s": stored_events as f64 / warm_s,
        "warm_stored_blocks_per_s": blocks as f64 / warm_s,
        "removed_events_per_s": removals.len() as f64 / remove_s,
        "removed_blocks_per_s": blocks as f64 / remove_s,
        "decode_apply_events_per_s": decode_apply_s.map(|s| stored_events as f64 / s),
        "decode_apply_blocks_per_s": decode_apply_s.map(|s| blocks as f64 / s),
        "hash_tokens": args.seq_tokens, "hash_p50_us": hash_p50, "hash_p99_us": hash_p99,
        "lookup_keys": keys.len(), "lookup_hit_blocks": hit_blocks, "lookup_best_match_blocks": matched,
        "lookup_p50_us": lookup_p50, "lookup_p99_us": lookup_p99,
        "memory": mem,
    });
    let mut report = json!({ "kvcore": ours });
    if let Some(d) = &dynamo {
        let ratio = |ours: f64, theirs: Option<f64>, higher_better: bool| {
            theirs.map(|t| if higher_better { ours / t } else { t / ours })
        };
        let f = |k: &str| d.get(k).and_then(Value::as_f64);
        report["dynamo"] = d.clone();
        report["ratio"] = json!({
            "stored_events_per_s": ratio(stored_events as f64 / best, f("stored_events_per_s"), true),
            "stored_blocks_per_s": ratio(blocks as f64 / best, f("stored_blocks_per_s"), true),
            "warm_stored_blocks_per_s": ratio(blocks as f64 / warm_s, f("warm_stored_blocks_per_s"), true),
            "stored_blocks_per_cpu_s": best_cpu.and_then(|c| ratio(blocks as f64 / c, f("stored_blocks_per_cpu_s"), true)),
            "warm_stored_blocks_per_cpu_s":
                warm_cpu.and_then(|c| ratio(blocks as f64 / c, f("warm_stored_blocks_per_cpu_s"), true)),
            "hash_p50": ratio(hash_p50, f("hash_p50_us"), false),
            "lookup_p50": ratio(lookup_p50, f("lookup_p50_us"), false),
        });
    }
    eprintln!("{:<34} {:>16} {:>16} {:>8}", "", "kvcore", "dynamo 1.6.1", "ratio");
    let row = |name: &str, ours: f64, key: &str, higher: bool| {
        let theirs = dynamo.as_ref().and_then(|d| d.get(key)).and_then(Value::as_f64);
        let r = theirs.map(|t| if higher { ours / t } else { t / ours });
        eprintln!(
            "{:<34} {:>16.2} {:>16} {:>8}",
            name,
            ours,
            theirs.map_or("-".into(), |t| format!("{t:.2}")),
            r.map_or("-".into(), |r| format!("{r:.1}x"))
        );
    };
    row("stored events/s", stored_events as f64 / best, "stored_events_per_s", true);
    row("stored blocks/s", blocks as f64 / best, "stored_blocks_per_s", true);
    row("stored blocks/s, sized tables", blocks as f64 / sized_best, "stored_blocks_per_s", true);
    row("stored blocks/s, warm tables", blocks as f64 / warm_s, "warm_stored_blocks_per_s", true);
    // Per CPU-second: kvcore's applying thread; Dynamo's whole process
    // (its Python thread and the tree's own thread).
    if let Some(c) = best_cpu {
        row("stored blocks per CPU-second", blocks as f64 / c, "stored_blocks_per_cpu_s", true);
    }
    if let Some(c) = sized_cpu {
        row("  same, sized tables", blocks as f64 / c, "-", true);
    }
    if let Some(c) = warm_cpu {
        row("  same, warm tables", blocks as f64 / c, "warm_stored_blocks_per_cpu_s", true);
    }
    if let Some(f) = best_faults {
        row("page faults per apply (fresh)", f, "-", true);
    }
    if let Some(f) = sized_faults {
        row("  same, sized tables", f, "-", true);
    }
    if let Some(s) = decode_apply_s {
        row("decoded and applied blocks/s", blocks as f64 / s, "-", true);
    }
    row("removed events/s", removals.len() as f64 / remove_s, "removed_events_per_s", true);
    row("hash 4096 tokens p50 (us)", hash_p50, "hash_p50_us", false);
    row("lookup 256 keys p50 (us)", lookup_p50, "lookup_p50_us", false);
    println!("{}", serde_json::to_string(&report)?);
    Ok(())
}
