//! `kvcore events tail|record|replay|snapshot`: the tools a person reaches for
//! when routing looks wrong. `tail` prints decoded batches as JSON lines and
//! flags gaps; `record` captures a stream to a file; `replay` publishes a
//! recording again (same topics, same sequence numbers), so a router bug can be
//! reproduced offline; `snapshot` asks a publisher's replay socket for the full
//! state it advertises.
//!
//! Recording format: the 8 bytes `KVCREC1\n`, then per message
//! `topic_len u32 LE, topic, seq u64 LE, payload_len u32 LE, payload`.

use std::io::{BufReader, BufWriter, Read, Write};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use clap::{Args, Subcommand};
use kvcore::wire::decode_message;
use kvcore::wire::{END_SEQ, SNAPSHOT_REQUEST};

const MAGIC: &[u8; 8] = b"KVCREC1\n";

/// Arguments of `kvcore events`.
#[derive(Args)]
pub struct EventsArgs {
    #[command(subcommand)]
    command: EventsCommand,
}

#[derive(Subcommand)]
enum EventsCommand {
    /// Subscribe and print each batch as one JSON line; gaps are flagged.
    Tail {
        /// The publisher's PUB endpoint.
        #[arg(long, default_value = "tcp://127.0.0.1:5557")]
        endpoint: String,
        /// Only messages whose topic starts with this.
        #[arg(long, default_value = "")]
        topic: String,
        /// Stop after this many messages (0: never).
        #[arg(long, default_value_t = 0)]
        count: u64,
        /// Stop after this many seconds without a message (0: never).
        #[arg(long, default_value_t = 0)]
        idle_exit_s: u64,
    },
    /// Subscribe and write every message to a file.
    Record {
        /// The publisher's PUB endpoint.
        #[arg(long, default_value = "tcp://127.0.0.1:5557")]
        endpoint: String,
        /// The recording to write.
        #[arg(long)]
        out: PathBuf,
        /// Stop after this many messages (0: never).
        #[arg(long, default_value_t = 0)]
        count: u64,
        /// Stop after this many seconds without a message (0: never).
        #[arg(long, default_value_t = 0)]
        idle_exit_s: u64,
    },
    /// Publish a recording again on a PUB socket.
    Replay {
        /// The recording to read.
        #[arg(long)]
        file: PathBuf,
        /// Where to bind the PUB socket.
        #[arg(long, default_value = "tcp://*:5557")]
        bind: String,
        /// Milliseconds to wait after binding, so subscribers can join.
        #[arg(long, default_value_t = 500)]
        wait_ms: u64,
        /// Messages per second (0: as fast as possible).
        #[arg(long, default_value_t = 0.0)]
        rate_hz: f64,
    },
    /// Ask a publisher's replay socket for a snapshot and print it as one JSON line.
    Snapshot {
        /// The publisher's replay (ROUTER) endpoint.
        #[arg(long, default_value = "tcp://127.0.0.1:5558")]
        endpoint: String,
        /// Seconds to wait for the answer.
        #[arg(long, default_value_t = 10)]
        timeout_s: u64,
    },
}

/// Runs `kvcore events ...`; errors are printed by the caller.
pub fn run(args: EventsArgs) -> Result<(), String> {
    match args.command {
        EventsCommand::Tail { endpoint, topic, count, idle_exit_s } => tail(&endpoint, &topic, count, idle_exit_s),
        EventsCommand::Record { endpoint, out, count, idle_exit_s } => record(&endpoint, &out, count, idle_exit_s),
        EventsCommand::Replay { file, bind, wait_ms, rate_hz } => replay(&file, &bind, wait_ms, rate_hz),
        EventsCommand::Snapshot { endpoint, timeout_s } => snapshot(&endpoint, timeout_s),
    }
}

