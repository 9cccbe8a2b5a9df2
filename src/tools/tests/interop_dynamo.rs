//! An existing router consumes our stream unchanged: NVIDIA Dynamo's
//! standalone KV indexer (PyPI `ai-dynamo-runtime==1.6.1`) subscribes to two
//! kvcore engines' publishers, and its per-worker overlap for queries hashed
//! by Dynamo's own `compute_block_hash_for_seq` must equal the prefix each
//! engine holds.
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
use kvcore::{Engine, EngineConfig, MmContent, MmItemSpec, RequestSpec, TokenRun};
use kvcore::{Publisher, PublisherConfig};
use rand::{Rng, SeedableRng};
use serde_json::{Value, json};

const BLOCK: u32 = 32;
const VISION_START: u32 = 151_652;
const IMAGE_PAD: u32 = 151_655;
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
