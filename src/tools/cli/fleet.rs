//! `kvcore fleet-engine`: one kvcore engine as a fleet member. The engine binds
//! its event publisher (PUB, and the replay ROUTER) and a control socket (ZMQ
//! REP, one JSON request per message, one JSON answer). A serving front end
//! (tests/fleet/dynamo_worker.py: Dynamo's runtime and relay) hands each
//! request it is routed to the control socket; a test asks the same socket
//! what the engine holds.
//!
//! The first stdout line is `{"ready":true,"pub":..,"replay":..,"control":..,"pid":..}`.
//!
//! Control requests (`image`: `{"pixels": s, "uuid": s|null, "start": n, "len": n}`,
//! the image's bytes and the prompt span of its placeholders):
//! - `{"op":"serve","tokens":[..],"image":..}`: admit, compute the whole prompt,
//!   finish, close the step (its events go out): `{"cached": n, "tokens": n}`;
//! - `{"op":"held","tokens":[..],"image":..}`: the tokens found cached (admit,
//!   cancel): `{"cached": n}`;
//! - `{"op":"republish"}`: the whole cache state as one batch on the live stream
//!   (`AllBlocksCleared`, then every cached block): `{"events": n}`;
//! - `{"op":"clear"}`: drops every cached block (`AllBlocksCleared` goes out);
//! - `{"op":"mm_hash","uuid":s}`: Dynamo's `mm_hash` of an image identifier;
//!   `{"op":"mm_hash","pixels":s}`: the content-derived `mm_hash` of an image's
//!   bytes (the one an engine publishes when it has no usable UUID);
//! - `{"op":"stats"}`: publisher counters, cached blocks and live requests;
//! - `{"op":"quit"}`: answers `{"ok":true}` and exits.
//!
//! A request that cannot be served answers `{"error": ..}` and changes nothing.

use std::io::Write;

use clap::Args;
use kvcore::wire::{EncodeOptions, EventForm};
use kvcore::{Engine, EngineConfig, MmContent, MmItemSpec, Publisher, PublisherConfig, RequestSpec, TokenRun};
use kvcore::{ImageDigest, mm_hash, mm_hash_of_identifier};
use serde::Deserialize;
use serde_json::{Value, json};

/// Arguments of `kvcore fleet-engine`.
#[derive(Args)]
pub struct FleetEngineArgs {
    /// Tokens per KV block.
    #[arg(long, default_value_t = 32)]
    block_size: u32,
    /// Device blocks of the engine.
    #[arg(long, default_value_t = 1024)]
    blocks: u32,
    /// The event publisher's PUB endpoint (`*` for any free port).
    #[arg(long, default_value = "tcp://127.0.0.1:*")]
    publish: String,
    /// The replay ROUTER endpoint.
    #[arg(long, default_value = "tcp://127.0.0.1:*")]
    replay: String,
    /// The control REP endpoint.
    #[arg(long, default_value = "tcp://127.0.0.1:*")]
    control: String,
    /// Event form on the wire: `map` (vLLM's tagged maps) or `array`.
    #[arg(long, default_value = "map")]
    form: String,
}

#[derive(Deserialize)]
struct Image {
    pixels: String,
    uuid: Option<String>,
    start: u32,
    len: u32,
}

#[derive(Deserialize)]
struct Request {
    op: String,
    #[serde(default)]
    tokens: Vec<u32>,
    image: Option<Image>,
    uuid: Option<String>,
    pixels: Option<String>,
}

