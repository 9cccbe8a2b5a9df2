//! Events out of the process: the encoded wire form, and the ZMQ publisher.
//!
//! The rules (a publisher starts only where none runs, an endpoint falls back
//! to the engine's, the bound endpoint is advertised, what a drained payload
//! holds) are the engine's (`src/outbound.rs`); this file only converts C
//! arguments and lays results out in C buffers. The wire bytes handed out by
//! `kvc_engine_drain_events_wire` are the payloads a ZMQ subscriber receives
//! as the third frame of each message, so an application that ships events
//! its own way can still feed any router that speaks the format.
//!
//! `kvc_publisher_config` mirrors [`PublisherConfig`] and
//! `kvc_publisher_stats` mirrors [`PublisherStats`]: each conversion names
//! every field on both sides without `..`, so a field added on one side fails
//! to compile until it is mirrored on the other.

use std::ffi::c_char;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::capabilities::Deployment;
use crate::events::codec::{EncodeOptions, EventForm, encode_events};
use crate::events::publisher::{PublisherConfig, PublisherStats};
use crate::outbound::PublisherError;

use super::boundary::{
    ffi_boundary, optional_str, try_out, try_ref, try_slice, try_slice_out, with_engine, without_engine,
};
use super::handle::{HeldBatch, kvc_engine};
use super::request::kvc_bytes;
use super::status::{Failure, kvc_status};

/// How long `kvc_engine_publisher_stop` lets the publisher send what it
/// holds (its documented bound).
const STOP_FLUSH: Duration = Duration::from_secs(1);

/// How the publisher binds and encodes. Fill it with
/// `kvc_publisher_config_default`, then change what you need.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct kvc_publisher_config {
    /// Where the `PUB` socket binds (e.g. "tcp://0.0.0.0:5557"; port `*` picks a
    /// free one), NUL-terminated; NULL means the engine's `kv_events_endpoint`.
    pub endpoint: *const c_char,
    /// Where the replay `ROUTER` socket binds, NUL-terminated; NULL turns replay off.
    pub replay_endpoint: *const c_char,
    /// The topic frame of every message (absent: empty topic).
    pub topic: kvc_bytes,
    /// The data-parallel rank, read when `has_data_parallel_rank`; the TCP
    /// port becomes `port + rank`.
    pub data_parallel_rank: u32,
    /// Whether `data_parallel_rank` is set.
    pub has_data_parallel_rank: bool,
    /// Whether `BlockStored` carries `token_ids` (and `block_mm_infos`).
    pub token_ids: bool,
    /// Positional (array) events instead of maps, for consumers older than vLLM 0.26.
    pub array_form: bool,
    /// Published batches kept for replay.
    pub buffer_steps: u32,
    /// Batches that may wait for the publisher thread before new ones are dropped.
    pub queue_capacity: u32,
    /// The `PUB` socket's send high-water mark, in messages.
    pub send_hwm: i32,
    /// After this many milliseconds with nothing sent, an empty heartbeat
    /// batch goes out with the next sequence number; 0 turns heartbeats off.
    pub heartbeat_ms: u32,
}

/// A publisher's counters.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct kvc_publisher_stats {
    /// Batches handed to the publisher (sequence numbers reserved).
    pub batches_reserved: u64,
    /// Batches handed to the `PUB` socket (heartbeats included). ZMQ drops
    /// silently for a subscriber at its high-water mark, so this is what the
    /// socket took, not what each subscriber received (it sees a gap).
    pub batches_handed_to_socket: u64,
    /// Empty heartbeat batches handed to the socket.
    pub heartbeats: u64,
    /// Batches dropped because the publisher queue was full.
    pub dropped_queue_full: u64,
    /// Batches whose send failed.
    pub dropped_send_failed: u64,
    /// Replay requests served.
    pub replays_served: u64,
    /// Replay requests older than the ring, answered with the snapshot.
    pub replays_answered_by_snapshot: u64,
    /// Snapshot requests served.
    pub snapshots_served: u64,
    /// Malformed requests on the replay socket.
    pub bad_requests: u64,
}

