//! The memory a sliding window saves: the chat workload of `kvcore sim`
//! served by one engine with two KV cache groups (the layers of a hybrid
//! model split in two), once with both groups full attention and once with
//! the second group a sliding window, comparing the blocks each group holds
//! (`kvcore hybrid-memory`, figures in docs/benchmarks.md).
//!
//! "All full" is the same two-group engine with the second group's window
//! as long as the longest request: it then never releases a block early and
//! reuses what group 0 reuses, so it holds what full-attention layers hold,
//! through the same code path as the windows it is compared with.
//!
//! The serving model is deliberately simple, and the same for every
//! configuration: virtual steps of `step_us`; a request is admitted at the
//! first step at or after its arrival (in arrival order; one that does not
//! fit waits), its prompt is computed in that step, then it generates one
//! token per step (the workload's answer tokens, which the session's next
//! turn repeats, so they are cached too) and finishes after its last one.
//! After each step the blocks each group holds for running requests are
//! sampled: the peak and the mean over the steps in which a request runs.

use kvcore::{Engine, EngineConfig, GroupConfig, GroupKind, MmContent, MmItemSpec, RequestId, RequestSpec, TokenRun};

use crate::sim::workload::{SimRequest, Workload, text_token};

/// One configuration to compare.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HybridCase {
    /// The second group's window in tokens; `None`: full attention (a window
    /// as long as the longest request).
    pub window_tokens: Option<u32>,
}

/// What a group held over the run.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct GroupFigures {
    /// Most blocks held by running requests after a step.
    pub blocks_held_peak: u32,
    /// Mean blocks held by running requests over the steps with a request running.
    pub blocks_held_mean: f64,
    /// Most device pages in use (held plus cached) after a step.
    pub pages_used_peak: u32,
}

/// The outcome of one configuration.
#[derive(Clone, Debug, PartialEq)]
pub struct HybridRun {
    /// The configuration.
    pub case: HybridCase,
    /// Per group (group 0, then the second group).
    pub groups: [GroupFigures; 2],
    /// Prompt tokens found in the cache over all admissions.
    pub tokens_cached: u64,
    /// Prompt tokens over all admissions.
    pub tokens_prompt: u64,
    /// Steps run.
    pub steps: u64,
    /// Requests served.
    pub requests: usize,
}

/// Parameters shared by every configuration.
#[derive(Clone, Copy, Debug)]
pub struct HybridParams {
    /// Tokens per block.
    pub block_size_tokens: u32,
    /// Device pages of each group.
    pub pages_per_group: u32,
    /// Virtual step length, in microseconds.
    pub step_us: u64,
    /// Longest request the engine takes (the all-full case's window).
    pub tokens_per_request_max: u32,
}

impl Default for HybridParams {
    fn default() -> Self {
        Self { block_size_tokens: 32, pages_per_group: 32_768, step_us: 25_000, tokens_per_request_max: 131_072 }
    }
}

/// The engine configuration of a case: group 0 full attention, group 1 the
/// case's window, each with `pages_per_group` device pages and no host tier.
pub fn engine_config(case: HybridCase, p: &HybridParams) -> EngineConfig {
    let window_tokens = case.window_tokens.unwrap_or(p.tokens_per_request_max);
    let groups = vec![
        GroupConfig { kind: GroupKind::FullAttention, blocks_device: p.pages_per_group, blocks_host: 0 },
        GroupConfig {
            kind: GroupKind::SlidingWindow { window_tokens },
            blocks_device: p.pages_per_group,
            blocks_host: 0,
        },
    ];
    EngineConfig {
        block_size_tokens: p.block_size_tokens,
        blocks_device: 2 * p.pages_per_group,
        blocks_host: 0,
        kv_events: false,
        requests_max: 1024,
        tokens_per_request_max: p.tokens_per_request_max,
        mm_items_max: 1 << 16,
        groups,
        ..EngineConfig::default()
    }
}

struct Live {
    id: RequestId,
    request: usize,
    generated: u32,
    tokens: u32,
}

