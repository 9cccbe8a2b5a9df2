//! An existing router consumes our stream unchanged: NVIDIA Dynamo's
//! standalone KV indexer (PyPI `ai-dynamo-runtime==1.6.1`) subscribes to two
//! kvcore engines' publishers, and its per-worker overlap for queries hashed
//! by Dynamo's own `compute_block_hash_for_seq` must equal the prefix each
//! engine holds. Then, in both event forms and on three engines each: LoRA
//! and salt scopes, recovery after the replay ring moved on, idle engines
//! learned from their heartbeats, the same scopes through Dynamo's
//! in-process `KvRouter` (one front end process per engine), and a UUID two
//! engines hold for different pixels, through the standalone indexer and
//! the in-process `KvRouter`, with and without `kvcore_router::Relay`
//! between; every payload captured from the indexer tests is also decoded by
//! vLLM 0.33.0's own decoder, whose fields must mean what kvcore meant.
//! Hybrid models: a stream with a full-attention and a sliding-window group
//! scores in Dynamo as its main group alone, by hand-built events and end to
//! end from kvcore's hybrid engine beside a single-group twin.
//!
//! The Python side (tests/interop/) is installed into a virtualenv by
//! `setup_venv.sh` on first use and reused afterwards. Where Python or the
//! wheel cannot be had the test fails, saying why; set `KVCORE_SKIP_INTEROP=1`
//! to skip it explicitly on a machine that cannot run it (never honoured where
//! `CI` is set).

use std::io::{BufRead, BufReader, BufWriter, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::time::{Duration, Instant};

use kvcore::mm_hash_of_identifier;
use kvcore::wire::{EncodeOptions, EventForm, WireEvent, decode_payload};
use kvcore::{Engine, EngineConfig, MmContent, MmItemSpec, RequestSpec, TokenRun};
use kvcore::{Publisher, PublisherConfig};
use rand::{Rng, SeedableRng};
use serde_json::{Value, json};

const BLOCK: u32 = 32;
const VISION_START: u32 = 151_652;
const IMAGE_PAD: u32 = 151_655;
/// Device and host blocks of the engine behind the tiered fidelity test:
/// small enough that the chat requests offload blocks and evict host ones.
const TIERED_DEVICE: u32 = 96;
const TIERED_HOST: u32 = 128;
const VISION_END: u32 = 151_653;

fn repo() -> &'static Path {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../.."))
}

/// The venv's python, or `None` when the test is explicitly skipped. The
/// venv is set up once per test process, whichever test asks first (the
/// others wait for it).
fn python() -> Option<PathBuf> {
    static PYTHON: std::sync::OnceLock<Option<PathBuf>> = std::sync::OnceLock::new();
    PYTHON.get_or_init(setup_python).clone()
}