fn subscribe(endpoint: &str, topic: &[u8], idle_exit_s: u64) -> Result<zmq::Socket, String> {
    let ctx = zmq::Context::new();
    let s = ctx.socket(zmq::SUB).map_err(|e| format!("zmq socket: {e}"))?;
    s.set_subscribe(topic).map_err(|e| format!("subscribe: {e}"))?;
    s.set_rcvhwm(0).map_err(|e| format!("rcvhwm: {e}"))?;
    if idle_exit_s > 0 {
        let ms = i32::try_from(idle_exit_s.saturating_mul(1000)).unwrap_or(i32::MAX);
        s.set_rcvtimeo(ms).map_err(|e| format!("rcvtimeo: {e}"))?;
    }
    s.connect(endpoint).map_err(|e| format!("connect {endpoint}: {e}"))?;
    Ok(s)
}

/// Receives one message; `None` when idle too long.
fn receive(s: &zmq::Socket) -> Result<Option<Vec<Vec<u8>>>, String> {
    match s.recv_multipart(0) {
        Ok(frames) => Ok(Some(frames)),
        Err(zmq::Error::EAGAIN) => Ok(None),
        Err(e) => Err(format!("receive: {e}")),
    }
}

fn tail(endpoint: &str, topic: &str, count: u64, idle_exit_s: u64) -> Result<(), String> {
    let s = subscribe(endpoint, topic.as_bytes(), idle_exit_s)?;
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    let mut expected: Option<u64> = None;
    let mut seen = 0u64;
    while count == 0 || seen < count {
        let Some(frames) = receive(&s)? else { break };
        seen += 1;
        let refs: Vec<&[u8]> = frames.iter().map(Vec::as_slice).collect();
        let line = match decode_message(&refs) {
            Ok(m) => {
                if let Some(want) = expected
                    && m.seq != want
                {
                    let gap = serde_json::json!({"gap": {"expected": want, "got": m.seq, "lost": m.seq.saturating_sub(want)}});
                    eprintln!("kvcore events tail: gap: expected seq {want}, got {}", m.seq);
                    writeln!(out, "{gap}").map_err(|e| e.to_string())?;
                }
                expected = Some(m.seq.wrapping_add(1));
                serde_json::to_string(&m).map_err(|e| e.to_string())?
            }
            Err(e) => serde_json::json!({"error": e.to_string()}).to_string(),
        };
        writeln!(out, "{line}").map_err(|e| e.to_string())?;
        out.flush().map_err(|e| e.to_string())?;
    }
    Ok(())
}