/// Serves `workload` under `case` (see the module docs).
pub fn run(workload: &Workload, case: HybridCase, p: &HybridParams) -> Result<HybridRun, String> {
    let mut engine = Engine::new(engine_config(case, p)).map_err(|e| e.to_string())?;
    let requests = &workload.requests;
    let (mut next, mut live) = (0usize, Vec::<Live>::new());
    let mut out = HybridRun {
        case,
        groups: [GroupFigures::default(); 2],
        tokens_cached: 0,
        tokens_prompt: 0,
        steps: 0,
        requests: 0,
    };
    let mut sums = [0u64; 2];
    let mut busy_steps = 0u64;
    while next < requests.len() || !live.is_empty() {
        let now = out.steps * p.step_us;
        // Decode: one token for each running request, then finish the done.
        let mut i = 0;
        while i < live.len() {
            let l = &mut live[i];
            let r = &requests[l.request];
            if l.generated == r.output_len.max(1) {
                engine.finish(l.id).map_err(|e| e.to_string())?;
                live.swap_remove(i);
                continue;
            }
            let token = r
                .generated
                .get(l.generated as usize)
                .copied()
                .unwrap_or_else(|| text_token((r.id << 20) ^ u64::from(l.generated) ^ 0x5eed));
            if l.tokens >= p.tokens_per_request_max || engine.grow(l.id, &[token]).is_err() {
                // No room to grow (or at the length bound): the request ends here.
                engine.finish(l.id).map_err(|e| e.to_string())?;
                live.swap_remove(i);
                continue;
            }
            l.tokens += 1;
            l.generated += 1;
            engine.commit(l.id, u64::from(l.tokens)).map_err(|e| e.to_string())?;
            i += 1;
        }
        // Admit what has arrived, in order; one that does not fit waits.
        while next < requests.len() && requests[next].arrival_us <= now {
            match admit(&mut engine, &requests[next]) {
                Ok((id, cached, tokens)) => {
                    out.tokens_cached += u64::from(cached);
                    out.tokens_prompt += u64::from(tokens);
                    out.requests += 1;
                    live.push(Live { id, request: next, generated: 0, tokens });
                    next += 1;
                }
                Err(_) if !live.is_empty() => break,
                Err(e) => return Err(format!("request {} does not fit an idle engine: {e}", requests[next].id)),
            }
        }
        engine.step();
        out.steps += 1;
        if !live.is_empty() {
            busy_steps += 1;
            for (g, figures) in out.groups.iter_mut().enumerate() {
                let u = engine.group_usage(g).expect("two groups");
                figures.blocks_held_peak = figures.blocks_held_peak.max(u.blocks_referenced);
                figures.pages_used_peak = figures.pages_used_peak.max(u.blocks_used_device);
                sums[g] += u64::from(u.blocks_referenced);
            }
        }
    }
    for (g, figures) in out.groups.iter_mut().enumerate() {
        figures.blocks_held_mean = sums[g] as f64 / busy_steps.max(1) as f64;
    }
    Ok(out)
}

/// Admits a request and computes its prompt: (id, tokens cached, prompt tokens).
fn admit(engine: &mut Engine, r: &SimRequest) -> Result<(RequestId, u32, u32), kvcore::AdmitError> {
    let tokens = r.prompt.tokens();
    let items = r
        .images
        .iter()
        .map(|i| MmItemSpec {
            content: MmContent::Digest(&i.digest.0),
            runs: vec![TokenRun { start: i.start, len: i.len }],
        })
        .collect();
    let a = engine.add_request(&RequestSpec { tokens: &tokens, items, ..Default::default() })?;
    engine.commit(a.id, tokens.len() as u64).expect("the whole prompt is computable");
    Ok((a.id, a.tokens_cached, tokens.len() as u32))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sim::workload::{ChatConfig, chat_workload};

    /// A sliding window holds fewer blocks than full attention on the chat
    /// workload, and loses no reuse while nothing is evicted; the all-full
    /// case's second group holds exactly what group 0 does. Method: a small
    /// chat workload served under each case, 2048 pages per group.
    #[test]
    fn a_sliding_window_holds_fewer_blocks() {
        let workload = chat_workload(&ChatConfig { sessions: 4, ..ChatConfig::default() }).unwrap();
        let p = HybridParams { pages_per_group: 2048, step_us: 200_000, ..HybridParams::default() };
        let full = run(&workload, HybridCase { window_tokens: None }, &p).unwrap();
        assert_eq!(full.groups[0], full.groups[1], "a window as long as any request holds what full attention holds");
        assert!(full.tokens_cached > 0, "the chat workload reuses prefixes");
        for window in [128, 512] {
            let hybrid = run(&workload, HybridCase { window_tokens: Some(window) }, &p).unwrap();
            assert_eq!(hybrid.groups[0], full.groups[0], "group 0 is full attention in both");
            let (w, f) = (hybrid.groups[1], full.groups[1]);
            assert!(w.blocks_held_peak < f.blocks_held_peak, "window {window}: peak {w:?} against {f:?}");
            assert!(w.blocks_held_mean < f.blocks_held_mean, "window {window}: mean {w:?} against {f:?}");
            assert_eq!(hybrid.tokens_cached, full.tokens_cached, "window {window}: the same reuse");
        }
    }
}