fn setup_python() -> Option<PathBuf> {
    if std::env::var("KVCORE_SKIP_INTEROP").is_ok_and(|v| v == "1") {
        // CI never skips: there the test must run or fail.
        assert!(std::env::var_os("CI").is_none(), "interop_dynamo: KVCORE_SKIP_INTEROP=1 is not honoured in CI");
        eprintln!("interop_dynamo: SKIPPED because KVCORE_SKIP_INTEROP=1");
        return None;
    }
    let out = Command::new("bash")
        .arg(repo().join("tests/interop/setup_venv.sh"))
        .stderr(Stdio::inherit())
        .output()
        .unwrap_or_else(|e| panic!("interop_dynamo: cannot run bash for tests/interop/setup_venv.sh: {e}"));
    assert!(
        out.status.success(),
        "interop_dynamo: tests/interop/setup_venv.sh failed ({}): Python 3.10+ with venv and pip, and PyPI access \
         for ai-dynamo-runtime==1.6.1, are needed (set KVCORE_SKIP_INTEROP=1 to skip on purpose)",
        out.status
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    let py = PathBuf::from(stdout.lines().last().unwrap_or_default().trim());
    assert!(py.exists(), "interop_dynamo: setup_venv.sh printed no python path ({stdout:?})");
    Some(py)
}

struct Probe {
    /// The indexer's HTTP port.
    port: u16,
    child: Child,
    stdin: BufWriter<ChildStdin>,
    stdout: BufReader<ChildStdout>,
}

impl Probe {
    fn start(python: &Path, workers: &str) -> Self {
        let mut child = Command::new(python)
            .arg(repo().join("tests/interop/dynamo_probe.py"))
            .args(["--block-size", &BLOCK.to_string(), "--workers", workers, "--port", "0"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("interop_dynamo: spawning dynamo_probe.py");
        let stdin = BufWriter::new(child.stdin.take().unwrap());
        let stdout = BufReader::new(child.stdout.take().unwrap());
        let mut p = Self { port: 0, child, stdin, stdout };
        let ready = p.read();
        assert_eq!(ready["ready"], true, "Dynamo's indexer did not start: {ready}");
        p.port = ready["port"].as_u64().and_then(|v| u16::try_from(v).ok()).expect("the indexer's port");
        p
    }

    fn read(&mut self) -> Value {
        let mut line = String::new();
        self.stdout.read_line(&mut line).expect("reading the probe");
        assert!(!line.is_empty(), "the probe exited");
        serde_json::from_str(&line).unwrap_or_else(|e| panic!("probe said {line:?}: {e}"))
    }

    fn call(&mut self, cmd: Value) -> Value {
        writeln!(self.stdin, "{cmd}").unwrap();
        self.stdin.flush().unwrap();
        let v = self.read();
        assert!(v.get("error").is_none(), "probe error for {cmd}: {v}");
        v
    }

    /// `POST path` with a JSON body to the indexer itself; returns the status code.
    fn post(&self, path: &str, body: &Value) -> u16 {
        use std::io::Read;
        let body = body.to_string();
        let mut s = std::net::TcpStream::connect(("127.0.0.1", self.port)).expect("connecting to the indexer");
        write!(
            s,
            "POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\
             Connection: close\r\n\r\n{body}",
            body.len()
        )
        .unwrap();
        let mut answer = String::new();
        s.read_to_string(&mut answer).unwrap();
        answer.split_whitespace().nth(1).and_then(|c| c.parse().ok()).unwrap_or(0)
    }

    fn applied(&mut self, what: &str) -> u64 {
        self.call(json!({"op": "metrics"}))["applied"][format!("{what}/ok")].as_u64().unwrap_or(0)
    }

    fn wait_applied(&mut self, stored: u64, removed: u64) {
        self.call(json!({"op": "wait_applied", "stored": stored, "removed": removed, "timeout_s": 20}));
    }

    /// Dynamo's overlap in tokens per worker for a query of `tokens`, hashed
    /// by Dynamo itself with the given per-block image identity.
    fn overlap(&mut self, tokens: &[u32], mm_infos: Option<Value>) -> (u64, u64) {
        let hashes =
            self.call(json!({"op": "hash", "tokens": tokens, "block_size": BLOCK, "block_mm_infos": mm_infos}));
        let scores = self.call(json!({"op": "query", "block_hashes": hashes["hashes"]}));
        let of = |w: &str| scores["scores"][w].as_u64().unwrap_or(0);
        (of("1"), of("2"))
    }
}

impl Drop for Probe {
    fn drop(&mut self) {
        let _ = writeln!(self.stdin, "{}", json!({"op": "quit"}));
        let _ = self.stdin.flush();
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A prompt with one image: 32 text tokens, vision start, 64 image pads,
/// vision end, 30 text tokens, and 2 more so that 4 blocks are full.
fn image_prompt(prefix: &[u32], suffix: &[u32]) -> Vec<u32> {
    let mut p = prefix.to_vec();
    p.push(VISION_START);
    p.extend(std::iter::repeat_n(IMAGE_PAD, 64));
    p.push(VISION_END);
    p.extend_from_slice(suffix);
    assert_eq!(p.len(), 130);
    p
}

/// Dynamo's per-block image identity for `image_prompt`, keyed the way a
/// frontend keys it: by the caller's UUID.
fn mm_infos(uuid: &str) -> Value {
    let h = mm_hash_of_identifier(uuid);
    let obj = |s: u32, e: u32| json!({"mm_objects": [{"mm_hash": h, "offsets": [[s, e]]}]});
    json!([null, obj(1, 32), obj(0, 32), obj(0, 1)])
}

fn spec<'a>(tokens: &'a [u32], image: Option<(&'a [u8], &'a str)>) -> RequestSpec<'a> {
    RequestSpec {
        tokens,
        items: image
            .map(|(bytes, _)| {
                vec![MmItemSpec { content: MmContent::Bytes(bytes), runs: vec![TokenRun { start: 33, len: 64 }] }]
            })
            .unwrap_or_default(),
        uuids: image.map(|(_, uuid)| vec![Some(uuid.as_bytes())]),
        ..Default::default()
    }
}

/// Serves a request fully: admit, compute `computed` tokens, finish, step.
fn serve(e: &mut Engine, tokens: &[u32], computed: u64, image: Option<(&[u8], &str)>) {
    let a = e.add_request(&spec(tokens, image)).unwrap();
    e.commit(a.id, computed).unwrap();
    e.finish(a.id).unwrap();
    e.step();
}

/// Tokens of `tokens` the engine holds as a cached prefix (admit, read, cancel).
fn held(e: &mut Engine, tokens: &[u32], image: Option<(&[u8], &str)>) -> u64 {
    let a = e.add_request(&spec(tokens, image)).unwrap();
    e.cancel(a.id).unwrap();
    a.tokens_cached.into()
}

fn engine_with_publisher() -> (Engine, String) {
    let mut e =
        Engine::new(EngineConfig { block_size_tokens: BLOCK, blocks_device: 256, ..Default::default() }).unwrap();
    let p = Publisher::bind(PublisherConfig {
        endpoint: "tcp://127.0.0.1:*".into(),
        replay_endpoint: None,
        ..Default::default()
    })
    .unwrap();
    let endpoint = p.endpoint().to_owned();
    e.attach_publisher(p);
    (e, endpoint)
}

/// Publishes `AllBlocksCleared` from `e` until Dynamo has applied one more
/// clear than `before`: the subscription is live (ZMQ's slow joiner).
fn join(probe: &mut Probe, e: &mut Engine) {
    let before = probe.applied("cleared");
    let deadline = Instant::now() + Duration::from_secs(30);
    while probe.applied("cleared") <= before {
        assert!(Instant::now() < deadline, "Dynamo's indexer never received our stream");
        e.clear();
        e.step();
        std::thread::sleep(Duration::from_millis(100));
    }
    // Let the remaining probes land before the next worker is checked.
    std::thread::sleep(Duration::from_millis(300));
}

/// Text and image workloads with UUID hints on two engines; Dynamo's overlap
/// must equal each engine's held prefix, a different image with the same
/// placeholders must not match, the worker holding the image prefix must
/// score highest, and eviction must drop the overlap.
#[test]
fn dynamo_indexer_consumes_our_stream_unchanged() {
    let Some(python) = python() else { return };
    let (mut e1, ep1) = engine_with_publisher();
    let (mut e2, ep2) = engine_with_publisher();
    let mut probe = Probe::start(&python, &format!("1={ep1},2={ep2}"));
    join(&mut probe, &mut e1);
    join(&mut probe, &mut e2);

    let mut rng = rand::rngs::StdRng::seed_from_u64(1337);
    let mut text = |n: usize| (0..n).map(|_| rng.random_range(1000..60_000)).collect::<Vec<u32>>();
    let t1 = text(130);
    let (prefix, suffix) = (text(32), text(32));
    let prompt = image_prompt(&prefix, &suffix);
    let a: (&[u8], &str) = (b"pixels of image A", "0f1e2d3c-image-a");
    let b: (&[u8], &str) = (b"pixels of image B", "9a8b7c6d-image-b");
    let c: (&[u8], &str) = (b"pixels of image C", "55555555-image-c");

    let stored_before = probe.applied("stored");
    serve(&mut e1, &t1, 130, None); // worker 1: 4 text blocks
    serve(&mut e1, &prompt, 130, Some(a)); // worker 1: image A, 4 blocks
    serve(&mut e2, &t1[..70], 70, None); // worker 2: 2 text blocks
    serve(&mut e2, &prompt, 130, Some(b)); // worker 2: image B, same placeholders
    probe.wait_applied(stored_before + 4, 0);

    // Text: overlap equals what each engine holds.
    let (d1, d2) = probe.overlap(&t1, None);
    assert_eq!((d1, d2), (held(&mut e1, &t1, None), held(&mut e2, &t1, None)));
    assert_eq!((d1, d2), (128, 64));

    // Image A: worker 1 holds all of it; worker 2 only the shared text block,
    // because its image B has the same placeholder tokens but another identity.
    let (d1, d2) = probe.overlap(&prompt, Some(mm_infos(a.1)));
    assert_eq!((d1, d2), (held(&mut e1, &prompt, Some(a)), held(&mut e2, &prompt, Some(a))));
    assert_eq!((d1, d2), (128, 32));
    assert!(d1 > d2, "the worker holding image A's prefix scores highest");
    let (d1, d2) = probe.overlap(&prompt, Some(mm_infos(b.1)));
    assert_eq!((d1, d2), (held(&mut e1, &prompt, Some(b)), held(&mut e2, &prompt, Some(b))));
    assert_eq!((d1, d2), (32, 128));

    // An image no one holds, with the same placeholder tokens: no match past
    // the text; and a query that ignores images does not match either.
    let (d1, d2) = probe.overlap(&prompt, Some(mm_infos(c.1)));
    assert_eq!((d1, d2), (held(&mut e1, &prompt, Some(c)), held(&mut e2, &prompt, Some(c))));
    assert_eq!((d1, d2), (32, 32));
    assert_eq!(probe.overlap(&prompt, None), (32, 32));

    // Eviction: worker 1 drops everything, its overlap drops to what it holds.
    let removed_before = probe.applied("removed");
    assert_eq!(e1.evict(1000), 8);
    e1.step();
    probe.wait_applied(0, removed_before + 1);
    let (d1, d2) = probe.overlap(&t1, None);
    assert_eq!((d1, d2), (held(&mut e1, &t1, None), 64));
    assert_eq!(d1, 0);
    let (d1, d2) = probe.overlap(&prompt, Some(mm_infos(b.1)));
    assert_eq!((d1, d2), (0, 128));
}

/// Batches that Dynamo missed (published before it subscribed) must come back
/// through our replay socket: Dynamo sees the gap, asks our ROUTER for the
/// missing sequence numbers, and then holds what the engine holds.
#[test]
fn dynamo_recovers_missed_batches_through_our_replay_socket() {
    let Some(python) = python() else { return };
    let mut e =
        Engine::new(EngineConfig { block_size_tokens: BLOCK, blocks_device: 64, ..Default::default() }).unwrap();
    let p = Publisher::bind(PublisherConfig {
        endpoint: "tcp://127.0.0.1:*".into(),
        replay_endpoint: Some("tcp://127.0.0.1:*".into()),
        ..Default::default()
    })
    .unwrap();
    let (endpoint, replay) = (p.endpoint().to_owned(), p.replay_endpoint().unwrap().to_owned());
    e.attach_publisher(p);
    // The indexer starts with an unrelated worker only; ours registers later.
    let mut probe = Probe::start(&python, "1=tcp://127.0.0.1:9");
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    let prompts: Vec<Vec<u32>> = (0..4).map(|_| (0..70).map(|_| rng.random_range(1000..60_000)).collect()).collect();
    // Three batches nobody receives: PUB drops them, our ring keeps them.
    for prompt in &prompts[..3] {
        serve(&mut e, prompt, 70, None);
    }
    let stored_before = probe.applied("stored");
    let status = probe.post(
        "/register",
        &json!({"instance_id": 3, "endpoint": endpoint, "model_name": "default", "block_size": BLOCK,
                "replay_endpoint": replay}),
    );
    assert_eq!(status, 201, "Dynamo accepted the registration");
    // Live batches until Dynamo has one (its subscription joins with a delay);
    // the first it sees shows the gap, and it replays the rest from us.
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut live = 0;
    while probe.applied("stored") == stored_before {
        assert!(Instant::now() < deadline, "Dynamo never received our stream");
        let prompt: Vec<u32> = (0..70).map(|i| 2000 + live * 100 + i).collect();
        serve(&mut e, &prompt, 70, None);
        live += 1;
        std::thread::sleep(Duration::from_millis(200));
    }
    probe.wait_applied(stored_before + 3 + u64::from(live), 0);
    for prompt in &prompts[..3] {
        let tokens = [&prompt[..], &[1, 2][..]].concat();
        let want = held(&mut e, &tokens, None);
        assert_eq!(want, 64);
        let hashes = probe.call(json!({"op": "hash", "tokens": tokens, "block_size": BLOCK}));
        let scores = probe.call(json!({"op": "query", "block_hashes": hashes["hashes"]}));
        assert_eq!(scores["scores"]["3"].as_u64(), Some(want), "a replayed batch is in Dynamo's index: {scores}");
    }
    assert!(e.publisher().unwrap().stats().replays_served >= 1);
}

/// `kvcore route-bench --dynamo` drives both indexers over the very same
/// events: run it small against the real wheel and check that both sides
/// stored the same blocks, found the same best match for the same lookup,
/// timed Dynamo as often as kvcore, and that every wall-clock ratio is a
/// positive number (the CPU-time ones too, where the runs were long enough
/// for the thread CPU clock to see them).
#[test]
fn route_bench_measures_both_sides_on_the_same_events() {
    let Some(py) = python() else { return };
    let venv = py.parent().and_then(Path::parent).expect("venv/bin/python");
    let out = Command::new(env!("CARGO_BIN_EXE_kvcore"))
        .args(["route-bench", "--dynamo", "--repo"])
        .arg(repo())
        .args(["--sequences", "16", "--seq-tokens", "512", "--lookup-keys", "32", "--iters", "20", "--repeats", "2"])
        .env("KVCORE_DYNAMO_VENV", venv)
        .output()
        .expect("run kvcore route-bench");
    assert!(out.status.success(), "route-bench failed: {}", String::from_utf8_lossy(&out.stderr));
    let report: Value = serde_json::from_slice(&out.stdout).expect("one JSON report on stdout");
    let (ours, theirs) = (&report["kvcore"], &report["dynamo"]);
    // 16 sequences of 512 tokens in blocks of 32.
    assert_eq!(ours["stored_blocks"], json!(256));
    assert_eq!(theirs["stored_blocks"], json!(256));
    assert_eq!(theirs["repeats"], json!(2));
    // The lookup: the 16 keys of one stored sequence, then unseen keys.
    assert_eq!(ours["lookup_best_match_blocks"], json!(16));
    assert_eq!(theirs["lookup_best_match_blocks"], json!(16));
    assert_eq!(theirs["lookup_after_removals"], json!(0));
    for key in ["stored_events_per_s", "stored_blocks_per_s", "warm_stored_blocks_per_s", "hash_p50", "lookup_p50"] {
        let r = report["ratio"][key].as_f64();
        assert!(r.is_some_and(|r| r.is_finite() && r > 0.0), "ratio {key}: {:?}", report["ratio"][key]);
    }
    for key in ["stored_blocks_per_cpu_s", "warm_stored_blocks_per_cpu_s"] {
        let r = &report["ratio"][key];
        assert!(r.is_null() || r.as_f64().is_some_and(|r| r.is_finite() && r > 0.0), "ratio {key}: {r:?}");
    }
}

// ---------------------------------------------------------------------------
// The event classes routers disagreed on, each against Dynamo 1.6.1's real
// indexer in both event forms, with every captured payload also decoded by
// vLLM 0.33.0's own decoder (tests/interop/vllm_decoder.py).

/// vLLM 0.33.0's decoder's python (venv and decoder source set up by
/// `setup_vllm_decoder.sh` on first use), or `None` when interop tests are
/// skipped explicitly.
fn vllm_python() -> Option<PathBuf> {
    static PYTHON: std::sync::OnceLock<Option<PathBuf>> = std::sync::OnceLock::new();
    PYTHON
        .get_or_init(|| {
            python()?;
            let out = Command::new("bash")
                .arg(repo().join("tests/interop/setup_vllm_decoder.sh"))
                .stderr(Stdio::inherit())
                .output()
                .expect("interop_dynamo: cannot run bash for tests/interop/setup_vllm_decoder.sh");
            assert!(
                out.status.success(),
                "interop_dynamo: setup_vllm_decoder.sh failed ({}): Python 3.10+ with venv and pip, PyPI access for \
                 msgspec and HTTP range requests to files.pythonhosted.org for vLLM 0.33.0's kv_events.py are needed",
                out.status
            );
            let stdout = String::from_utf8_lossy(&out.stdout);
            Some(PathBuf::from(stdout.lines().last().unwrap_or_default().trim()))
        })
        .clone()
}

/// Collects every message a publisher sends, from a `SUB` of its own.
struct Capture {
    sub: zmq::Socket,
    form: EventForm,
    payloads: Vec<Vec<u8>>,
}

impl Capture {
    fn new(ctx: &zmq::Context, endpoint: &str, form: EventForm) -> Self {
        let sub = ctx.socket(zmq::SUB).unwrap();
        sub.set_subscribe(b"").unwrap();
        sub.set_rcvhwm(0).unwrap();
        sub.connect(endpoint).unwrap();
        Self { sub, form, payloads: Vec::new() }
    }

    /// Publishes clears from `e` until this capture has one (ZMQ's slow
    /// joiner), so that nothing after it is missed.
    fn join(&mut self, e: &mut Engine) {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            e.clear();
            e.step();
            std::thread::sleep(Duration::from_millis(50));
            self.drain();
            if !self.payloads.is_empty() {
                return;
            }
            assert!(Instant::now() < deadline, "the capture never joined");
        }
    }

    fn drain(&mut self) {
        while let Ok(frames) = self.sub.recv_multipart(zmq::DONTWAIT) {
            self.payloads.push(frames[2].clone());
        }
    }
}

/// Decodes every payload with vLLM 0.33.0's own decoder and checks that what
/// it reads means what kvcore meant: the same hashes, parents, tokens, block
/// size, medium and LoRA name; in the array form the cache salt (tagged) and
/// each block's image identity in `extra_keys`; and nothing in vLLM's slots
/// kvcore has no value for (a salt must never read as a `session_id`).
fn check_with_vllm(python: &Path, payloads: &[(EventForm, Vec<u8>)]) -> usize {
    let mut child = Command::new(python)
        .arg(repo().join("tests/interop/vllm_decoder.py"))
        .arg("--cache")
        .arg(python.parent().and_then(Path::parent).unwrap().join("cache"))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("spawning vllm_decoder.py");
    {
        let mut stdin = BufWriter::new(child.stdin.take().unwrap());
        for (form, p) in payloads {
            let form = if *form == EventForm::Array { "array" } else { "map" };
            let hex: String = p.iter().map(|b| format!("{b:02x}")).collect();
            writeln!(stdin, "{}", json!({"form": form, "payload": hex})).unwrap();
        }
    }
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "vllm_decoder.py failed");
    let answers: Vec<Value> =
        String::from_utf8_lossy(&out.stdout).lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(answers.len(), payloads.len());
    let mut stored = 0;
    for ((form, p), v) in payloads.iter().zip(&answers) {
        assert_eq!(v["ok"], true, "vLLM 0.33.0 refused a {form:?} payload: {v}");
        let ours = decode_payload(p).unwrap();
        // (JSON in between: equal to the microsecond.)
        assert!(v["ts"].as_f64().is_some_and(|ts| (ts - ours.ts).abs() < 1e-6), "ts {} vs {}", v["ts"], ours.ts);
        assert_eq!(v["data_parallel_rank"].as_i64(), ours.data_parallel_rank);
        let events = v["events"].as_array().unwrap();
        assert_eq!(events.len(), ours.events.len());
        for (w, e) in ours.events.iter().zip(events) {
            match w {
                WireEvent::BlockStored(s) => {
                    stored += 1;
                    assert_eq!(e["type"], "BlockStored");
                    let u = |h: i64| json!(h as u64);
                    let hashes: Vec<Value> = s.block_hashes.iter().map(|h| u(*h)).collect();
                    assert!(e["block_hashes"] == json!(hashes) || e["block_hashes"] == json!(s.block_hashes), "{e}");
                    assert!(
                        e["parent_block_hash"] == json!(s.parent_block_hash)
                            || e["parent_block_hash"] == json!(s.parent_block_hash.map(|h| h as u64)),
                        "{e}"
                    );
                    assert_eq!(e["token_ids"], json!(s.token_ids.clone().unwrap_or_default()));
                    assert_eq!(e["block_size"], json!(s.block_size));
                    assert_eq!(e["lora_id"], json!(s.lora_id));
                    assert_eq!(e["medium"], json!(s.medium));
                    assert_eq!(e["lora_name"], json!(s.lora_name));
                    // The group fields where kvcore wrote them, absent for a
                    // single-group engine.
                    assert_eq!(e["group_idx"], json!(s.group_idx), "{e}");
                    assert_eq!(e["kv_cache_spec_kind"], json!(s.kv_cache_spec_kind), "{e}");
                    assert_eq!(e["kv_cache_spec_sliding_window"], json!(s.kv_cache_spec_sliding_window), "{e}");
                    assert!(e["locality"].is_null(), "vLLM reads locality = {} from kvcore: {e}", e["locality"]);
                    for slot in ["ownership", "session_id", "lookahead_token_ids"] {
                        assert!(e[slot].is_null(), "vLLM reads {slot} = {} from kvcore: {e}", e[slot]);
                    }
                    let keys = &e["extra_keys"];
                    if *form == EventForm::Map {
                        assert!(keys.is_null());
                        continue;
                    }
                    let tag = |salt: &str| json!(format!("dynamo-cache-salt:{salt}"));
                    let first = keys.get(0).and_then(Value::as_array).cloned().unwrap_or_default();
                    match &s.cache_salt {
                        Some(salt) => assert!(first.contains(&tag(salt)), "the salt in extra_keys[0]: {e}"),
                        None => assert!(
                            !first.iter().any(|k| k.as_str().is_some_and(|t| t.starts_with("dynamo-cache-"))),
                            "{e}"
                        ),
                    }
                    for (i, info) in s.block_mm_infos.clone().unwrap_or_default().iter().enumerate() {
                        let markers: Vec<u64> = keys[i]
                            .as_array()
                            .map(Vec::as_slice)
                            .unwrap_or_default()
                            .iter()
                            .filter_map(|k| k[0].as_str())
                            .filter_map(|m| u64::from_str_radix(&m[..16], 16).ok().filter(|_| m.len() == 64))
                            .collect();
                        let want: Vec<u64> = info.iter().flat_map(|i| i.mm_objects.iter().map(|o| o.mm_hash)).collect();
                        assert_eq!(markers, want, "block {i}'s image identity in extra_keys: {e}");
                    }
                }
                WireEvent::BlockRemoved(r) => {
                    assert_eq!(e["type"], "BlockRemoved");
                    assert_eq!(e["medium"], json!(r.medium));
                    assert_eq!(e["block_hashes"].as_array().unwrap().len(), r.block_hashes.len());
                    assert_eq!(e["group_idx"], json!(r.group_idx), "{e}");
                    assert!(e["locality"].is_null() && e["ownership"].is_null(), "{e}");
                }
                WireEvent::AllBlocksCleared => assert_eq!(e["type"], "AllBlocksCleared"),
                WireEvent::Unknown { .. } => panic!("kvcore never publishes an unknown event"),
            }
        }
    }
    stored
}

/// An engine of block size `BLOCK` whose publisher (started through the
/// engine, so it carries the engine's hash profile) encodes in `form`.
fn engine_in_form(form: EventForm, replay: bool, buffer_steps: usize, heartbeat_ms: u32) -> Engine {
    engine_with_tiers(form, replay, buffer_steps, heartbeat_ms, 256, 0)
}

/// An engine of `blocks_device` device and `blocks_host` host blocks whose
/// publisher sends in `form`.
fn engine_with_tiers(
    form: EventForm,
    replay: bool,
    buffer_steps: usize,
    heartbeat_ms: u32,
    blocks_device: u32,
    blocks_host: u32,
) -> Engine {
    let mut e =
        Engine::new(EngineConfig { block_size_tokens: BLOCK, blocks_device, blocks_host, ..Default::default() })
            .unwrap();
    e.vacant_publisher()
        .unwrap()
        .start(PublisherConfig {
            endpoint: "tcp://127.0.0.1:*".into(),
            replay_endpoint: replay.then(|| "tcp://127.0.0.1:*".into()),
            buffer_steps,
            heartbeat_ms,
            encode: EncodeOptions { form, token_ids: true },
            ..Default::default()
        })
        .unwrap();
    e
}

fn endpoints(e: &Engine) -> (String, Option<String>) {
    let p = e.publisher().unwrap();
    (p.endpoint().to_owned(), p.replay_endpoint().map(str::to_owned))
}

/// Dynamo's overlap in tokens per worker id, for `tokens` hashed by Dynamo
/// with the given LoRA name, cache salt and image identity.
fn scores(probe: &mut Probe, tokens: &[u32], lora: Option<&str>, salt: Option<&str>, mm: Option<Value>) -> Value {
    let hashes = probe.call(json!({"op": "hash", "tokens": tokens, "block_size": BLOCK, "block_mm_infos": mm,
                                   "lora_name": lora, "cache_namespace": salt}));
    probe.call(json!({"op": "query", "block_hashes": hashes["hashes"]}))["scores"].clone()
}

fn serve_spec(e: &mut Engine, spec: &RequestSpec<'_>) {
    let a = e.add_request(spec).unwrap();
    e.commit(a.id, spec.tokens.len() as u64).unwrap();
    e.finish(a.id).unwrap();
    e.step();
}

/// Three engines hold the same text: one under a LoRA adapter (id and name),
/// one under a cache salt, one as the base model, plus an image on the base
/// engine. Dynamo must keep the scopes apart in both forms: each query scope
/// matches its own engine only. An adapter id without a name is refused by
/// the engine and never reaches the stream.
#[test]
fn dynamo_keeps_lora_and_salt_scopes_apart_in_both_forms() {
    let Some(python) = python() else { return };
    let vllm = vllm_python().expect("the vLLM decoder when Dynamo's venv is there");
    let ctx = zmq::Context::new();
    let mut captured = Vec::new();
    for form in [EventForm::Map, EventForm::Array] {
        let mut engines: Vec<Engine> = (0..3).map(|_| engine_in_form(form, false, 100, 0)).collect();
        let workers: Vec<String> =
            engines.iter().enumerate().map(|(i, e)| format!("{}={}", i + 1, endpoints(e).0)).collect();
        let mut captures: Vec<Capture> = engines.iter().map(|e| Capture::new(&ctx, &endpoints(e).0, form)).collect();
        for (c, e) in captures.iter_mut().zip(&mut engines) {
            c.join(e);
        }
        let mut probe = Probe::start(&python, &workers.join(","));
        for e in &mut engines {
            join(&mut probe, e);
        }
        let mut rng = rand::rngs::StdRng::seed_from_u64(20);
        let text: Vec<u32> = (0..130).map(|_| rng.random_range(1000..60_000)).collect();
        let prompt = image_prompt(&text[..32], &text[32..64]);
        let a: (&[u8], &str) = (b"pixels of image A", "0f1e2d3c-image-a");
        let stored_before = probe.applied("stored");
        let lora = RequestSpec { tokens: &text, lora_id: Some(5), lora_name: Some("adapter-a"), ..Default::default() };
        serve_spec(&mut engines[0], &lora);
        serve_spec(&mut engines[1], &RequestSpec { tokens: &text, cache_salt: Some("tenant-b"), ..Default::default() });
        serve(&mut engines[2], &text, 130, None);
        serve(&mut engines[2], &prompt, 130, Some(a));
        // The engine refuses an adapter a router could not tell from the base model.
        let unnamed = RequestSpec { tokens: &text, lora_id: Some(6), ..Default::default() };
        assert!(matches!(engines[0].add_request(&unnamed), Err(kvcore::AdmitError::LoraNameRequired { lora_id: 6 })));
        engines[0].step();
        probe.wait_applied(stored_before + 4, 0);

        let only = |w: &str, tokens: u64| {
            let mut m = serde_json::Map::new();
            m.insert(w.into(), json!(tokens));
            Value::Object(m)
        };
        assert_eq!(scores(&mut probe, &text, Some("adapter-a"), None, None), only("1", 128), "{form:?} LoRA");
        assert_eq!(scores(&mut probe, &text, None, Some("tenant-b"), None), only("2", 128), "{form:?} salt");
        assert_eq!(scores(&mut probe, &text, None, None, None), only("3", 128), "{form:?} base model");
        assert_eq!(scores(&mut probe, &text, Some("adapter-b"), None, None), json!({}), "{form:?} other adapter");
        // Image identity: the base engine holds image A's whole prompt.
        assert_eq!(scores(&mut probe, &prompt, None, None, Some(mm_infos(a.1))), only("3", 128), "{form:?} image");
        assert_eq!(scores(&mut probe, &prompt, None, None, Some(mm_infos("other"))), only("3", 32), "{form:?}");
        for c in &mut captures {
            c.drain();
            captured.extend(c.payloads.drain(..).map(|p| (c.form, p)));
        }
    }
    assert!(check_with_vllm(&vllm, &captured) >= 8, "every store of both forms was checked");
}

/// One prompt an engine of a fleet test served, under the request scope it
/// was served with: a LoRA adapter (id 7 and its name), a cache salt, an
/// image with its caller's UUID.
#[derive(Clone)]
struct Served {
    tokens: Vec<u32>,
    lora: Option<&'static str>,
    salt: Option<&'static str>,
    image: Option<(&'static [u8], &'static str)>,
}

impl Served {
    fn text(tokens: Vec<u32>) -> Self {
        Self { tokens, lora: None, salt: None, image: None }
    }

    fn spec(&self) -> RequestSpec<'_> {
        RequestSpec {
            lora_id: self.lora.map(|_| 7),
            lora_name: self.lora,
            cache_salt: self.salt,
            ..spec(&self.tokens, self.image)
        }
    }

    /// Serves it fully on `e` (one batch).
    fn serve(&self, e: &mut Engine) {
        serve_spec(e, &self.spec());
    }

    /// Tokens of it `e` holds as a cached prefix, in its own scope.
    fn held(&self, e: &mut Engine) -> u64 {
        let a = e.add_request(&self.spec()).unwrap();
        e.cancel(a.id).unwrap();
        a.tokens_cached.into()
    }

    /// Dynamo's scores for it, hashed by Dynamo in its own scope.
    fn scores(&self, probe: &mut Probe) -> Value {
        scores(probe, &self.tokens, self.lora, self.salt, self.image.map(|(_, uuid)| mm_infos(uuid)))
    }
}

