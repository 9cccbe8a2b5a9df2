//! Events out of the process, with the rules every caller shares (the C API
//! and Rust alike): closed batches drained as wire payloads, and the life of
//! the engine's ZMQ publisher.
//!
//! | verb | what it decides |
//! |---|---|
//! | [`Engine::drain_payloads`] | closed batches become the payloads a subscriber receives: map form, token ids, stamped when drained, no rank |
//! | [`Engine::vacant_publisher`] then [`VacantPublisher::start`] | a publisher starts only where none runs; that is known before the caller builds its configuration |
//! | [`Deployment::publisher_endpoint`] | a publisher with no endpoint of its own binds where the deployment says events go |
//! | [`Deployment::publisher_bound`] | the endpoint a publisher bound (a `*` port resolved) is what `model_info` advertises |
//! | [`Engine::stop_publisher`] | a stopped publisher first sends what it holds, for as long as the caller allows |
//! | [`Engine::hash_profile`] | the rules a router must share to match this engine's blocks, published in `model_info` and in replies |

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::capabilities::Deployment;
use crate::engine::Engine;
use crate::events::codec::{EncodeOptions, encode_events};
use crate::events::profile::HashProfile;
use crate::events::publisher::{PublishError, Publisher, PublisherConfig};

/// Why a publisher verb of the engine was refused.
#[derive(Debug, thiserror::Error)]
pub enum PublisherError {
    /// A publisher is attached already; stop it first.
    #[error("a publisher is already running")]
    Running,
    /// No publisher is attached.
    #[error("no publisher is running")]
    NotRunning,
    /// The publisher could not bind its sockets or start its thread.
    #[error("publisher: {0}")]
    Start(#[from] PublishError),
}

/// An engine with no publisher attached: proof of that state, handed out by
/// [`Engine::vacant_publisher`], ready to start one.
#[derive(Debug)]
pub struct VacantPublisher<'a> {
    engine: &'a mut Engine,
}

impl<'a> VacantPublisher<'a> {
    /// Binds a publisher with `config` and attaches it to the engine (its
    /// snapshot mirror is seeded with the current cache state, see
    /// [`Engine::attach_publisher`]); returns it, for its bound endpoint. A
    /// configuration without a hash profile gets the engine's
    /// ([`Engine::hash_profile`]).
    pub fn start(self, mut config: PublisherConfig) -> Result<&'a Publisher, PublisherError> {
        let engine = self.engine;
        if config.profile.is_none() {
            config.profile = Some(engine.hash_profile());
        }
        let publisher = Publisher::bind(config)?;
        engine.attach_publisher(publisher);
        Ok(engine.publisher().expect("invariant: the publisher attached just above is attached"))
    }
}

impl Engine {
    /// The engine's publisher slot while no publisher is attached, or
    /// [`PublisherError::Running`]. The check comes first, so a caller that
    /// builds the configuration afterwards reports a running publisher before
    /// any fault of its arguments.
    pub fn vacant_publisher(&mut self) -> Result<VacantPublisher<'_>, PublisherError> {
        if self.publisher().is_some() {
            return Err(PublisherError::Running);
        }
        Ok(VacantPublisher { engine: self })
    }

    /// Detaches the publisher, sends the batches already handed to it
    /// (waiting up to `flush`), then closes its sockets and ends its threads.
    /// Returns whether everything was sent in time.
    pub fn stop_publisher(&mut self, flush: Duration) -> Result<bool, PublisherError> {
        let publisher = self.detach_publisher().ok_or(PublisherError::NotRunning)?;
        let sent = publisher.flush(flush);
        drop(publisher);
        Ok(sent)
    }

    /// The hash profile of this engine's stream: its block size and image
    /// placeholder id with this build's recipes, and a hybrid engine's KV
    /// cache groups (docs/wire-format.md).
    pub fn hash_profile(&self) -> HashProfile {
        crate::capabilities::profile_of(self.config())
    }

    /// Takes the closed batches as wire payloads, oldest first: each is the
    /// msgpack `[ts, events, data_parallel_rank]` that a ZMQ subscriber
    /// receives as a message's third frame, in map form with token ids, no
    /// rank, and every batch of one call stamped with the time of the call.
    pub fn drain_payloads(&mut self) -> Vec<Vec<u8>> {
        let ts = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0.0, |d| d.as_secs_f64());
        self.drain_batches()
            .into_iter()
            .map(|batch| {
                let mut payload = Vec::new();
                encode_events(&batch.events, ts, None, &EncodeOptions::default(), &mut payload);
                payload
            })
            .collect()
    }
}

impl Deployment {
    /// Where a publisher binds: `requested` when the caller names an
    /// endpoint, else the deployment's `kv_events_endpoint`; `None` when
    /// neither says.
    pub fn publisher_endpoint(&self, requested: Option<String>) -> Option<String> {
        requested.or_else(|| self.kv_events_endpoint.clone())
    }

    /// Records the endpoint a publisher bound (a `*` port resolved): it is the
    /// one `model_info` advertises from then on.
    pub fn publisher_bound(&mut self, publisher: &Publisher) {
        self.kv_events_endpoint = Some(publisher.endpoint().to_owned());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::EngineConfig;

    fn engine() -> Engine {
        Engine::new(EngineConfig { block_size_tokens: 4, blocks_device: 16, ..Default::default() }).unwrap()
    }

    /// A second start is refused while a publisher runs, stopping is refused
    /// when none runs, and a start after a stop works; driven on loopback
    /// with a `*` port, whose bound endpoint the deployment then advertises.
    #[test]
    fn a_publisher_starts_only_where_none_runs() {
        let mut e = engine();
        assert!(matches!(e.stop_publisher(Duration::ZERO), Err(PublisherError::NotRunning)));
        let mut deployment = Deployment::default();
        let endpoint = deployment.publisher_endpoint(Some("tcp://127.0.0.1:*".into())).unwrap();
        let config = PublisherConfig { endpoint, ..Default::default() };
        let publisher = e.vacant_publisher().unwrap().start(config.clone()).unwrap();
        deployment.publisher_bound(publisher);
        let bound = deployment.kv_events_endpoint.clone().unwrap();
        assert!(bound.starts_with("tcp://127.0.0.1:") && !bound.ends_with('*'), "{bound}");
        assert!(matches!(e.vacant_publisher(), Err(PublisherError::Running)));
        assert!(e.stop_publisher(Duration::from_secs(1)).unwrap());
        assert!(e.vacant_publisher().unwrap().start(config).is_ok());
    }

    /// Without an endpoint of its own a publisher binds where the deployment
    /// says; with neither there is no endpoint.
    #[test]
    fn the_deployment_endpoint_is_the_fallback() {
        let mut d = Deployment::default();
        assert_eq!(d.publisher_endpoint(None), None);
        d.kv_events_endpoint = Some("tcp://*:5557".into());
        assert_eq!(d.publisher_endpoint(None).as_deref(), Some("tcp://*:5557"));
        assert_eq!(d.publisher_endpoint(Some("ipc://x".into())).as_deref(), Some("ipc://x"));
    }
}
