//! `kvcore demo`: a short, readable walk through the engine that prints the
//! events it produced: admission, prefix reuse with and without images,
//! "same UUID, different pixels", and eviction.

use kvcore::KvEvent;
use kvcore::{Engine, EngineConfig, MmContent, MmItemSpec, RequestSpec, TokenRun};

fn show(engine: &mut Engine) {
    engine.step();
    for e in engine.drain_events() {
        match e {
            KvEvent::BlockStored(s) => {
                let hashes: Vec<String> = s.keys.iter().map(|k| format!("{:016x}", k.wire_hash().0 as u64)).collect();
                let images: Vec<String> = s
                    .images
                    .iter()
                    .map(|i| format!("{}..(uuid {})", &i.digest.to_hex()[..12], i.uuid.as_deref().unwrap_or("-")))
                    .collect();
                println!(
                    "    BlockStored  {} [{}] images [{}]",
                    s.medium.as_str(),
                    hashes.join(", "),
                    images.join(", ")
                );
            }
            KvEvent::BlockRemoved(r) => {
                let hashes: Vec<String> = r.keys.iter().map(|k| format!("{:016x}", k.wire_hash().0 as u64)).collect();
                println!("    BlockRemoved {} [{}]", r.medium.as_str(), hashes.join(", "));
            }
            KvEvent::AllBlocksCleared(_) => println!("    AllBlocksCleared"),
        }
    }
}

fn serve(engine: &mut Engine, what: &str, spec: &RequestSpec<'_>) {
    match engine.add_request(spec) {
        Ok(a) => {
            println!("{what}: {} prompt tokens, {} found in the cache", spec.tokens.len(), a.tokens_cached);
            engine.commit(a.id, spec.tokens.len() as u64).expect("the request is live");
            engine.finish(a.id).expect("the request is live");
        }
        Err(e) => println!("{what}: rejected: {e}"),
    }
    show(engine);
}

/// Runs the demonstration.
pub fn run() {
    let config = EngineConfig { block_size_tokens: 16, blocks_device: 12, ..Default::default() };
    let pad = config.image_placeholder_token_id;
    let mut engine = Engine::new(config).expect("the demo config is valid");
    println!("kvcore demo: block size 16, 12 device blocks\n");

    let system: Vec<u32> = (1000..1032).collect();
    let mut chat = system.clone();
    chat.extend(2000..2010);
    serve(&mut engine, "1. text request", &RequestSpec { tokens: &chat, ..Default::default() });
    let mut chat2 = system.clone();
    chat2.extend(3000..3020);
    serve(&mut engine, "2. same system prompt, new question", &RequestSpec { tokens: &chat2, ..Default::default() });

    let mut with_image = system.clone();
    with_image.extend(std::iter::repeat_n(pad, 32));
    with_image.extend(4000..4008);
    let image = |pixels: &'static [u8]| MmItemSpec {
        content: MmContent::Bytes(pixels),
        runs: vec![TokenRun { start: 32, len: 32 }],
    };
    let uuid: &[u8] = b"sku-001";
    let spec = |pixels| RequestSpec {
        tokens: &with_image,
        items: vec![image(pixels)],
        uuids: Some(vec![Some(uuid)]),
        ..Default::default()
    };
    serve(&mut engine, "3. image request, UUID sku-001", &spec(b"red pixels"));
    serve(&mut engine, "4. the same image again", &spec(b"red pixels"));
    serve(&mut engine, "5. same UUID, different pixels (must not reuse the image blocks)", &spec(b"blue pixels"));

    let long: Vec<u32> = (5000..5150).collect();
    serve(
        &mut engine,
        "6. a long request that needs the cache's room (evicts LRU blocks)",
        &RequestSpec { tokens: &long, ..Default::default() },
    );
    let c = engine.counters();
    println!(
        "\ncounters: {} requests, {} tokens from cache, {} computed, {} blocks evicted, hint hits {} misses {} conflicts {}",
        c.requests_admitted,
        c.tokens_cached,
        c.tokens_uncached,
        c.blocks_evicted_device,
        c.hint_hits,
        c.hint_misses,
        c.hint_conflicts
    );
}