impl kvc_publisher_config {
    /// The defaults of [`PublisherConfig`], field for field, except the
    /// endpoint: NULL, which means the engine's `kv_events_endpoint`.
    fn defaults() -> Self {
        let PublisherConfig {
            endpoint: _,
            replay_endpoint,
            topic,
            data_parallel_rank,
            buffer_steps,
            queue_capacity,
            send_hwm,
            encode: EncodeOptions { form, token_ids },
            heartbeat_ms,
            profile: _,
        } = PublisherConfig::default();
        // A default string would need storage that outlives the C struct;
        // the defaults have no replay socket and an empty topic, which C
        // reads as NULL and absent.
        assert!(replay_endpoint.is_none() && topic.is_empty(), "the default publisher has no replay and no topic");
        Self {
            endpoint: std::ptr::null(),
            replay_endpoint: std::ptr::null(),
            topic: kvc_bytes { ptr: std::ptr::null(), len: 0 },
            data_parallel_rank: data_parallel_rank.unwrap_or(0),
            has_data_parallel_rank: data_parallel_rank.is_some(),
            token_ids,
            array_form: form == EventForm::Array,
            buffer_steps: buffer_steps as u32,
            queue_capacity: queue_capacity as u32,
            send_hwm,
            heartbeat_ms,
        }
    }

    /// Converts a C publisher configuration; a NULL endpoint is the one
    /// `deployment` falls back to.
    fn publisher_config(&self, deployment: &Deployment) -> Result<PublisherConfig, Failure> {
        let kvc_publisher_config {
            endpoint,
            replay_endpoint,
            topic,
            data_parallel_rank,
            has_data_parallel_rank,
            token_ids,
            array_form,
            buffer_steps,
            queue_capacity,
            send_hwm,
            heartbeat_ms,
        } = *self;
        let endpoint = deployment.publisher_endpoint(optional_str(endpoint, "config.endpoint")?).ok_or_else(|| {
            Failure::new(
                kvc_status::InvalidArgument,
                "no endpoint: set config.endpoint or the engine's kv_events_endpoint",
            )
        })?;
        let rank = has_data_parallel_rank.then_some(data_parallel_rank);
        check_endpoint(&endpoint, "endpoint", rank)?;
        let replay_endpoint = optional_str(replay_endpoint, "config.replay_endpoint")?;
        if let Some(replay) = &replay_endpoint {
            check_endpoint(replay, "replay_endpoint", rank)?;
        }
        let bounded = |value: u64, min: u64, max: u64, name: &str| {
            if (min..=max).contains(&value) {
                Ok(())
            } else {
                Err(Failure::new(kvc_status::InvalidArgument, format!("config.{name} {value} is not in {min}..={max}")))
            }
        };
        bounded(u64::from(buffer_steps), 0, u64::from(KVC_PUBLISHER_BUFFER_STEPS_LIMIT), "buffer_steps")?;
        bounded(u64::from(queue_capacity), 1, u64::from(KVC_PUBLISHER_QUEUE_CAPACITY_LIMIT), "queue_capacity")?;
        // ZMQ reads a high-water mark of 0 as "no limit": a stalled
        // subscriber would then make the socket hold every message.
        let hwm = u64::try_from(send_hwm).unwrap_or(0);
        bounded(hwm, 1, u64::from(KVC_PUBLISHER_SEND_HWM_LIMIT), "send_hwm")?;
        let topic: &[u8] = if topic.ptr.is_null() && topic.len != 0 {
            return Err(Failure::new(kvc_status::InvalidArgument, "`config.topic.ptr` is NULL with a length"));
        } else {
            try_slice!(topic.ptr, topic.len, "config.topic")
        };
        Ok(PublisherConfig {
            endpoint,
            replay_endpoint,
            topic: topic.to_vec(),
            data_parallel_rank: rank,
            buffer_steps: buffer_steps as usize,
            queue_capacity: queue_capacity as usize,
            send_hwm,
            encode: EncodeOptions { form: if array_form { EventForm::Array } else { EventForm::Map }, token_ids },
            heartbeat_ms,
            profile: None,
        })
    }
}