fn record(endpoint: &str, path: &PathBuf, count: u64, idle_exit_s: u64) -> Result<(), String> {
    let s = subscribe(endpoint, b"", idle_exit_s)?;
    let file = std::fs::File::create(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let mut w = BufWriter::new(file);
    let io = |e: std::io::Error| format!("{}: {e}", path.display());
    w.write_all(MAGIC).map_err(io)?;
    let mut seen = 0u64;
    while count == 0 || seen < count {
        let Some(frames) = receive(&s)? else { break };
        let [topic, seq, payload] = frames.as_slice() else {
            eprintln!("kvcore events record: skipped a message of {} frames", frames.len());
            continue;
        };
        let Ok(seq) = <[u8; 8]>::try_from(seq.as_slice()) else {
            eprintln!("kvcore events record: skipped a message whose seq frame is {} bytes", seq.len());
            continue;
        };
        let len = |n: usize| u32::try_from(n).map_err(|_| "frame over 4 GiB".to_string());
        w.write_all(&len(topic.len())?.to_le_bytes()).map_err(io)?;
        w.write_all(topic).map_err(io)?;
        w.write_all(&u64::from_be_bytes(seq).to_le_bytes()).map_err(io)?;
        w.write_all(&len(payload.len())?.to_le_bytes()).map_err(io)?;
        w.write_all(payload).map_err(io)?;
        w.flush().map_err(io)?;
        seen += 1;
    }
    eprintln!("kvcore events record: {seen} messages to {}", path.display());
    Ok(())
}

/// One recorded message: topic, seq, payload.
type Recorded = (Vec<u8>, u64, Vec<u8>);

/// Reads every message of a recording.
fn read_recording(path: &PathBuf) -> Result<Vec<Recorded>, String> {
    let file = std::fs::File::open(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let mut r = BufReader::new(file);
    let bad = |what: &str| format!("{}: not a kvcore recording ({what})", path.display());
    let mut magic = [0u8; 8];
    r.read_exact(&mut magic).map_err(|_| bad("too short"))?;
    if &magic != MAGIC {
        return Err(bad("bad magic"));
    }
    let mut out = Vec::new();
    loop {
        let mut n = [0u8; 4];
        match r.read_exact(&mut n) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(out),
            Err(e) => return Err(format!("{}: {e}", path.display())),
        }
        let mut take = |n: usize| -> Result<Vec<u8>, String> {
            let mut v = Vec::new();
            (&mut r).take(n as u64).read_to_end(&mut v).map_err(|e| e.to_string())?;
            if v.len() != n {
                return Err(bad("truncated message"));
            }
            Ok(v)
        };
        let topic = take(u32::from_le_bytes(n) as usize)?;
        let seq = u64::from_le_bytes(take(8)?.try_into().map_err(|_| bad("seq"))?);
        let len = u32::from_le_bytes(take(4)?.try_into().map_err(|_| bad("length"))?);
        let payload = take(len as usize)?;
        out.push((topic, seq, payload));
    }
}

fn replay(path: &PathBuf, bind: &str, wait_ms: u64, rate_hz: f64) -> Result<(), String> {
    let messages = read_recording(path)?;
    let ctx = zmq::Context::new();
    let s = ctx.socket(zmq::PUB).map_err(|e| format!("zmq socket: {e}"))?;
    s.set_sndhwm(0).map_err(|e| format!("sndhwm: {e}"))?;
    s.set_linger(5000).map_err(|e| format!("linger: {e}"))?;
    s.bind(bind).map_err(|e| format!("bind {bind}: {e}"))?;
    if let Ok(Ok(e)) = s.get_last_endpoint() {
        eprintln!("kvcore events replay: {} messages on {e}", messages.len());
    }
    std::thread::sleep(Duration::from_millis(wait_ms));
    let start = Instant::now();
    for (i, (topic, seq, payload)) in messages.iter().enumerate() {
        if rate_hz > 0.0 {
            let due = start + Duration::from_secs_f64(i as f64 / rate_hz);
            std::thread::sleep(due.saturating_duration_since(Instant::now()));
        }
        s.send_multipart([&topic[..], &seq.to_be_bytes()[..], &payload[..]], 0).map_err(|e| format!("send: {e}"))?;
    }
    Ok(())
}

fn snapshot(endpoint: &str, timeout_s: u64) -> Result<(), String> {
    let ctx = zmq::Context::new();
    let s = ctx.socket(zmq::DEALER).map_err(|e| format!("zmq socket: {e}"))?;
    let ms = i32::try_from(timeout_s.saturating_mul(1000)).unwrap_or(i32::MAX);
    s.set_rcvtimeo(ms).map_err(|e| format!("rcvtimeo: {e}"))?;
    s.set_linger(0).map_err(|e| format!("linger: {e}"))?;
    s.connect(endpoint).map_err(|e| format!("connect {endpoint}: {e}"))?;
    s.send_multipart([&b""[..], SNAPSHOT_REQUEST], 0).map_err(|e| format!("send: {e}"))?;
    let mut printed = false;
    loop {
        let frames = match s.recv_multipart(0) {
            Ok(f) => f,
            Err(zmq::Error::EAGAIN) => return Err(format!("no answer from {endpoint} within {timeout_s} s")),
            Err(e) => return Err(format!("receive: {e}")),
        };
        // [b"", topic, seq, payload] per batch, then [b"", b"", END, b""].
        let parts: Vec<&[u8]> = frames.iter().skip(1).map(Vec::as_slice).collect();
        if parts.get(1) == Some(&&END_SEQ[..]) {
            return if printed { Ok(()) } else { Err("the publisher answered with no snapshot".into()) };
        }
        let m = decode_message(&parts).map_err(|e| format!("snapshot does not decode: {e}"))?;
        println!("{}", serde_json::to_string(&m).map_err(|e| e.to_string())?);
        printed = true;
    }
}
