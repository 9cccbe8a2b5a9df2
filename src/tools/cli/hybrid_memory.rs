//! `kvcore hybrid-memory`: the blocks a sliding-window group holds against
//! full attention on the chat workload (`kvcore_tools::bench::hybrid`).

use kvcore_tools::bench::hybrid::{self, HybridCase, HybridParams};
use kvcore_tools::sim::workload::{ChatConfig, chat_workload};

/// Arguments of `kvcore hybrid-memory`.
#[derive(clap::Args, Debug)]
pub struct HybridMemoryArgs {
    /// Windows of the sliding-window group to compare, in tokens.
    #[arg(long, value_delimiter = ',', default_value = "128,512,4096")]
    pub windows: Vec<u32>,
    /// Chat sessions of the workload (`kvcore sim`'s default is 400).
    #[arg(long, default_value_t = 400)]
    pub sessions: u32,
    /// Seed of the workload.
    #[arg(long, default_value_t = 7)]
    pub seed: u64,
    /// Tokens per block.
    #[arg(long, default_value_t = 32)]
    pub block_size: u32,
    /// Device pages of each group (cached blocks fill them; the least
    /// recently used are evicted as usual).
    #[arg(long, default_value_t = 32_768)]
    pub pages_per_group: u32,
}

/// Prints one row per configuration and group. Exit status 0, or 2 when the
/// workload or an engine cannot be built.
pub fn run(args: &HybridMemoryArgs) -> i32 {
    let chat = ChatConfig { sessions: args.sessions, seed: args.seed, ..ChatConfig::default() };
    let workload = match chat_workload(&chat) {
        Ok(w) => w,
        Err(e) => {
            eprintln!("kvcore hybrid-memory: {e}");
            return 2;
        }
    };
    let params = HybridParams {
        block_size_tokens: args.block_size,
        pages_per_group: args.pages_per_group,
        ..HybridParams::default()
    };
    println!(
        "chat workload: {} sessions, {} requests, {} prompt tokens; block size {}; two groups of {} device pages",
        args.sessions,
        workload.requests.len(),
        workload.prompt_tokens(),
        args.block_size,
        args.pages_per_group
    );
    println!(
        "{:<16} {:>5} {:<22} {:>10} {:>10} {:>10} {:>9}",
        "config", "group", "kind", "peak held", "mean held", "peak used", "hit rate"
    );
    let cases = std::iter::once(None).chain(args.windows.iter().map(|w| Some(*w)));
    let mut full_total = None;
    for window_tokens in cases {
        let r = match hybrid::run(&workload, HybridCase { window_tokens }, &params) {
            Ok(r) => r,
            Err(e) => {
                eprintln!("kvcore hybrid-memory: {e}");
                return 2;
            }
        };
        let name = window_tokens.map_or("all full".to_owned(), |w| format!("window {w}"));
        let hit = r.tokens_cached as f64 / r.tokens_prompt.max(1) as f64;
        for (g, f) in r.groups.iter().enumerate() {
            let kind = match (g, window_tokens) {
                (0, _) | (_, None) => "full attention".to_owned(),
                (_, Some(w)) => format!("sliding window {w}"),
            };
            println!(
                "{:<16} {:>5} {:<22} {:>10} {:>10.1} {:>10} {:>8.2}%",
                name,
                g,
                kind,
                f.blocks_held_peak,
                f.blocks_held_mean,
                f.pages_used_peak,
                100.0 * hit
            );
        }
        let total = r.groups[0].blocks_held_mean + r.groups[1].blocks_held_mean;
        match full_total {
            None => full_total = Some(total),
            Some(full) => {
                println!("{:<16} mean blocks held, both groups: {:.1}% of all full", name, 100.0 * total / full)
            }
        }
    }
    0
}