/// Most batches `kvc_publisher_config.buffer_steps` may keep for replay.
pub const KVC_PUBLISHER_BUFFER_STEPS_LIMIT: u32 = 1 << 20;
/// Most batches `kvc_publisher_config.queue_capacity` may let wait.
pub const KVC_PUBLISHER_QUEUE_CAPACITY_LIMIT: u32 = 1 << 20;
/// Highest `kvc_publisher_config.send_hwm` (messages per subscriber).
pub const KVC_PUBLISHER_SEND_HWM_LIMIT: u32 = 1 << 20;

/// Checks an endpoint before ZMQ sees it (`name` as the config field):
/// not empty, and a `tcp://` endpoint ends in `:*` or in a port in
/// `1..=65535` that stays there after the data-parallel `rank` is added.
/// ZMQ itself takes a port past 65535 modulo 65536, binding another port
/// than the one asked for; that is refused here with
/// `KVC_STATUS_PUBLISHER_START_FAILED`.
pub(crate) fn check_endpoint(endpoint: &str, name: &str, rank: Option<u32>) -> Result<(), Failure> {
    let refuse = |why: String| Failure::new(kvc_status::PublisherStartFailed, format!("config.{name}: {why}"));
    if endpoint.is_empty() {
        return Err(refuse("the endpoint is empty".into()));
    }
    let Some(address) = endpoint.strip_prefix("tcp://") else { return Ok(()) };
    let Some((host, port)) = address.rsplit_once(':') else {
        return Err(refuse(format!("{endpoint:?} has no port")));
    };
    if host.is_empty() {
        return Err(refuse(format!("{endpoint:?} has no host (use `*` for every interface)")));
    }
    if port == "*" {
        return Ok(());
    }
    let port: u32 = match port.parse() {
        Ok(p) if port.bytes().all(|b| b.is_ascii_digit()) => p,
        _ => return Err(refuse(format!("{endpoint:?}: the port {port:?} is neither `*` nor a number"))),
    };
    let last = port.checked_add(rank.unwrap_or(0));
    if port == 0 || last.is_none_or(|p| p > 65_535) {
        let with_rank = rank.map_or(String::new(), |r| format!(" plus the data-parallel rank {r}"));
        return Err(refuse(format!("{endpoint:?}: the port{with_rank} is not in 1..=65535 (`*` picks a free one)")));
    }
    Ok(())
}

impl From<PublisherStats> for kvc_publisher_stats {
    fn from(stats: PublisherStats) -> Self {
        let PublisherStats {
            batches_reserved,
            batches_handed_to_socket,
            heartbeats,
            dropped_queue_full,
            dropped_send_failed,
            replays_served,
            replays_answered_by_snapshot,
            snapshots_served,
            bad_requests,
        } = stats;
        Self {
            batches_reserved,
            batches_handed_to_socket,
            heartbeats,
            dropped_queue_full,
            dropped_send_failed,
            replays_served,
            replays_answered_by_snapshot,
            snapshots_served,
            bad_requests,
        }
    }
}

/// Writes the default publisher configuration into `*config_out`: the
/// engine's endpoint, no replay, empty topic, no rank, token ids on, map
/// form, 10000 replay batches, a queue of 1024 batches, HWM 100000,
/// heartbeat every 1000 ms.
///
/// Returns `KVC_STATUS_OK` or `KVC_STATUS_NULL_ARGUMENT`. Threading: any thread.
///
/// # Safety
///
/// `config_out` is NULL or valid for one write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kvc_publisher_config_default(config_out: *mut kvc_publisher_config) -> kvc_status {
    ffi_boundary!({
        without_engine(|| {
            let out = try_out!(config_out);
            out.write(kvc_publisher_config::defaults());
            Ok(())
        })
    })
}