/// `{worker: tokens}`, or `{}` when it holds nothing: how the probe reports
/// a query only `worker` matches.
fn only(worker: u64, tokens: u64) -> Value {
    let mut m = serde_json::Map::new();
    if tokens > 0 {
        m.insert(worker.to_string(), json!(tokens));
    }
    Value::Object(m)
}

/// Registers an engine with Dynamo's indexer under `id`, with its replay socket.
fn register(probe: &Probe, id: u64, e: &Engine) {
    let (endpoint, replay) = endpoints(e);
    let status = probe.post(
        "/register",
        &json!({"instance_id": id, "endpoint": endpoint, "model_name": "default", "block_size": BLOCK,
                "replay_endpoint": replay}),
    );
    assert_eq!(status, 201, "Dynamo accepted worker {id}");
}

/// Waits until Dynamo's scores for every prompt of every worker are exactly
/// `only(worker, what the engine holds of it)`: nothing missing, nothing
/// stale, nothing credited to another worker. Fails with the first
/// difference after 20 s.
fn await_exact(probe: &mut Probe, fleet: &mut [(u64, &mut Engine, Vec<Served>)], what: &str) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let mut diff = None;
        'check: for (id, e, prompts) in fleet.iter_mut() {
            for p in prompts.iter() {
                let want = only(*id, p.held(e));
                let got = p.scores(probe);
                if got != want {
                    diff = Some(format!("worker {id}: Dynamo says {got}, the engine holds {want}"));
                    break 'check;
                }
            }
        }
        let Some(diff) = diff else { return };
        assert!(Instant::now() < deadline, "{what}: {diff}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Three engines whose publishers Dynamo registers late, in both forms: two
/// whose replay rings no longer hold their first batches (one of text it
/// partly evicted before, one of LoRA prompts and an image), and one whose
/// ring still holds everything (salted prompts). Dynamo asks each a replay
/// from 0 and, through the replay protocol unchanged, gets a snapshot from
/// the two and the ring's batches from the third; afterwards it holds
/// exactly what each engine holds, and later live batches, removals
/// included, apply on top without anything stale.
#[test]
fn dynamo_reaches_the_exact_state_after_the_ring_moved_on() {
    let Some(python) = python() else { return };
    let vllm = vllm_python().expect("the vLLM decoder when Dynamo's venv is there");
    let ctx = zmq::Context::new();
    let mut captured = Vec::new();
    let image: (&[u8], &str) = (b"pixels of image R", "7c1d0e2f-image-r");
    for (k, form) in [EventForm::Map, EventForm::Array].into_iter().enumerate() {
        // Rings of 2, 2 and 100 batches.
        let mut engines: Vec<Engine> =
            [2, 2, 100].into_iter().map(|ring| engine_in_form(form, true, ring, 0)).collect();
        let mut captures: Vec<Capture> = engines.iter().map(|e| Capture::new(&ctx, &endpoints(e).0, form)).collect();
        for (c, e) in captures.iter_mut().zip(&mut engines) {
            c.join(e);
        }
        let mut probe = Probe::start(&python, "1=tcp://127.0.0.1:9");
        let mut rng = rand::rngs::StdRng::seed_from_u64(40 + k as u64);
        let mut text = |n: usize| (0..n).map(|_| rng.random_range(1000..60_000)).collect::<Vec<u32>>();
        let mut served: Vec<Vec<Served>> = vec![
            (0..5).map(|_| Served::text(text(70))).collect(),
            (0..3).map(|_| Served { lora: Some("adapter-r"), ..Served::text(text(70)) }).collect(),
            (0..2).map(|_| Served { salt: Some("tenant-r"), ..Served::text(text(70)) }).collect(),
        ];
        let (prefix, suffix) = (text(32), text(32));
        served[1].push(Served { image: Some(image), ..Served::text(image_prompt(&prefix, &suffix)) });
        // Batches nobody hears: 6, 4 and 2; rings of 2, 2 and 100.
        for (e, prompts) in engines.iter_mut().zip(&served) {
            for p in prompts {
                p.serve(e);
            }
        }
        // Engine 1 evicts some blocks before Dynamo comes: its snapshot must
        // not bring them back.
        assert_eq!(engines[0].evict(2), 2);
        engines[0].step();
        assert!(served[0].iter().any(|p| p.held(&mut engines[0]) < 64), "an early prefix was evicted");
        let ids = [3u64, 4, 5];
        for (id, e) in ids.iter().zip(&engines) {
            register(&probe, *id, e);
        }
        // Live batches until Dynamo holds each engine's latest (its
        // subscriptions join with a delay); the first it sees shows the gap
        // from 0.
        let deadline = Instant::now() + Duration::from_secs(30);
        for (i, (id, e)) in ids.iter().zip(&mut engines).enumerate() {
            for live in 0u32.. {
                let p = Served::text((0..70).map(|t| 30_000 + i as u32 * 5_000 + live * 100 + t).collect());
                p.serve(e);
                served[i].push(p.clone());
                std::thread::sleep(Duration::from_millis(200));
                if p.scores(&mut probe).get(id.to_string()).is_some() {
                    break;
                }
                assert!(Instant::now() < deadline, "{form:?}: Dynamo never received worker {id}'s stream");
            }
        }
        let mut fleet: Vec<(u64, &mut Engine, Vec<Served>)> =
            ids.iter().copied().zip(engines.iter_mut()).zip(served.clone()).map(|((id, e), s)| (id, e, s)).collect();
        await_exact(&mut probe, &mut fleet, &format!("{form:?}: after the replays"));
        drop(fleet);
        for (i, e) in engines.iter().enumerate() {
            let stats = e.publisher().unwrap().stats();
            assert!(stats.replays_served >= 1, "engine {}: {stats:?}", i + 1);
            if i < 2 {
                assert!(stats.replays_answered_by_snapshot >= 1, "engine {}: {stats:?}", i + 1);
            } else {
                assert_eq!(stats.replays_answered_by_snapshot, 0, "the ring still held it all: {stats:?}");
            }
        }
        // Later live batches apply cleanly on top: each engine evicts
        // everything and stores one new prompt in its own scope.
        for (i, e) in engines.iter_mut().enumerate() {
            e.evict(10_000);
            e.step();
            let tokens: Vec<u32> = (0..70).map(|t| 50_000 + i as u32 * 1_000 + t).collect();
            let scope = served[i][0].clone();
            let fresh = Served { tokens, image: None, ..scope };
            fresh.serve(e);
            assert_eq!(fresh.held(e), 64);
            served[i].push(fresh);
        }
        let mut fleet: Vec<(u64, &mut Engine, Vec<Served>)> =
            ids.iter().copied().zip(engines.iter_mut()).zip(served.clone()).map(|((id, e), s)| (id, e, s)).collect();
        await_exact(&mut probe, &mut fleet, &format!("{form:?}: after later live batches"));
        drop(fleet);
        for (i, prompts) in served.iter().enumerate() {
            let last = prompts.last().unwrap().scores(&mut probe);
            assert_eq!(last, only(ids[i], 64), "{form:?}: worker {}'s newest prompt", ids[i]);
            assert!(prompts[..prompts.len() - 1].iter().all(|p| p.scores(&mut probe) == json!({})), "{form:?}");
        }
        // Each snapshot as a replay reply, decoded by vLLM too.
        for (c, e) in captures.iter_mut().zip(&engines) {
            let dealer = ctx.socket(zmq::DEALER).unwrap();
            dealer.set_rcvtimeo(5000).unwrap();
            dealer.connect(&endpoints(e).1.unwrap()).unwrap();
            dealer.send_multipart([&b""[..], &0u64.to_be_bytes()[..]], 0).unwrap();
            let reply = dealer.recv_multipart(0).unwrap();
            c.drain();
            captured.extend(c.payloads.drain(..).map(|p| (form, p)));
            captured.push((form, reply[3].clone()));
        }
    }
    assert!(check_with_vllm(&vllm, &captured) >= 2 * 12, "every store of both forms was checked");
}

/// Three engines that Dynamo registers late, in both forms: two went idle
/// before (one of text, one of LoRA prompts and an image), one keeps serving
/// (salted prompts, then a live batch every 200 ms). With heartbeats Dynamo
/// sees each idle stream's number within one heartbeat, replays the gap and
/// holds exactly what each engine holds, though the idle ones never step
/// again; later live batches on all three apply on top.
#[test]
fn dynamo_learns_an_idle_engine_from_its_heartbeats() {
    let Some(python) = python() else { return };
    let vllm = vllm_python().expect("the vLLM decoder when Dynamo's venv is there");
    let ctx = zmq::Context::new();
    let mut captured = Vec::new();
    let image: (&[u8], &str) = (b"pixels of image H", "1b2c3d4e-image-h");
    for (k, form) in [EventForm::Map, EventForm::Array].into_iter().enumerate() {
        let mut engines: Vec<Engine> = (0..3).map(|_| engine_in_form(form, true, 100, 200)).collect();
        let mut captures: Vec<Capture> = engines.iter().map(|e| Capture::new(&ctx, &endpoints(e).0, form)).collect();
        for (c, e) in captures.iter_mut().zip(&mut engines) {
            c.join(e);
        }
        let mut probe = Probe::start(&python, "1=tcp://127.0.0.1:9");
        let mut rng = rand::rngs::StdRng::seed_from_u64(60 + k as u64);
        let mut text = |n: usize| (0..n).map(|_| rng.random_range(1000..60_000)).collect::<Vec<u32>>();
        let mut served: Vec<Vec<Served>> = vec![
            (0..3).map(|_| Served::text(text(70))).collect(),
            (0..2).map(|_| Served { lora: Some("adapter-h"), ..Served::text(text(70)) }).collect(),
            (0..2).map(|_| Served { salt: Some("tenant-h"), ..Served::text(text(70)) }).collect(),
        ];
        let (prefix, suffix) = (text(32), text(32));
        served[1].push(Served { image: Some(image), ..Served::text(image_prompt(&prefix, &suffix)) });
        for (e, prompts) in engines.iter_mut().zip(&served) {
            for p in prompts {
                p.serve(e);
            }
        }
        // Engines 1 and 2 are idle from here on: no step, no request.
        let ids = [4u64, 5, 6];
        for (id, e) in ids.iter().zip(&engines) {
            register(&probe, *id, e);
        }
        let deadline = Instant::now() + Duration::from_secs(20);
        let mut live = 0u32;
        loop {
            // Engine 3 is busy: a live batch each round.
            let p =
                Served { salt: Some("tenant-h"), ..Served::text((0..70).map(|t| 30_000 + live * 100 + t).collect()) };
            p.serve(&mut engines[2]);
            served[2].push(p);
            live += 1;
            std::thread::sleep(Duration::from_millis(200));
            let learned: Vec<bool> = ids
                .iter()
                .zip(&served)
                .map(|(id, s)| s.last().unwrap().scores(&mut probe).get(id.to_string()).is_some())
                .collect();
            if learned.iter().all(|l| *l) {
                break;
            }
            assert!(Instant::now() < deadline, "{form:?}: Dynamo never learned these workers' state: {learned:?}");
        }
        let mut fleet: Vec<(u64, &mut Engine, Vec<Served>)> =
            ids.iter().copied().zip(engines.iter_mut()).zip(served.clone()).map(|((id, e), s)| (id, e, s)).collect();
        await_exact(&mut probe, &mut fleet, &format!("{form:?}: after the heartbeats"));
        drop(fleet);
        for (i, e) in engines.iter().enumerate() {
            let stats = e.publisher().unwrap().stats();
            assert!(stats.heartbeats >= 1 && stats.replays_served >= 1, "engine {}: {stats:?}", i + 1);
        }
        // Later live batches on all three apply on top of what was learned.
        for (i, e) in engines.iter_mut().enumerate() {
            let tokens: Vec<u32> = (0..70).map(|t| 50_000 + i as u32 * 1_000 + t).collect();
            let fresh = Served { tokens, image: None, ..served[i][0].clone() };
            fresh.serve(e);
            served[i].push(fresh);
        }
        let mut fleet: Vec<(u64, &mut Engine, Vec<Served>)> =
            ids.iter().copied().zip(engines.iter_mut()).zip(served.clone()).map(|((id, e), s)| (id, e, s)).collect();
        await_exact(&mut probe, &mut fleet, &format!("{form:?}: after later live batches"));
        drop(fleet);
        for (i, prompts) in served.iter().enumerate() {
            assert_eq!(prompts.last().unwrap().scores(&mut probe), only(ids[i], 64), "{form:?}");
        }
        for c in &mut captures {
            c.drain();
            assert!(!c.payloads.is_empty());
            captured.extend(c.payloads.drain(..).map(|p| (form, p)));
        }
    }
    assert!(check_with_vllm(&vllm, &captured) >= 2 * 10, "every store of both forms was checked");
}

/// One front end to Dynamo's in-process `KvRouter`
/// (tests/interop/dynamo_kvrouter.py: the wheel's own relay decodes a
/// stream, its router indexes it), watching one publisher.
struct Front {
    child: Child,
    stdin: BufWriter<ChildStdin>,
    stdout: BufReader<ChildStdout>,
    what: String,
}

impl Front {
    /// Starts the process; `ready` waits for it, so that several start at once.
    fn spawn(python: &Path, endpoint: &str, what: String) -> Self {
        let mut child = Command::new(python)
            .arg(repo().join("tests/interop/dynamo_kvrouter.py"))
            .args(["--block-size", &BLOCK.to_string(), "--endpoint", endpoint])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawning dynamo_kvrouter.py");
        let stdin = BufWriter::new(child.stdin.take().unwrap());
        let stdout = BufReader::new(child.stdout.take().unwrap());
        Self { child, stdin, stdout, what }
    }

    fn ready(&mut self) {
        let mut ready = String::new();
        self.stdout.read_line(&mut ready).unwrap();
        assert!(ready.contains("\"ready\": true"), "{}: Dynamo's KvRouter did not start: {ready:?}", self.what);
        assert_eq!(self.call(json!({"op": "ping"}))["ok"], true);
    }

    fn call(&mut self, cmd: Value) -> Value {
        writeln!(self.stdin, "{cmd}").unwrap();
        self.stdin.flush().unwrap();
        let mut line = String::new();
        self.stdout.read_line(&mut line).unwrap();
        let v: Value = serde_json::from_str(&line).unwrap_or_else(|e| panic!("{}: {line:?}: {e}", self.what));
        assert!(v.get("error").is_none(), "{}: {cmd}: {v}", self.what);
        v
    }

    /// The KvRouter's overlap in blocks for `tokens` in the given scope.
    fn blocks(&mut self, tokens: &[u32], lora: Option<&str>, salt: Option<&str>, mm: Option<Value>) -> u64 {
        self.call(json!({"op": "overlap", "tokens": tokens, "lora_name": lora, "cache_namespace": salt,
                         "block_mm_infos": mm}))["device_blocks"]
            .as_u64()
            .unwrap()
    }

    /// Waits until the overlap is `want` (events apply asynchronously),
    /// failing with the last answer after 20 s.
    fn await_blocks(&mut self, tokens: &[u32], mm: Option<Value>, want: u64, what: &str) {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let got = self.blocks(tokens, None, None, mm.clone());
            if got == want {
                return;
            }
            assert!(Instant::now() < deadline, "{} {what}: the KvRouter matches {got} blocks, want {want}", self.what);
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Front {
    fn drop(&mut self) {
        let _ = writeln!(self.stdin, "{}", json!({"op": "quit"}));
        let _ = self.stdin.flush();
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Serves one-block probe prompts from `e` until every front has the latest
/// (ZMQ's slow joiner, and Dynamo's relay joining in turn). `n` numbers the
/// probes, so that each is new.
fn join_fronts(fronts: &mut [&mut Front], e: &mut Engine, n: &mut u32) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let p: Vec<u32> = (0..33).map(|i| 40_000 + *n * 64 + i).collect();
        serve(e, &p, 33, None);
        *n += 1;
        std::thread::sleep(Duration::from_millis(150));
        if fronts.iter_mut().all(|f| f.blocks(&p, None, None, None) == 1) {
            return;
        }
        let what: Vec<&str> = fronts.iter().map(|f| f.what.as_str()).collect();
        assert!(Instant::now() < deadline, "{what:?}: Dynamo's relay never received our stream");
    }
}

/// Dynamo's in-process `KvRouter` on three engines in both forms, one front
/// end process per engine (the in-memory discovery of one runtime has one
/// instance): engine 1 holds a LoRA scope and the base model's text, engine
/// 2 a salted scope and the base model's text of engine 1's LoRA prompt,
/// engine 3 the base model's text and an image. Each scope matches only the
/// query of its own scope, on the engine that holds it.
#[test]
fn dynamo_kvrouter_in_process_keeps_scopes_in_both_forms() {
    let Some(python) = python() else { return };
    let forms = [EventForm::Map, EventForm::Array];
    let mut engines: Vec<Vec<Engine>> =
        forms.iter().map(|f| (0..3).map(|_| engine_in_form(*f, false, 100, 0)).collect()).collect();
    // All six front ends start at once.
    let mut fronts: Vec<Vec<Front>> = forms
        .iter()
        .zip(&engines)
        .map(|(f, es)| {
            es.iter()
                .enumerate()
                .map(|(i, e)| Front::spawn(&python, &endpoints(e).0, format!("{f:?} engine {}", i + 1)))
                .collect()
        })
        .collect();
    fronts.iter_mut().flatten().for_each(Front::ready);
    let mut n = 0;
    for (fs, es) in fronts.iter_mut().zip(&mut engines) {
        for (f, e) in fs.iter_mut().zip(es.iter_mut()) {
            join_fronts(&mut [f], e, &mut n);
        }
    }
    let mut rng = rand::rngs::StdRng::seed_from_u64(80);
    let mut text = |n: usize| (0..n).map(|_| rng.random_range(1000..60_000)).collect::<Vec<u32>>();
    let (t1, t2, t3) = (text(130), text(130), text(130));
    let prompt = image_prompt(&t3[..32], &t3[32..64]);
    let a: (&[u8], &str) = (b"pixels of image A", "0f1e2d3c-image-a");
    let lora = RequestSpec { tokens: &t1, lora_id: Some(5), lora_name: Some("adapter-a"), ..Default::default() };
    let salted = RequestSpec { tokens: &t2, cache_salt: Some("tenant-b"), ..Default::default() };
    for es in &mut engines {
        serve_spec(&mut es[0], &lora);
        serve(&mut es[0], &t3, 130, None);
        serve_spec(&mut es[1], &salted);
        serve(&mut es[1], &t1, 130, None);
        serve(&mut es[2], &t3, 130, None);
        serve(&mut es[2], &prompt, 130, Some(a));
    }
    for (form, fs) in forms.iter().zip(&mut fronts) {
        // The last store of each engine, then everything else is applied too.
        fs[0].await_blocks(&t3, None, 4, "base text");
        fs[1].await_blocks(&t1, None, 4, "base text");
        fs[2].await_blocks(&prompt, Some(mm_infos(a.1)), 4, "image A");
        let [f1, f2, f3] = &mut fs[..] else { unreachable!() };
        assert_eq!(f1.blocks(&t1, Some("adapter-a"), None, None), 4, "{form:?}");
        assert_eq!(f1.blocks(&t1, None, None, None), 0, "{form:?}: LoRA blocks are not base blocks");
        assert_eq!(f1.blocks(&t1, Some("adapter-b"), None, None), 0, "{form:?}: nor another adapter's");
        assert_eq!(f1.blocks(&t3, None, None, None), 4, "{form:?}");
        assert_eq!(f1.blocks(&t2, None, Some("tenant-b"), None), 0, "{form:?}: engine 1 holds no salted blocks");
        assert_eq!(f2.blocks(&t2, None, Some("tenant-b"), None), 4, "{form:?}");
        assert_eq!(f2.blocks(&t2, None, None, None), 0, "{form:?}: salted blocks do not match unsalted queries");
        assert_eq!(f2.blocks(&t1, None, None, None), 4, "{form:?}");
        assert_eq!(f2.blocks(&t1, Some("adapter-a"), None, None), 0, "{form:?}: base blocks are not LoRA blocks");
        assert_eq!(f3.blocks(&t3, None, None, None), 4, "{form:?}");
        assert_eq!(f3.blocks(&t3, None, Some("tenant-b"), None), 0, "{form:?}: nor the reverse");
        assert_eq!(f3.blocks(&prompt, None, None, Some(mm_infos(a.1))), 4, "{form:?}");
        assert_eq!(f3.blocks(&prompt, None, None, Some(mm_infos("other"))), 1, "{form:?}");
        assert_eq!(f3.blocks(&t1, Some("adapter-a"), None, None), 0, "{form:?}");
    }
}

/// Dynamo's in-process `KvRouter`s, one per engine, on the shared-UUID
/// fleet (engine 1 holds pixels A under the UUID, engine 2 other pixels
/// under the same UUID, engine 3 text). Watching the engines directly, the
/// KvRouter of engine 2 matches the image blocks by the UUID although engine
/// 2 holds other pixels: the limit docs/wire-format.md describes, pinned
/// here. Watching a `kvcore_router::Relay` (in this process) instead, the
/// KvRouters match by the UUID only its true holder (while it is the only
/// one), and each set of pixels by content on its holder alone.
fn kvrouter_and_a_shared_uuid(form: EventForm) {
    use kvcore_router::{IndexerConfig, Relay, RelayConfig, RelayWorker, SubscriberConfig};
    let Some(python) = python() else { return };
    let mut engines: Vec<Engine> = (0..3).map(|_| engine_in_form(form, false, 100, 0)).collect();
    let workers: Vec<RelayWorker> = engines
        .iter()
        .enumerate()
        .map(|(i, e)| RelayWorker {
            name: format!("engine-{}", i + 1),
            upstream: endpoints(e).0,
            upstream_replay: None,
            bind: "tcp://127.0.0.1:*".into(),
            bind_replay: Some("tcp://127.0.0.1:*".into()),
        })
        .collect();
    let config = RelayConfig {
        subscriber: SubscriberConfig {
            indexer: IndexerConfig { block_size: BLOCK, ..Default::default() },
            ..Default::default()
        },
        form,
        ..Default::default()
    };
    let mut relay = Relay::new(config, &workers).expect("relay binds");
    let relayed: Vec<String> = (0..3).map(|i| relay.endpoint(i).unwrap().to_owned()).collect();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let stopped = stop.clone();
    let thread = std::thread::spawn(move || {
        while !stopped.load(std::sync::atomic::Ordering::Relaxed) {
            relay.poll(Duration::from_millis(5)).expect("relay poll");
        }
        relay
    });
    // Six front ends start at once: three on the engines, three on the relay.
    let mut direct: Vec<Front> = engines
        .iter()
        .enumerate()
        .map(|(i, e)| Front::spawn(&python, &endpoints(e).0, format!("{form:?} engine {} direct", i + 1)))
        .collect();
    let mut behind: Vec<Front> = relayed
        .iter()
        .enumerate()
        .map(|(i, ep)| Front::spawn(&python, ep, format!("{form:?} engine {} behind the relay", i + 1)))
        .collect();
    direct.iter_mut().chain(behind.iter_mut()).for_each(Front::ready);
    let mut n = 0;
    for ((d, b), e) in direct.iter_mut().zip(behind.iter_mut()).zip(engines.iter_mut()) {
        join_fronts(&mut [d, b], e, &mut n);
    }
    let f = shared_uuid();
    let by_uuid = Some(mm_infos(f.a.1));
    let (by_a, by_b) = (Some(mm_infos_of(content_mm_hash(f.a.0))), Some(mm_infos_of(content_mm_hash(f.b.0))));
    serve(&mut engines[2], &f.text, 96, None);

    // One holder: the UUID identifies its pixels, everywhere.
    serve(&mut engines[0], &f.prompt, 130, Some(f.a));
    behind[0].await_blocks(&f.prompt, by_uuid.clone(), 4, "a single holder matches by UUID");
    direct[0].await_blocks(&f.prompt, by_uuid.clone(), 4, "a single holder matches by UUID");

    // A second holder with other pixels under the same UUID.
    serve(&mut engines[1], &f.prompt, 130, Some(f.b));
    assert_eq!(f.prompt.len() as u64 / u64::from(BLOCK), 4);
    assert_eq!(held(&mut engines[0], &f.prompt, Some(f.a)), 128);
    assert_eq!(held(&mut engines[1], &f.prompt, Some(f.a)), 32, "engine 2 holds only the text before the image");
    // Directly, Dynamo is misled: engine 2's KvRouter matches all four blocks.
    direct[1].await_blocks(&f.prompt, by_uuid.clone(), 4, "(the documented limit) engine 2 matches the UUID");
    assert_eq!(direct[0].blocks(&f.prompt, None, None, by_uuid.clone()), 4);
    // Behind the relay: the ambiguous UUID matches no image block, each set of
    // pixels matches its holder by content.
    behind[0].await_blocks(&f.prompt, by_uuid.clone(), 1, "an ambiguous UUID matches no image block");
    behind[1].await_blocks(&f.prompt, by_uuid.clone(), 1, "an ambiguous UUID matches no image block");
    behind[0].await_blocks(&f.prompt, by_a.clone(), 4, "pixels A match their holder by content");
    behind[1].await_blocks(&f.prompt, by_a.clone(), 1, "pixels A are not engine 2's");
    behind[1].await_blocks(&f.prompt, by_b.clone(), 4, "pixels B match their holder by content");
    behind[0].await_blocks(&f.prompt, by_b.clone(), 1, "pixels B are not engine 1's");
    for front in [&mut behind[2], &mut direct[2]] {
        assert_eq!(front.blocks(&f.prompt, None, None, by_uuid.clone()), 0);
        assert_eq!(front.blocks(&f.text, None, None, None), 3, "text is relayed unchanged");
    }

    // Engine 2 evicts its copy: the UUID is its only holder's again.
    assert!(engines[1].evict(1000) > 0);
    engines[1].step();
    behind[1].await_blocks(&f.prompt, by_uuid.clone(), 0, "the evicted copy is gone");
    behind[0].await_blocks(&f.prompt, by_uuid.clone(), 4, "the UUID matches again once the conflict is gone");
    behind[1].await_blocks(&f.prompt, by_b, 0, "nothing of pixels B is left");

    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let relay = thread.join().expect("relay thread");
    let ix = relay.subscriber().indexer().counters();
    assert_eq!((ix.uuid_conflicts, ix.uuid_conflicts_resolved), (1, 1));
}

#[test]
fn dynamo_kvrouter_and_a_shared_uuid_map_form() {
    kvrouter_and_a_shared_uuid(EventForm::Map);
}

#[test]
fn dynamo_kvrouter_and_a_shared_uuid_array_form() {
    kvrouter_and_a_shared_uuid(EventForm::Array);
}

/// Dynamo's per-block image identity for `image_prompt` under one `mm_hash`.
fn mm_infos_of(h: u64) -> Value {
    let obj = |s: u32, e: u32| json!({"mm_objects": [{"mm_hash": h, "offsets": [[s, e]]}]});
    json!([null, obj(1, 32), obj(0, 32), obj(0, 1)])
}

/// The `mm_hash` an engine gives an image it has no usable UUID for.
fn content_mm_hash(pixels: &[u8]) -> u64 {
    kvcore::mm_hash(&kvcore::ImageDigest::of_content(pixels), None)
}

impl Probe {
    /// Dynamo's overlap in tokens of workers 1, 2 and 3.
    fn overlap3(&mut self, tokens: &[u32], mm_infos: Option<Value>) -> [u64; 3] {
        let hashes =
            self.call(json!({"op": "hash", "tokens": tokens, "block_size": BLOCK, "block_mm_infos": mm_infos}));
        let scores = self.call(json!({"op": "query", "block_hashes": hashes["hashes"]}));
        let of = |w: &str| scores["scores"][w].as_u64().unwrap_or(0);
        [of("1"), of("2"), of("3")]
    }

    /// Waits until Dynamo's overlap for the query is `want` (its events are
    /// applied asynchronously), failing with the last answer after 20 s.
    fn await_overlap3(&mut self, tokens: &[u32], mm_infos: Option<Value>, want: [u64; 3], what: &str) {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let got = self.overlap3(tokens, mm_infos.clone());
            if got == want {
                return;
            }
            assert!(Instant::now() < deadline, "{what}: Dynamo's overlap is {got:?}, want {want:?}");
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

/// The fleet of the UUID tests: a prompt with one image, two sets of pixels
/// under one UUID, and text for the third engine.
struct SharedUuid {
    prompt: Vec<u32>,
    text: Vec<u32>,
    a: (&'static [u8], &'static str),
    b: (&'static [u8], &'static str),
}

fn shared_uuid() -> SharedUuid {
    let mut rng = rand::rngs::StdRng::seed_from_u64(2020);
    let mut text = |n: usize| (0..n).map(|_| rng.random_range(1000..60_000)).collect::<Vec<u32>>();
    let (prefix, suffix, other) = (text(32), text(32), text(96));
    SharedUuid {
        prompt: image_prompt(&prefix, &suffix),
        text: other,
        a: (b"pixels the caller sent to engine 1", "3f2a9c7e-shared-by-two-callers"),
        b: (b"other pixels sent to engine 2", "3f2a9c7e-shared-by-two-callers"),
    }
}

/// Without the relay, Dynamo reading only `block_mm_infos` is misled by a
/// UUID two engines hold for different pixels: each engine derives the
/// `mm_hash` from the UUID in its own table, so a request hashed by that UUID
/// matches engine 2's image blocks as fully as engine 1's, while engine 2
/// holds other pixels. This is the limit the relay exists for; the test
/// pins it so that docs/wire-format.md stays true.
#[test]
fn dynamo_alone_matches_a_shared_uuid_on_the_wrong_worker() {
    let Some(python) = python() else { return };
    let (mut e1, ep1) = engine_with_publisher();
    let (mut e2, ep2) = engine_with_publisher();
    let (mut e3, ep3) = engine_with_publisher();
    let mut probe = Probe::start(&python, &format!("1={ep1},2={ep2},3={ep3}"));
    for e in [&mut e1, &mut e2, &mut e3] {
        join(&mut probe, e);
    }
    let f = shared_uuid();
    serve(&mut e1, &f.prompt, 130, Some(f.a));
    serve(&mut e2, &f.prompt, 130, Some(f.b));
    serve(&mut e3, &f.text, 96, None);
    let by_uuid = Some(mm_infos(f.a.1));
    probe.await_overlap3(&f.prompt, by_uuid.clone(), [128, 128, 0], "both UUID holders match fully");
    // What each engine really holds of the request when its pixels are A:
    // engine 2 holds only the text block before the image.
    assert_eq!(held(&mut e1, &f.prompt, Some(f.a)), 128);
    assert_eq!(held(&mut e2, &f.prompt, Some(f.a)), 32);
}

/// With the relay between the engines and Dynamo, a UUID the fleet holds
/// for two sets of pixels matches no worker's image blocks by UUID, while
/// each set of pixels still matches its true holder by content; before the
/// second copy exists, and again once it is evicted, the UUID matches its
/// only holder fully. Dynamo is unchanged; it subscribes to the relay's
/// sockets.
fn relay_protects_dynamo(form: kvcore::wire::EventForm) {
    use kvcore_router::{IndexerConfig, Relay, RelayConfig, RelayWorker, SubscriberConfig};
    let Some(python) = python() else { return };
    let (mut e1, ep1) = engine_with_publisher();
    let (mut e2, ep2) = engine_with_publisher();
    let (mut e3, ep3) = engine_with_publisher();
    let workers: Vec<RelayWorker> = [&ep1, &ep2, &ep3]
        .iter()
        .enumerate()
        .map(|(i, ep)| RelayWorker {
            name: format!("engine-{}", i + 1),
            upstream: (*ep).clone(),
            upstream_replay: None,
            bind: "tcp://127.0.0.1:*".into(),
            bind_replay: Some("tcp://127.0.0.1:*".into()),
        })
        .collect();
    let config = RelayConfig {
        subscriber: SubscriberConfig {
            indexer: IndexerConfig { block_size: BLOCK, ..Default::default() },
            ..Default::default()
        },
        form,
        ..Default::default()
    };
    let mut relay = Relay::new(config, &workers).expect("relay binds");
    let relayed: Vec<String> = (0..3).map(|i| relay.endpoint(i).unwrap().to_owned()).collect();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let stopped = stop.clone();
    let thread = std::thread::spawn(move || {
        while !stopped.load(std::sync::atomic::Ordering::Relaxed) {
            relay.poll(Duration::from_millis(5)).expect("relay poll");
        }
        relay
    });
    let mut probe = Probe::start(&python, &format!("1={},2={},3={}", relayed[0], relayed[1], relayed[2]));
    for e in [&mut e1, &mut e2, &mut e3] {
        join(&mut probe, e);
    }
    let f = shared_uuid();
    let by_uuid = Some(mm_infos(f.a.1));
    let (by_a, by_b) = (Some(mm_infos_of(content_mm_hash(f.a.0))), Some(mm_infos_of(content_mm_hash(f.b.0))));
    serve(&mut e3, &f.text, 96, None);

    // One holder: the UUID identifies its pixels, Dynamo matches it fully.
    serve(&mut e1, &f.prompt, 130, Some(f.a));
    probe.await_overlap3(&f.prompt, by_uuid.clone(), [128, 0, 0], "a single holder matches by UUID");

    // A second holder with other pixels: both are re-identified by content.
    serve(&mut e2, &f.prompt, 130, Some(f.b));
    probe.await_overlap3(&f.prompt, by_uuid.clone(), [32, 32, 0], "an ambiguous UUID matches no image block");
    assert_eq!(held(&mut e1, &f.prompt, Some(f.a)), 128);
    assert_eq!(held(&mut e2, &f.prompt, Some(f.a)), 32);
    probe.await_overlap3(&f.prompt, by_a.clone(), [128, 32, 0], "pixels A match their holder by content");
    probe.await_overlap3(&f.prompt, by_b, [32, 128, 0], "pixels B match their holder by content");

    // Engine 2 evicts its copy: the UUID is its only holder's again.
    assert!(e2.evict(1000) > 0);
    e2.step();
    probe.await_overlap3(&f.prompt, by_uuid, [128, 0, 0], "the UUID matches again once the conflict is gone");
    probe.await_overlap3(
        &f.prompt,
        by_a,
        [32, 0, 0],
        "pixels A are held under their UUID identity again, not by content",
    );
    // Text is relayed unchanged.
    let t = [&f.text[..], &[1, 2][..]].concat();
    probe.await_overlap3(&t, None, [0, 0, 96], "text blocks are relayed unchanged");

    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let relay = thread.join().expect("relay thread");
    let c = relay.counters();
    assert!(c.blocks_restored >= 6, "engine 1's 3 image blocks re-stored twice: {c:?}");
    assert!(c.mm_hashes_rewritten >= 3, "engine 2's image blocks went out by content: {c:?}");
    let ix = relay.subscriber().indexer().counters();
    assert_eq!((ix.uuid_conflicts, ix.uuid_conflicts_resolved), (1, 1));
}

#[test]
fn relay_protects_dynamo_map_form() {
    relay_protects_dynamo(kvcore::wire::EventForm::Map);
}

#[test]
fn relay_protects_dynamo_array_form() {
    relay_protects_dynamo(kvcore::wire::EventForm::Array);
}

/// The simulation's `dynamo` policy believes what Dynamo's real in-process
/// `KvRouter` believes, tier by tier: one engine with a device and a host tier
/// serves the first requests of the simulation's chat workload (images with
/// and without UUIDs, pools small enough that blocks are offloaded to the
/// host and evicted from it), its stream goes both to the wheel's `KvRouter`
/// (tests/interop/dynamo_kvrouter.py) and, through the simulation's tap, to
/// the policy's view built on the native crate; then every served prompt,
/// hashed as the view hashes it, gets the same device overlap and the same
/// host-pinned continuation from both (`get_overlap_scores`:
/// `device_blocks`, `host_pinned_extension_blocks`, `disk_extension_blocks`).
/// Some overlaps are partial and some continue in the host tier, so
/// offloads and evictions were applied alike.
#[test]
fn sim_dynamo_policy_matches_dynamo_kvrouter() {
    use kvcore_tools::sim::dynamo_view::{DynamoView, TierScores};
    use kvcore_tools::sim::tap::Taps;
    use kvcore_tools::sim::view::{CacheView, ViewRequest, engine_keys};
    use kvcore_tools::sim::{ChatConfig, chat_workload};

    let Some(python) = python() else { return };
    let mut e = engine_with_tiers(EventForm::Map, false, 100, 0, TIERED_DEVICE, TIERED_HOST);
    let (endpoint, _) = endpoints(&e);
    let mut child = Command::new(&python)
        .arg(repo().join("tests/interop/dynamo_kvrouter.py"))
        .args(["--block-size", &BLOCK.to_string(), "--endpoint", &endpoint])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("spawning dynamo_kvrouter.py");
    let mut stdin = BufWriter::new(child.stdin.take().unwrap());
    let mut stdout = BufReader::new(child.stdout.take().unwrap());
    let mut ready = String::new();
    stdout.read_line(&mut ready).unwrap();
    assert!(ready.contains("\"ready\": true"), "Dynamo's KvRouter did not start: {ready:?}");
    let mut call = |cmd: Value| -> Value {
        writeln!(stdin, "{cmd}").unwrap();
        stdin.flush().unwrap();
        let mut line = String::new();
        stdout.read_line(&mut line).unwrap();
        let v: Value = serde_json::from_str(&line).unwrap_or_else(|e| panic!("{line:?}: {e}"));
        assert!(v.get("error").is_none(), "{cmd}: {v}");
        v
    };
    let mut taps = Taps::connect(std::slice::from_ref(&endpoint)).unwrap();
    let mut view = DynamoView::new(1, BLOCK);
    let feed = |e: &Engine, taps: &mut Taps, view: &mut DynamoView| {
        let payloads = taps.collect(0, e.publisher().unwrap().next_seq());
        for payload in &payloads {
            view.apply_payload(0, payload);
        }
        payloads.len()
    };
    // Join: serve probe prompts until both the wheel's relay and the tap have
    // one (a SUB socket misses what is published before its subscription
    // arrives, which takes longer on a loaded machine).
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut n = 0u32;
    let mut tap_joined = false;
    loop {
        let p: Vec<u32> = (0..33).map(|i| 40_000 + n * 64 + i).collect();
        serve(&mut e, &p, 33, None);
        let before = taps.lost();
        tap_joined |= feed(&e, &mut taps, &mut view) > 0 && taps.lost() == before;
        n += 1;
        std::thread::sleep(Duration::from_millis(150));
        let probe = call(json!({"op": "overlap", "tokens": p, "block_mm_infos": null}));
        if probe["device_blocks"] == 1 && tap_joined {
            break;
        }
        assert!(Instant::now() < deadline, "Dynamo's relay or the tap never received our stream");
    }
    // Both sides start over from one `AllBlocksCleared`, so batches the tap
    // missed while joining leave nothing that only one side holds.
    e.clear();
    e.step();
    feed(&e, &mut taps, &mut view);
    let lost_at_join = taps.lost();
    let workload =
        chat_workload(&ChatConfig { sessions: 6, seed: 21, uuid_pixel_swap: 0.3, ..Default::default() }).unwrap();
    let requests = &workload.requests[..24];
    assert!(requests.iter().any(|r| r.images.iter().any(|i| i.uuid.is_some())));
    assert!(requests.iter().any(|r| r.images.iter().any(|i| i.uuid.is_none())));
    for r in requests {
        let tokens = r.prompt.tokens();
        let items = r
            .images
            .iter()
            .map(|i| MmItemSpec {
                content: MmContent::Bytes(&i.pixels),
                runs: vec![TokenRun { start: i.start, len: i.len }],
            })
            .collect();
        let uuids =
            (!r.images.is_empty()).then(|| r.images.iter().map(|i| i.uuid.as_deref().map(str::as_bytes)).collect());
        if let Ok(a) = e.add_request(&RequestSpec { tokens: &tokens, items, uuids, ..Default::default() }) {
            e.commit(a.id, tokens.len() as u64).unwrap();
            e.finish(a.id).unwrap();
        }
        e.step();
        feed(&e, &mut taps, &mut view);
    }
    assert_eq!(taps.lost(), lost_at_join, "no batch lost after the join");
    let ours_and_theirs = |call: &mut dyn FnMut(Value) -> Value, view: &mut DynamoView| {
        requests
            .iter()
            .map(|r| {
                let tokens = r.prompt.tokens();
                let keys = engine_keys(r, &tokens, BLOCK, IMAGE_PAD);
                let vr = ViewRequest { request: r, tokens: &tokens, engine_keys: &keys, block_size: BLOCK };
                let ours = view.tier_scores(&DynamoView::request_hashes(&vr, keys.len()))[0];
                let (blocks, mm) = DynamoView::request_blocks(&vr, keys.len());
                let v = call(json!({"op": "overlap", "tokens": blocks, "block_mm_infos": mm}));
                let n = |k: &str| v[k].as_u64().unwrap() as u32;
                let theirs = TierScores { device: n("device_blocks"), host: n("host_blocks"), disk: n("disk_blocks") };
                (ours, theirs, keys.len() as u32)
            })
            .collect::<Vec<_>>()
    };
    // The wheel applies events on its own threads: wait until it settles.
    let deadline = Instant::now() + Duration::from_secs(20);
    let pairs = loop {
        let pairs = ours_and_theirs(&mut call, &mut view);
        if pairs.iter().all(|(a, b, _)| a == b) || Instant::now() > deadline {
            break pairs;
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    for (i, (ours, theirs, _)) in pairs.iter().enumerate() {
        assert_eq!(
            ours, theirs,
            "request {i}: the simulation's dynamo view {ours:?}, Dynamo's KvRouter {theirs:?}: {pairs:?}"
        );
    }
    // The stream held host-tier stores and removals, and the view indexed
    // them all (the queries above applied every delivered event).
    let stats = view.stats().unwrap();
    let host = &stats["events_by_tier"]["HostPinned"];
    assert!(host["stored"].as_u64().unwrap() > 0 && host["removed"].as_u64().unwrap() > 0, "{stats}");
    assert_eq!(stats["lower_tier_events_pending"], 0, "{stats}");
    assert_eq!(view.events_unusable(), 0, "{stats}");
    let d = |o: &TierScores| o.device;
    assert!(pairs.iter().any(|(o, _, n)| d(o) > 0 && d(o) < *n), "some device overlap is partial: {pairs:?}");
    assert!(pairs.iter().any(|(o, _, _)| o.host > 0), "some match continues in the host tier: {pairs:?}");
    assert!(pairs.iter().any(|(o, _, _)| o.device == 0 && o.host > 0), "some match is host-tier only: {pairs:?}");
    assert!(pairs.iter().any(|(o, _, _)| o.device + o.host == 0), "some prompt was evicted or never held: {pairs:?}");
    call(json!({"op": "quit"}));
    let _ = child.wait();
}

// Hybrid models: a KV cache group per attention pattern.

/// The events of one hybrid engine step by step, and the same engine's
/// main group alone (what a single-group engine serving the full-attention
/// layers would publish): chain A (4 blocks) in the full-attention group 0
/// and in the sliding-window group 1 (window 64 tokens), chain B (3 blocks)
/// in the sliding-window group only; then group 1 drops A's block 1 (on
/// the device; it stays on the host) and group 0 drops A's block 3.
fn hybrid_steps(hybrid: bool) -> Vec<Vec<kvcore::KvEvent>> {
    use kvcore::{BlockKey, BlockRemoved, BlockStored, GroupKind, KvEvent, KvGroup, Tier};
    let full = KvGroup { index: 0, kind: GroupKind::FullAttention };
    let window = KvGroup { index: 1, kind: GroupKind::SlidingWindow { window_tokens: 64 } };
    let key = |chain: u8, i: usize| {
        BlockKey([
            chain, i as u8, 0x5a, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23,
            24, 25, 26, 27, 28, 29,
        ])
    };
    let stored = |chain: u8, blocks: usize, group: Option<KvGroup>, medium: Tier| {
        KvEvent::BlockStored(BlockStored {
            event_seq: 0,
            keys: (0..blocks).map(|i| key(chain, i)).collect(),
            parent: None,
            token_ids: hybrid_tokens(chain, blocks),
            block_size: BLOCK,
            lora_id: None,
            lora_name: None,
            cache_salt: None,
            medium,
            images: Vec::new(),
            block_images: Default::default(),
            group,
        })
    };
    let removed = |chain: u8, i: usize, group: Option<KvGroup>, medium: Tier| {
        KvEvent::BlockRemoved(BlockRemoved { event_seq: 0, keys: vec![key(chain, i)], medium, group })
    };
    if !hybrid {
        return vec![vec![stored(b'A', 4, None, Tier::Device)], vec![removed(b'A', 3, None, Tier::Device)]];
    }
    vec![
        vec![
            stored(b'A', 4, Some(full), Tier::Device),
            stored(b'A', 4, Some(window), Tier::Device),
            stored(b'A', 4, Some(window), Tier::Host),
            stored(b'B', 3, Some(window), Tier::Device),
        ],
        vec![removed(b'A', 1, Some(window), Tier::Device), removed(b'A', 3, Some(full), Tier::Device)],
    ]
}

/// Chain `chain`'s token ids, `blocks` full blocks.
fn hybrid_tokens(chain: u8, blocks: usize) -> Vec<u32> {
    (0..blocks as u32 * BLOCK).map(|i| u32::from(chain) * 1000 + i + 7).collect()
}

fn publisher_in(form: EventForm) -> Publisher {
    Publisher::bind(PublisherConfig {
        endpoint: "tcp://127.0.0.1:*".into(),
        replay_endpoint: None,
        heartbeat_ms: 0,
        encode: EncodeOptions { form, token_ids: true },
        ..Default::default()
    })
    .unwrap()
}

/// Dynamo 1.6.1's standalone indexer, fed a hybrid engine's stream in each
/// form beside the same engine's main group alone, gives the hybrid worker
/// exactly the main-group worker's scores: it indexes the full-attention
/// group and ignores the sliding-window group without misreading it (were
/// the window's stores taken for the main group, chain B would score; were
/// its removal, chain A would drop to one block). Its counters show the
/// main group's events alone applied. vLLM 0.33.0's decoder reads every
/// hybrid payload's group fields as kvcore meant them.
#[test]
fn dynamo_indexes_the_main_group_of_a_hybrid_stream_alone() {
    let Some(python) = python() else { return };
    // Workers 1 and 2: hybrid and main-only in the map form; 3 and 4 the
    // same in the array form.
    let mut pubs: Vec<(u64, bool, Publisher)> = vec![
        (1, true, publisher_in(EventForm::Map)),
        (2, false, publisher_in(EventForm::Map)),
        (3, true, publisher_in(EventForm::Array)),
        (4, false, publisher_in(EventForm::Array)),
    ];
    let workers: Vec<String> = pubs.iter().map(|(id, _, p)| format!("{id}={}", p.endpoint())).collect();
    let mut probe = Probe::start(&python, &workers.join(","));
    for (_, _, p) in &mut pubs {
        let before = probe.applied("cleared");
        let deadline = Instant::now() + Duration::from_secs(30);
        while probe.applied("cleared") <= before {
            assert!(Instant::now() < deadline, "Dynamo's indexer never received our stream");
            p.publish(vec![kvcore::KvEvent::AllBlocksCleared(kvcore::AllBlocksCleared { event_seq: 0 })]);
            std::thread::sleep(Duration::from_millis(100));
        }
    }
    std::thread::sleep(Duration::from_millis(300));
    let (stored0, removed0) = (probe.applied("stored"), probe.applied("removed"));
    let a = hybrid_tokens(b'A', 4);
    let b = hybrid_tokens(b'B', 3);
    let mut expected = Vec::new();
    for (step, want) in [(0usize, [128, 0]), (1, [96, 0])] {
        for (_, hybrid, p) in &mut pubs {
            p.publish(hybrid_steps(*hybrid)[step].clone());
        }
        // Each worker's main group stored once, then removed once.
        if step == 0 {
            probe.wait_applied(stored0 + 4, 0);
        } else {
            probe.wait_applied(0, removed0 + 4);
        }
        // Let anything Dynamo might misapply land too.
        std::thread::sleep(Duration::from_millis(500));
        for (tokens, want) in [(&a, want[0]), (&b, want[1])] {
            let s = scores(&mut probe, tokens, None, None, None);
            let of = |w: &str| s[w].as_u64().unwrap_or(0);
            assert_eq!(of("1"), of("2"), "step {step}: the hybrid map stream scores as its main group: {s}");
            assert_eq!(of("3"), of("4"), "step {step}: the hybrid array stream scores as its main group: {s}");
            assert_eq!(of("2"), want, "step {step}: {s}");
            assert_eq!(of("4"), want, "step {step}: {s}");
            expected.push(s);
        }
    }
    assert_eq!(
        (probe.applied("stored") - stored0, probe.applied("removed") - removed0),
        (4, 4),
        "only the main groups' events were applied"
    );
    drop(probe);

    // vLLM 0.33.0's own decoder on the hybrid payloads, both forms.
    let Some(vllm) = vllm_python() else { return };
    let mut payloads = Vec::new();
    for form in [EventForm::Map, EventForm::Array] {
        for step in hybrid_steps(true) {
            let mut bytes = Vec::new();
            kvcore::wire::encode_events(&step, 1.5, None, &EncodeOptions { form, token_ids: true }, &mut bytes);
            payloads.push((form, bytes));
        }
    }
    assert_eq!(check_with_vllm(&vllm, &payloads), 8);
}

/// An engine of block size `BLOCK` in `form`, hybrid (a full-attention
/// group of 256 pages and a sliding window of 64 tokens in 12 pages, small
/// enough to evict) or single-group with the same full-attention pages.
fn engine_hybrid_or_not(form: EventForm, hybrid: bool) -> Engine {
    use kvcore::{GroupConfig, GroupKind};
    let groups = if hybrid {
        vec![
            GroupConfig { kind: GroupKind::FullAttention, blocks_device: 256, blocks_host: 0 },
            GroupConfig { kind: GroupKind::SlidingWindow { window_tokens: 64 }, blocks_device: 12, blocks_host: 0 },
        ]
    } else {
        Vec::new()
    };
    let blocks_device = if hybrid { 256 + 12 } else { 256 };
    let mut e =
        Engine::new(EngineConfig { block_size_tokens: BLOCK, blocks_device, groups, ..Default::default() }).unwrap();
    e.vacant_publisher()
        .unwrap()
        .start(PublisherConfig {
            endpoint: "tcp://127.0.0.1:*".into(),
            encode: EncodeOptions { form, token_ids: true },
            ..Default::default()
        })
        .unwrap();
    e
}

/// End to end with kvcore's hybrid engine: engines 1 and 3 are hybrid (map
/// and array form), 2 and 4 serve the same requests with one full-attention
/// group of the same size. The window group evicts (kvcore's router scores
/// those prefixes lower, tests/router_groups.rs), yet Dynamo 1.6.1 gives
/// each hybrid engine exactly the scores of its single-group twin, equal to
/// what the twin holds, for every prompt after every request.
#[test]
fn dynamo_scores_a_hybrid_engine_as_its_full_attention_group() {
    let Some(python) = python() else { return };
    let mut engines: Vec<Engine> = vec![
        engine_hybrid_or_not(EventForm::Map, true),
        engine_hybrid_or_not(EventForm::Map, false),
        engine_hybrid_or_not(EventForm::Array, true),
        engine_hybrid_or_not(EventForm::Array, false),
    ];
    let workers: Vec<String> =
        engines.iter().enumerate().map(|(i, e)| format!("{}={}", i + 1, endpoints(e).0)).collect();
    let mut probe = Probe::start(&python, &workers.join(","));
    for e in &mut engines {
        join(&mut probe, e);
    }
    let prompt = |family: u32, variant: u32| -> Vec<u32> {
        let mut t: Vec<u32> = (0..6 * BLOCK).map(|i| 1000 * (family + 1) + i).collect();
        t.extend((0..2 * BLOCK + 2).map(|i| 40_000 + 200 * variant + i));
        t
    };
    let prompts: Vec<Vec<u32>> = (0..3).flat_map(|f| (0..3).map(move |v| prompt(f, v))).collect();
    let mut served_blocks = 0;
    for (round, served) in [0usize, 4, 1, 7, 2, 8, 0, 5].into_iter().enumerate() {
        for e in &mut engines {
            serve(e, &prompts[served], prompts[served].len() as u64, None);
        }
        served_blocks += 1;
        // Each twin's holdings: prompts hashed by Dynamo, expected overlap
        // from the single-group engines themselves.
        let want: Vec<u64> = prompts.iter().map(|t| held(&mut engines[1], t, None)).collect();
        assert_eq!(want, prompts.iter().map(|t| held(&mut engines[3], t, None)).collect::<Vec<_>>());
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let got: Vec<Value> = prompts.iter().map(|t| scores(&mut probe, t, None, None, None)).collect();
            let of = |s: &Value, w: &str| s[w].as_u64().unwrap_or(0);
            let exact = got.iter().zip(&want).all(|(s, w)| (1..=4).all(|i| of(s, &i.to_string()) == *w));
            if exact {
                break;
            }
            assert!(Instant::now() < deadline, "round {round}: Dynamo's scores {got:?}, the twins hold {want:?}");
            std::thread::sleep(Duration::from_millis(100));
        }
    }
    assert_eq!(served_blocks, 8);
    // The window group did lose blocks its full-attention group kept: the
    // hybrid engine itself reuses less than its twin for some prompt.
    let (full, window) = (engines[0].group_usage(0).unwrap(), engines[0].group_usage(1).unwrap());
    assert!(window.blocks_cached_device < full.blocks_cached_device, "{full:?} {window:?}");
    let less = prompts.iter().filter(|t| held(&mut engines[0], t, None) < held(&mut engines[1], t, None)).count();
    assert!(less > 0, "the window group constrains the hybrid engine's reuse");
}