/// Runs `kvcore fleet-engine` until `quit`.
pub fn run(args: FleetEngineArgs) -> Result<(), String> {
    let form = match args.form.as_str() {
        "map" => EventForm::Map,
        "array" => EventForm::Array,
        other => return Err(format!("--form must be map or array, not {other:?}")),
    };
    let mut engine = Engine::new(EngineConfig {
        block_size_tokens: args.block_size,
        blocks_device: args.blocks,
        ..Default::default()
    })
    .map_err(|e| format!("engine: {e}"))?;
    let publisher = Publisher::bind(PublisherConfig {
        endpoint: args.publish.clone(),
        replay_endpoint: Some(args.replay.clone()),
        encode: EncodeOptions { form, ..Default::default() },
        ..Default::default()
    })
    .map_err(|e| format!("publisher: {e}"))?;
    let (pub_ep, replay_ep) = (publisher.endpoint().to_owned(), publisher.replay_endpoint().map(str::to_owned));
    engine.attach_publisher(publisher);
    let ctx = zmq::Context::new();
    let control = ctx.socket(zmq::REP).map_err(|e| format!("control socket: {e}"))?;
    control.bind(&args.control).map_err(|e| format!("binding {}: {e}", args.control))?;
    let control_ep = control
        .get_last_endpoint()
        .map_err(|e| format!("control endpoint: {e}"))?
        .map_err(|_| "control endpoint is not UTF-8".to_owned())?;
    let ready = json!({"ready": true, "pub": pub_ep, "replay": replay_ep, "control": control_ep,
                       "pid": std::process::id()});
    let mut out = std::io::stdout().lock();
    writeln!(out, "{ready}").and_then(|()| out.flush()).map_err(|e| format!("stdout: {e}"))?;
    drop(out);
    loop {
        let msg = control.recv_bytes(0).map_err(|e| format!("control recv: {e}"))?;
        let (answer, quit) = match serde_json::from_slice::<Request>(&msg) {
            Ok(req) => (answer(&mut engine, &req), req.op == "quit"),
            Err(e) => (json!({"error": format!("bad request: {e}")}), false),
        };
        control.send(answer.to_string().as_bytes(), 0).map_err(|e| format!("control send: {e}"))?;
        if quit {
            if let Some(p) = engine.publisher() {
                p.flush(std::time::Duration::from_secs(1));
            }
            return Ok(());
        }
    }
}

fn spec<'a>(req: &'a Request) -> RequestSpec<'a> {
    let Some(img) = &req.image else { return RequestSpec { tokens: &req.tokens, ..Default::default() } };
    RequestSpec {
        tokens: &req.tokens,
        items: vec![MmItemSpec {
            content: MmContent::Bytes(img.pixels.as_bytes()),
            runs: vec![TokenRun { start: img.start, len: img.len }],
        }],
        uuids: img.uuid.as_ref().map(|u| vec![Some(u.as_bytes())]),
        ..Default::default()
    }
}

fn answer(engine: &mut Engine, req: &Request) -> Value {
    match req.op.as_str() {
        "serve" => {
            let a = match engine.add_request(&spec(req)) {
                Ok(a) => a,
                Err(e) => return json!({"error": format!("admission: {e}")}),
            };
            let done = engine.commit(a.id, req.tokens.len() as u64).and_then(|()| engine.finish(a.id));
            if let Err(e) = done {
                let _ = engine.cancel(a.id);
                return json!({"error": format!("serving: {e}")});
            }
            engine.step();
            json!({"cached": a.tokens_cached, "tokens": req.tokens.len()})
        }
        "held" => match engine.add_request(&spec(req)) {
            Ok(a) => {
                let _ = engine.cancel(a.id);
                json!({"cached": a.tokens_cached})
            }
            Err(e) => json!({"error": format!("admission: {e}")}),
        },
        "republish" => {
            let snapshot = engine.snapshot();
            let n = snapshot.len();
            match engine.detach_publisher() {
                Some(mut p) => {
                    p.publish(snapshot);
                    engine.attach_publisher(p);
                    json!({"events": n})
                }
                None => json!({"error": "no publisher"}),
            }
        }
        "clear" => {
            engine.clear();
            engine.step();
            json!({"ok": true})
        }
        "mm_hash" => match (&req.uuid, &req.pixels) {
            (Some(u), None) => json!({"mm_hash": mm_hash_of_identifier(u)}),
            (None, Some(p)) => json!({"mm_hash": mm_hash(&ImageDigest::of_content(p.as_bytes()), None)}),
            _ => json!({"error": "mm_hash needs either uuid or pixels"}),
        },
        "stats" => {
            let s = engine.publisher().map(Publisher::stats).unwrap_or_default();
            let (device, host) = engine.blocks_cached();
            json!({"blocks_device": device, "blocks_host": host, "requests_live": engine.requests_live(),
                   "batches_handed_to_socket": s.batches_handed_to_socket,
                   "replays_served": s.replays_served, "snapshots_served": s.snapshots_served,
                   "replays_answered_by_snapshot": s.replays_answered_by_snapshot,
                   "dropped_queue_full": s.dropped_queue_full, "dropped_send_failed": s.dropped_send_failed})
        }
        "quit" => json!({"ok": true}),
        other => json!({"error": format!("unknown op {other:?}")}),
    }
}