/// Starts publishing the engine's events over ZMQ: binds the sockets now and
/// from then on sends each step's batch from a background thread (the step
/// never blocks on the network). Closed batches stay drainable as well.
///
/// Ownership: the publisher belongs to the engine; `kvc_engine_publisher_stop`
/// or `kvc_engine_free` stops it. The strings in `config` are copied.
/// Threading: one thread at a time per engine, as for every engine call.
///
/// Returns `KVC_STATUS_OK`; `KVC_STATUS_NULL_ARGUMENT`;
/// `KVC_STATUS_INVALID_ARGUMENT` (no endpoint here nor in the engine config,
/// or a topic with a NULL pointer); `KVC_STATUS_INVALID_UTF8`;
/// `KVC_STATUS_INVALID_ARGUMENT` also for `buffer_steps` over
/// `KVC_PUBLISHER_BUFFER_STEPS_LIMIT`, `queue_capacity` 0 or over
/// `KVC_PUBLISHER_QUEUE_CAPACITY_LIMIT`, `send_hwm` not in
/// `1..=KVC_PUBLISHER_SEND_HWM_LIMIT` (ZMQ reads 0 as no limit);
/// `KVC_STATUS_PUBLISHER_RUNNING`; `KVC_STATUS_PUBLISHER_START_FAILED` (bind
/// refused; an empty endpoint, a `tcp://` endpoint without a host or whose
/// port (plus the rank) is not `*` or in 1..=65535; thread not started; the
/// message says which);
/// `KVC_STATUS_ENGINE_BUSY`; `KVC_STATUS_POISONED`.
///
/// # Safety
///
/// `engine` is NULL or a live engine; `config` is NULL or a valid config whose
/// strings are NULL or NUL-terminated and whose topic describes readable bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kvc_engine_publisher_start(
    engine: *mut kvc_engine,
    config: *const kvc_publisher_config,
) -> kvc_status {
    ffi_boundary!({
        with_engine(engine, |st| {
            let c = try_ref!(config);
            // The engine answers PUBLISHER_RUNNING before the arguments are read.
            let vacant = st.engine.vacant_publisher()?;
            let publisher = vacant.start(c.publisher_config(&st.deployment)?)?;
            st.deployment.publisher_bound(publisher);
            Ok(())
        })
    })
}

/// Stops the publisher: batches already handed to it are sent (waiting up
/// to one second), then its sockets close and its threads end. The engine is
/// then as if it had never published: `kvc_engine_model_info` and a later
/// `kvc_engine_publisher_start` with a NULL endpoint see the engine
/// config's `kv_events_endpoint` (or none), not the endpoint just closed.
///
/// Returns `KVC_STATUS_OK`; `KVC_STATUS_PUBLISHER_NOT_RUNNING`;
/// `KVC_STATUS_NULL_ARGUMENT`; `KVC_STATUS_ENGINE_BUSY`; `KVC_STATUS_POISONED`.
///
/// # Safety
///
/// `engine` is NULL or a live engine.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kvc_engine_publisher_stop(engine: *mut kvc_engine) -> kvc_status {
    ffi_boundary!({
        with_engine(engine, |st| {
            st.engine.stop_publisher(STOP_FLUSH)?;
            // Back to the state of never having published: `model_info`
            // advertises the configured endpoint again (or none), and a later
            // start without an endpoint falls back to that, not to the one
            // the stopped publisher bound.
            st.deployment.kv_events_endpoint = st.configured_endpoint.clone();
            Ok(())
        })
    })
}

/// Copies the running publisher's bound endpoint (e.g.
/// "tcp://127.0.0.1:40123") as a NUL-terminated string; `*n_out` receives
/// its length. With `buf` NULL and `len` 0 only the length is reported.
///
/// Returns `KVC_STATUS_OK`; `KVC_STATUS_PUBLISHER_NOT_RUNNING`;
/// `KVC_STATUS_BUFFER_TOO_SMALL`; `KVC_STATUS_NULL_ARGUMENT`;
/// `KVC_STATUS_INVALID_ARGUMENT`; `KVC_STATUS_ENGINE_BUSY`; `KVC_STATUS_POISONED`.
///
/// # Safety
///
/// `engine` is NULL or a live engine; `buf` is valid for writing `len` bytes
/// (or NULL with `len` 0); `n_out` is NULL or valid for one write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kvc_engine_publisher_endpoint(
    engine: *mut kvc_engine,
    buf: *mut c_char,
    len: usize,
    n_out: *mut usize,
) -> kvc_status {
    ffi_boundary!({
        with_engine(engine, |st| {
            let out = try_out!(n_out);
            let dst = try_slice_out!(buf, len);
            let publisher = st.engine.publisher().ok_or(PublisherError::NotRunning)?;
            let endpoint = publisher.endpoint().as_bytes();
            if !buf.is_null() {
                if dst.len() <= endpoint.len() {
                    return Err(Failure::new(
                        kvc_status::BufferTooSmall,
                        format!("the endpoint needs {} bytes", endpoint.len() + 1),
                    ));
                }
                for (d, s) in dst.iter_mut().zip(endpoint) {
                    d.write(*s as c_char);
                }
                dst[endpoint.len()].write(0);
            }
            out.write(endpoint.len());
            Ok(())
        })
    })
}

/// Reads the running publisher's counters into `*stats_out`.
///
/// Returns `KVC_STATUS_OK`; `KVC_STATUS_PUBLISHER_NOT_RUNNING`;
/// `KVC_STATUS_NULL_ARGUMENT`; `KVC_STATUS_ENGINE_BUSY`; `KVC_STATUS_POISONED`.
///
/// # Safety
///
/// `engine` is NULL or a live engine; `stats_out` is NULL or valid for one write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kvc_engine_publisher_stats(
    engine: *mut kvc_engine,
    stats_out: *mut kvc_publisher_stats,
) -> kvc_status {
    ffi_boundary!({
        with_engine(engine, |st| {
            let out = try_out!(stats_out);
            let stats = st.engine.publisher().ok_or(PublisherError::NotRunning)?.stats();
            out.write(kvc_publisher_stats::from(stats));
            Ok(())
        })
    })
}

/// Moves closed event batches into `buf` as encoded wire payloads, oldest
/// first: each is a 4-byte little-endian length followed by that many bytes
/// of msgpack `[ts, events, data_parallel_rank]` (map form, token ids
/// included), exactly the payload frame a ZMQ subscriber receives. Only whole
/// payloads are written; `*n_out` receives the bytes written, 0 when there is
/// nothing to drain. With `buf` NULL and `len` 0 nothing is taken and
/// `*n_out` receives the bytes all waiting payloads need.
///
/// This and `kvc_engine_drain_events` take from the same closed batches (at
/// most `kvc_config.event_batches_max` wait): an application uses one of the
/// two. A batch whose records were partly drained goes out whole here.
///
/// Returns `KVC_STATUS_OK`; `KVC_STATUS_BUFFER_TOO_SMALL` (the oldest
/// payload alone does not fit; nothing taken); `KVC_STATUS_NULL_ARGUMENT`;
/// `KVC_STATUS_INVALID_ARGUMENT`; `KVC_STATUS_ENGINE_BUSY`; `KVC_STATUS_POISONED`.
///
/// # Safety
///
/// `engine` is NULL or a live engine; `buf` is valid for writing `len` bytes
/// (or NULL with `len` 0); `n_out` is NULL or valid for one write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kvc_engine_drain_events_wire(
    engine: *mut kvc_engine,
    buf: *mut u8,
    len: usize,
    n_out: *mut usize,
) -> kvc_status {
    ffi_boundary!({
        with_engine(engine, |st| {
            let out = try_out!(n_out);
            let dst = try_slice_out!(buf, len);
            st.held.absorb(&mut st.engine);
            // A batch is encoded once, when a wire call first reaches it, so
            // that a size query and the copy that follows see the same bytes.
            let ts = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0.0, |d| d.as_secs_f64());
            let payload = |h: &mut HeldBatch| -> usize {
                let p = h.payload.get_or_insert_with(|| {
                    let mut p = Vec::new();
                    encode_events(&h.batch.events, ts, None, &EncodeOptions::default(), &mut p);
                    p
                });
                4 + p.len()
            };
            if buf.is_null() {
                out.write(st.held.batches.iter_mut().map(payload).sum());
                return Ok(());
            }
            let mut written = 0;
            while let Some(h) = st.held.batches.front_mut() {
                let framed = payload(h);
                if written + framed > dst.len() {
                    if written == 0 {
                        return Err(Failure::new(
                            kvc_status::BufferTooSmall,
                            format!("the oldest payload needs {framed} bytes, the buffer has {}", dst.len()),
                        ));
                    }
                    break;
                }
                let p = h.payload.as_deref().unwrap_or_default();
                let len_le = (p.len() as u32).to_le_bytes();
                for (d, s) in dst[written..].iter_mut().zip(len_le.iter().chain(p.iter())) {
                    d.write(*s);
                }
                written += framed;
                st.held.batches.pop_front();
            }
            out.write(written);
            Ok(())
        })
    })
}
