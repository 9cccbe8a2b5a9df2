//! The report: per-policy figures, the terminal table, and the files of
//! `--out DIR` (JSON summary, requests as JSON lines, the policies as bars
//! in `plot.svg`, the delay sweep as lines in `sweep.svg`).
//!
//! The charts are hand-written SVG: two small fixed layouts do not justify a
//! plotting crate's compile time on a 2-core CI machine (`plotters` with its
//! SVG backend alone adds a few dozen crates), and the output is checked by
//! the tests as text.

use std::fmt::Write as _;
use std::io::Write as _;
use std::path::Path;

use super::SimConfig;
use super::copies::CopyCounts;
use super::fleet::{EventCounts, PolicyRun};
use super::policy::PolicyKind;
use super::workload::Workload;

/// The figures of one policy.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct PolicySummary {
    /// The policy's name.
    pub policy: String,
    /// Simulated event propagation delay of the pass, milliseconds (0 for
    /// the policies that read no events).
    pub delay_ms: f64,
    /// Whether the router recorded its own decisions as predicted blocks.
    pub predictions: bool,
    /// Images whose pixels the router hashed before routing (paid in TTFT).
    pub hashed_images: u64,
    /// Published batches the taps never received.
    pub batches_lost: u64,
    /// Blocks believed held only from the router's own predictions, summed
    /// over decisions and workers.
    pub predicted_blocks_used: u64,
    /// Requests routed.
    pub requests: u64,
    /// Requests the engine rejected (too large for a worker).
    pub rejected: u64,
    /// Prompt tokens over all requests.
    pub prompt_tokens: u64,
    /// Prompt tokens found cached: the prefill tokens saved.
    pub cached_tokens: u64,
    /// Of those, tokens onboarded from the host tier.
    pub onboarded_tokens: u64,
    /// `cached_tokens / prompt_tokens`.
    pub hit_rate: f64,
    /// Simulated time to first token, median, milliseconds.
    pub ttft_p50_ms: f64,
    /// Simulated time to first token, 99th percentile, milliseconds.
    pub ttft_p99_ms: f64,
    /// Simulated time to first token, mean, milliseconds.
    pub ttft_mean_ms: f64,
    /// Requests whose chosen worker was believed to hold more leading blocks
    /// than its engine matched at admission (`None`: the policy holds no
    /// belief).
    pub false_hits: Option<u64>,
    /// Blocks believed held but not matched, over those requests.
    pub false_hit_blocks: Option<u64>,
    /// Event counts.
    pub events: EventCounts,
    /// Events per simulated second over the whole fleet.
    pub events_per_sim_s: f64,
    /// Wire bytes per block stored or removed, when measured.
    pub wire_bytes_per_block: Option<f64>,
    /// The host-tier copies' shape.
    pub copies: CopyCounts,
    /// Stored blocks the view could not place (text-only: parent unknown).
    pub view_unusable_blocks: u64,
    /// The view's own counters (the routers' decoders and indexers).
    pub view_stats: Option<serde_json::Value>,
    /// The engines' publisher endpoints (wire-fed policies: the stream an
    /// outside router can subscribe to).
    pub publishers: Vec<String>,
    /// Requests each worker served.
    pub requests_per_worker: Vec<u64>,
    /// When the last worker went idle, simulated seconds.
    pub makespan_s: f64,
    /// Busy time over `workers × makespan`: the fleet's utilization.
    pub utilization: f64,
    /// Wall-clock seconds of the pass.
    pub wall_s: f64,
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = ((p / 100.0) * (sorted.len() - 1) as f64).round() as usize;
    sorted[rank.min(sorted.len() - 1)]
}

impl PolicySummary {
    /// Summarizes a pass over `workload`.
    pub fn of(run: &PolicyRun, workload: &Workload, workers: u32, block_size: u32) -> Self {
        let prompt_tokens = workload.prompt_tokens();
        let cached_tokens: u64 = run.outcomes.iter().map(|o| o.tokens_cached as u64).sum();
        let mut ttft: Vec<f64> = run.outcomes.iter().map(|o| o.ttft_ms).collect();
        ttft.sort_by(f64::total_cmp);
        let (false_hits, false_hit_blocks) = if run.policy.is_kv_aware() {
            let mut n = 0;
            let mut blocks = 0;
            // A rejected request was never matched, so it says nothing about a belief.
            for o in run.outcomes.iter().filter(|o| !o.rejected) {
                let actual = o.tokens_cached / block_size;
                if let Some(p) = o.blocks_predicted
                    && p > actual
                {
                    n += 1;
                    blocks += (p - actual) as u64;
                }
            }
            (Some(n), Some(blocks))
        } else {
            (None, None)
        };
        let mut per_worker = vec![0u64; workers as usize];
        for o in &run.outcomes {
            per_worker[o.worker as usize] += 1;
        }
        let span_s = run.makespan_s.max(workload.requests.last().map_or(0.0, |r| r.arrival_us as f64 / 1e6)).max(1e-9);
        let blocks = run.events.stored_blocks + run.events.removed_blocks;
        Self {
            policy: run.policy.name().to_owned(),
            delay_ms: if run.policy.is_event_fed() { run.options.delay_us / 1000.0 } else { 0.0 },
            predictions: run.options.predict && run.policy.is_event_fed(),
            hashed_images: run.hashed_images,
            batches_lost: run.batches_lost,
            predicted_blocks_used: run.predicted_blocks_used,
            requests: run.outcomes.len() as u64,
            rejected: run.outcomes.iter().filter(|o| o.rejected).count() as u64,
            prompt_tokens,
            cached_tokens,
            onboarded_tokens: run.outcomes.iter().map(|o| o.tokens_onboarded as u64).sum(),
            hit_rate: cached_tokens as f64 / prompt_tokens.max(1) as f64,
            ttft_p50_ms: percentile(&ttft, 50.0),
            ttft_p99_ms: percentile(&ttft, 99.0),
            ttft_mean_ms: ttft.iter().sum::<f64>() / ttft.len().max(1) as f64,
            false_hits,
            false_hit_blocks,
            events: run.events,
            events_per_sim_s: run.events.events as f64 / span_s,
            wire_bytes_per_block: run.events.wire_bytes.map(|b| b as f64 / blocks.max(1) as f64),
            copies: run.copies,
            view_unusable_blocks: run.view_unusable_blocks,
            view_stats: run.view_stats.clone(),
            publishers: run.publishers.clone(),
            requests_per_worker: per_worker,
            makespan_s: run.makespan_s,
            utilization: run.busy_s / (workers as f64 * run.makespan_s).max(1e-9),
            wall_s: run.wall_s,
        }
    }
}

/// One point of the delay sweep.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct SweepPoint {
    /// The policy.
    pub policy: String,
    /// Event propagation delay, milliseconds.
    pub delay_ms: f64,
    /// Whether predicted blocks were on.
    pub predict: bool,
    /// Prefix hit rate.
    pub hit_rate: f64,
    /// False hits.
    pub false_hits: u64,
    /// TTFT p50, milliseconds.
    pub ttft_p50_ms: f64,
    /// TTFT p99, milliseconds.
    pub ttft_p99_ms: f64,
}

impl SweepPoint {
    /// The point of one pass.
    pub fn of(summary: &PolicySummary, run: &PolicyRun) -> Self {
        Self {
            policy: summary.policy.clone(),
            delay_ms: run.options.delay_us / 1000.0,
            predict: run.options.predict,
            hit_rate: summary.hit_rate,
            false_hits: summary.false_hits.unwrap_or(0),
            ttft_p50_ms: summary.ttft_p50_ms,
            ttft_p99_ms: summary.ttft_p99_ms,
        }
    }
}

/// The whole report of a simulation.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct Report {
    /// The workload's name.
    pub workload: String,
    /// Requests in it.
    pub requests: u64,
    /// Prompt tokens in it.
    pub prompt_tokens: u64,
    /// The workload's ideal hit ratio (infinite cache, one pool), when known.
    pub ideal_hit_ratio: Option<f64>,
    /// The configuration.
    pub config: SimConfig,
    /// One entry per policy, in the order run, at the default delay without
    /// predictions (the main table).
    pub policies: Vec<PolicySummary>,
    /// The event-fed policies again, at the default delay with predicted blocks.
    pub predicted: Vec<PolicySummary>,
    /// The delay sweep of the event-fed policies.
    pub sweep: Vec<SweepPoint>,
}

impl Report {
    /// The summary of `policy`, when it was run.
    pub fn policy(&self, policy: PolicyKind) -> Option<&PolicySummary> {
        self.policies.iter().find(|p| p.policy == policy.name())
    }

    /// The terminal table.
    pub fn table(&self) -> String {
        let mut s = String::new();
        let _ = writeln!(
            s,
            "workload: {} — {} requests, {} prompt tokens{}",
            self.workload,
            self.requests,
            self.prompt_tokens,
            self.ideal_hit_ratio.map_or(String::new(), |r| format!(", ideal hit rate {:.1} %", r * 100.0))
        );
        let _ = writeln!(
            s,
            "fleet: {} workers, block {} tokens, {} device + {} host blocks each\n",
            self.config.workers, self.config.block_size_tokens, self.config.blocks_device, self.config.blocks_host
        );
        if let Some(window) = self.config.hybrid {
            let ((fd, fh), (wd, wh)) = super::fleet::hybrid_split(&self.config, window);
            let _ = writeln!(
                s,
                "hybrid run: group 0 full attention ({fd} device + {fh} host blocks), group 1 sliding window of \
                 {window} tokens ({wd} device + {wh} host blocks)\n"
            );
        }
        let t = &self.config.timing;
        let sizes: Vec<u32> = match &self.config.hash_measurement {
            Some(m) => m.sizes.iter().map(|z| z.tokens).collect(),
            None => vec![256, 576],
        };
        let per_image =
            sizes.iter().map(|&n| format!("{:.2} ms for {n} tokens", t.hash_us(n) / 1000.0)).collect::<Vec<_>>();
        let how = match &self.config.hash_measurement {
            Some(m) => format!("measured here, median of {} per size", m.samples),
            None => "given".to_owned(),
        };
        let _ = writeln!(
            s,
            "events reach the routers {} ms after each step's prefill; pixels hashed (BLAKE3, {:.3} ns/byte, {how}): {}\n",
            self.config.delay_ms,
            t.hash_ns_per_byte,
            per_image.join(", ")
        );
        self.policy_rows(&mut s, &self.policies);
        if !self.predicted.is_empty() {
            let _ = writeln!(
                s,
                "\nwith predicted blocks (each router records its own decisions for {} s):",
                self.config.prediction_ttl_ms / 1000.0
            );
            self.policy_rows(&mut s, &self.predicted);
        }
        if !self.sweep.is_empty() {
            let mut delays: Vec<f64> = self.sweep.iter().map(|p| p.delay_ms).collect();
            delays.sort_by(f64::total_cmp);
            delays.dedup();
            let _ = write!(s, "\ndelay sweep: hit rate % / false hits\n{:<22}", "policy");
            for d in &delays {
                let _ = write!(s, " {:>12}", format!("{d} ms"));
            }
            let _ = writeln!(s);
            let mut rows: Vec<(String, bool)> = self.sweep.iter().map(|p| (p.policy.clone(), p.predict)).collect();
            rows.dedup();
            for (policy, predict) in rows {
                let _ = write!(s, "{:<22}", format!("{policy}{}", if predict { " +pred" } else { "" }));
                for d in &delays {
                    let cell = self
                        .sweep
                        .iter()
                        .find(|p| p.policy == policy && p.predict == predict && p.delay_ms == *d)
                        .map_or("-".to_owned(), |p| format!("{:.1}/{}", p.hit_rate * 100.0, p.false_hits));
                    let _ = write!(s, " {cell:>12}");
                }
                let _ = writeln!(s);
            }
        }
        let _ = writeln!(
            s,
            "\nhost tier copies (run: consecutive host pages in a wave, mean blocks)\n{:<14} {:>10} {:>6} {:>10} {:>6} {:>7} {:>10} {:>7} {:>10}",
            "policy", "offloaded", "run", "onboarded", "run", "steps", "both ways", "waves", "both ways"
        );
        for p in &self.policies {
            let c = &p.copies;
            let _ = writeln!(
                s,
                "{:<14} {:>10} {:>6.1} {:>10} {:>6.1} {:>7} {:>10} {:>7} {:>10}",
                p.policy,
                c.offload_blocks,
                c.offload_mean_run(),
                c.onboard_blocks,
                c.onboard_mean_run(),
                c.steps,
                c.steps_both_ways,
                c.waves,
                c.waves_both_ways
            );
        }
        for p in self.policies.iter().filter(|p| p.rejected > 0) {
            let _ = writeln!(
                s,
                "note: {}: {} requests did not fit a worker (rejected by the engine, counted as uncached)",
                p.policy, p.rejected
            );
        }
        if let Some(oracle) = self.policy(PolicyKind::Oracle) {
            for p in self.policies.iter().filter(|p| p.policy != oracle.policy && p.false_hits.is_some()) {
                if (p.hit_rate - oracle.hit_rate).abs() < 0.0005 || p.hit_rate > oracle.hit_rate {
                    let _ = writeln!(
                        s,
                        "note: {} reaches the oracle's hit rate ({:.1} % against {:.1} %) without its knowledge: it \
                         decided on events {} ms late and had {} false hits to the oracle's 0. The oracle bounds \
                         what a router can know, not the hit rate (its choices also move load); here reuse comes \
                         from requests whose events had long arrived (the delay sweep shows what lateness costs).",
                        p.policy,
                        p.hit_rate * 100.0,
                        oracle.hit_rate * 100.0,
                        p.delay_ms,
                        p.false_hits.unwrap_or(0)
                    );
                }
            }
        }
        if let Some(ours) = self.policy(PolicyKind::KvUuid) {
            let ratio = |other: Option<&PolicySummary>, name: &str| {
                other.map_or(String::new(), |o| format!(", {:.3}x {name}'s", ours.hit_rate / o.hit_rate.max(1e-12)))
            };
            let _ = writeln!(
                s,
                "\nkv-uuid hit rate{}{}{}; false hits: kv-uuid {}, dynamo {}",
                ratio(self.policy(PolicyKind::Dynamo), "dynamo"),
                ratio(self.policy(PolicyKind::RoundRobin), "round-robin"),
                ratio(self.policy(PolicyKind::Oracle), "the oracle"),
                ours.false_hits.unwrap_or(0),
                self.policy(PolicyKind::Dynamo).and_then(|d| d.false_hits).map_or("-".to_owned(), |n| n.to_string()),
            );
        }
        s
    }

    fn policy_rows(&self, s: &mut String, rows: &[PolicySummary]) {
        let _ = writeln!(
            s,
            "{:<14} {:>8} {:>8} {:>13} {:>10} {:>10} {:>11} {:>6} {:>7} {:>12}",
            "policy",
            "hit rate",
            "vs ideal",
            "tokens saved",
            "TTFT p50",
            "TTFT p99",
            "false hits",
            "busy",
            "hashed",
            "bytes/block"
        );
        for p in rows {
            let vs_ideal = self.ideal_hit_ratio.map_or("-".to_owned(), |i| format!("{:.1} %", 100.0 * p.hit_rate / i));
            let _ = writeln!(
                s,
                "{:<14} {:>7.1}% {:>8} {:>13} {:>8.0}ms {:>8.0}ms {:>11} {:>5.0}% {:>7} {:>12}",
                p.policy,
                p.hit_rate * 100.0,
                vs_ideal,
                p.cached_tokens,
                p.ttft_p50_ms,
                p.ttft_p99_ms,
                p.false_hits.map_or("-".to_owned(), |n| n.to_string()),
                p.utilization * 100.0,
                p.hashed_images,
                p.wire_bytes_per_block.map_or("-".to_owned(), |b| format!("{b:.1}")),
            );
        }
    }

    /// Writes `summary.json`, `requests.jsonl` and `plot.svg` into `dir`.
    pub fn write(&self, dir: &Path, workload: &Workload, runs: &[PolicyRun]) -> std::io::Result<()> {
        std::fs::create_dir_all(dir)?;
        std::fs::write(dir.join("summary.json"), serde_json::to_vec_pretty(self).map_err(std::io::Error::other)?)?;
        let mut out = std::io::BufWriter::new(std::fs::File::create(dir.join("requests.jsonl"))?);
        for (i, r) in workload.requests.iter().enumerate() {
            let mut routed = serde_json::Map::new();
            for run in runs {
                routed.insert(
                    run.policy.name().to_owned(),
                    serde_json::to_value(run.outcomes[i]).map_err(std::io::Error::other)?,
                );
            }
            let images: Vec<serde_json::Value> = r
                .images
                .iter()
                .map(|im| {
                    serde_json::json!({
                        "digest": im.digest.to_hex(),
                        "uuid": im.uuid.as_deref(),
                        "start": im.start,
                        "len": im.len,
                    })
                })
                .collect();
            let mut line = serde_json::json!({
                "id": r.id,
                "arrival_ms": r.arrival_us as f64 / 1000.0,
                "session": r.session,
                "prompt_tokens": r.prompt.len(),
                "output_tokens": r.output_len,
                "images": images,
                "routed": routed,
            });
            match &r.prompt {
                super::workload::Prompt::Tokens(t) => line["token_ids"] = serde_json::json!(t),
                // Trace prompts are written as their block ids, from which the
                // token ids are derived (workload::Prompt::tokens).
                super::workload::Prompt::HashBlocks { hash_ids, .. } => line["hash_ids"] = serde_json::json!(hash_ids),
            }
            serde_json::to_writer(&mut out, &line).map_err(std::io::Error::other)?;
            out.write_all(b"\n")?;
        }
        out.flush()?;
        std::fs::write(dir.join("plot.svg"), self.svg())?;
        std::fs::write(dir.join("sweep.svg"), self.sweep_svg())
    }

    /// A hand-written SVG line chart of the delay sweep: hit rate (left) and
    /// false hits (right) against the delay, one line per policy, dashed
    /// with predicted blocks.
    pub fn sweep_svg(&self) -> String {
        let (w, h) = (900.0, 380.0);
        let mut s = String::new();
        let _ = writeln!(
            s,
            r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" viewBox="0 0 {w} {h}" font-family="sans-serif" font-size="12">"#
        );
        let _ = writeln!(s, r#"<rect width="{w}" height="{h}" fill="white"/>"#);
        let _ = writeln!(
            s,
            r#"<text x="{}" y="20" text-anchor="middle" font-size="14">event delay sweep ({})</text>"#,
            w / 2.0,
            escape(&self.workload)
        );
        let max_delay = self.sweep.iter().map(|p| p.delay_ms).fold(0.0, f64::max).max(1e-9);
        let mut series: Vec<(String, bool)> = self.sweep.iter().map(|p| (p.policy.clone(), p.predict)).collect();
        series.dedup();
        let colors = ["#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#b07aa1", "#76b7b2"];
        let mut names: Vec<&String> = series.iter().map(|(p, _)| p).collect();
        names.dedup();
        let (top, bottom, pw) = (50.0, 300.0, 380.0);
        let panel = |s: &mut String, x0: f64, title: &str, value: &dyn Fn(&SweepPoint) -> f64| {
            let max = self.sweep.iter().map(value).fold(0.0, f64::max).max(1e-9);
            let _ = writeln!(s, r#"<text x="{}" y="40" text-anchor="middle">{}</text>"#, x0 + pw / 2.0, escape(title));
            let _ = writeln!(s, r##"<line x1="{x0}" y1="{bottom}" x2="{}" y2="{bottom}" stroke="#333"/>"##, x0 + pw);
            let _ = writeln!(s, r##"<line x1="{x0}" y1="{top}" x2="{x0}" y2="{bottom}" stroke="#333"/>"##);
            let _ = writeln!(
                s,
                r#"<text x="{}" y="{}" text-anchor="middle" font-size="10">delay (ms), 0 to {max_delay}</text>"#,
                x0 + pw / 2.0,
                bottom + 28.0
            );
            let _ = writeln!(
                s,
                r#"<text x="{}" y="{}" text-anchor="end" font-size="9">{max:.1}</text>"#,
                x0 - 3.0,
                top + 4.0
            );
            for (policy, predict) in &series {
                let color = colors[names.iter().position(|n| *n == policy).unwrap_or(0) % colors.len()];
                let points: Vec<String> = self
                    .sweep
                    .iter()
                    .filter(|p| &p.policy == policy && p.predict == *predict)
                    .map(|p| {
                        let x = x0 + pw * p.delay_ms / max_delay;
                        let y = bottom - (bottom - top) * value(p) / max;
                        format!("{x:.1},{y:.1}")
                    })
                    .collect();
                let dash = if *predict { r#" stroke-dasharray="5,3""# } else { "" };
                let _ = writeln!(
                    s,
                    r#"<polyline points="{}" fill="none" stroke="{color}" stroke-width="2"{dash}><title>{}{}</title></polyline>"#,
                    points.join(" "),
                    escape(policy),
                    if *predict { " +pred" } else { "" }
                );
            }
        };
        panel(&mut s, 50.0, "prefix hit rate (%)", &|p| p.hit_rate * 100.0);
        panel(&mut s, 490.0, "false hits (requests)", &|p| p.false_hits as f64);
        for (k, name) in names.iter().enumerate() {
            let lx = 60.0 + k as f64 * 140.0;
            let _ =
                writeln!(s, r#"<rect x="{lx}" y="350" width="12" height="4" fill="{}"/>"#, colors[k % colors.len()]);
            let _ = writeln!(s, r#"<text x="{}" y="356" font-size="10">{}</text>"#, lx + 16.0, escape(name));
        }
        let _ = writeln!(
            s,
            r#"<text x="{}" y="372" font-size="10">solid: events only; dashed: with predicted blocks</text>"#,
            60.0
        );
        s.push_str("</svg>\n");
        s
    }

    /// A hand-written SVG: hit rate per policy, and TTFT p50 / p99 per policy.
    pub fn svg(&self) -> String {
        let (w, h) = (900.0, 360.0);
        let mut s = String::new();
        let _ = writeln!(
            s,
            r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" viewBox="0 0 {w} {h}" font-family="sans-serif" font-size="12">"#
        );
        let _ = writeln!(s, r#"<rect width="{w}" height="{h}" fill="white"/>"#);
        let _ = writeln!(
            s,
            r#"<text x="{}" y="20" text-anchor="middle" font-size="14">{}</text>"#,
            w / 2.0,
            escape(&self.workload)
        );
        let n = self.policies.len().max(1) as f64;
        let (top, bottom) = (72.0, 290.0);
        let panel = |s: &mut String, x0: f64, title: &str, series: &[(&str, Vec<f64>)], unit: &str| {
            let pw = 400.0;
            let max = series.iter().flat_map(|(_, v)| v.iter().copied()).fold(0.0, f64::max).max(1e-9);
            let _ = writeln!(s, r#"<text x="{}" y="40" text-anchor="middle">{}</text>"#, x0 + pw / 2.0, escape(title));
            let _ = writeln!(s, r##"<line x1="{x0}" y1="{bottom}" x2="{}" y2="{bottom}" stroke="#333"/>"##, x0 + pw);
            let group = pw / n;
            let bar = group * 0.8 / series.len() as f64;
            let colors = ["#4e79a7", "#f28e2b"];
            for (k, p) in self.policies.iter().enumerate() {
                let gx = x0 + k as f64 * group + group * 0.1;
                for (j, (_, values)) in series.iter().enumerate() {
                    let v = values[k];
                    let bh = (bottom - top) * v / max;
                    let x = gx + j as f64 * bar;
                    let _ = writeln!(
                        s,
                        r#"<rect x="{x:.1}" y="{:.1}" width="{:.1}" height="{bh:.1}" fill="{}"><title>{} {}: {v:.3}{unit}</title></rect>"#,
                        bottom - bh,
                        bar * 0.95,
                        colors[j % 2],
                        escape(&p.policy),
                        escape(series[j].0),
                    );
                    let _ = writeln!(
                        s,
                        r#"<text x="{:.1}" y="{:.1}" text-anchor="middle" font-size="9">{v:.0}</text>"#,
                        x + bar / 2.0,
                        bottom - bh - 3.0,
                    );
                }
                let _ = writeln!(
                    s,
                    r#"<text x="{:.1}" y="{:.1}" text-anchor="end" font-size="10" transform="rotate(-30 {:.1} {:.1})">{}</text>"#,
                    gx + group * 0.4,
                    bottom + 14.0,
                    gx + group * 0.4,
                    bottom + 14.0,
                    escape(&p.policy)
                );
            }
            if series.len() > 1 {
                for (j, (name, _)) in series.iter().enumerate() {
                    let lx = x0 + pw - 120.0 + j as f64 * 60.0;
                    let _ = writeln!(s, r#"<rect x="{lx}" y="48" width="10" height="10" fill="{}"/>"#, colors[j % 2]);
                    let _ = writeln!(s, r#"<text x="{}" y="57" font-size="10">{}</text>"#, lx + 13.0, escape(name));
                }
            }
        };
        let hit: Vec<f64> = self.policies.iter().map(|p| p.hit_rate * 100.0).collect();
        panel(&mut s, 40.0, "prefix hit rate (% of prompt tokens)", &[("hit rate", hit)], "%");
        let p50: Vec<f64> = self.policies.iter().map(|p| p.ttft_p50_ms).collect();
        let p99: Vec<f64> = self.policies.iter().map(|p| p.ttft_p99_ms).collect();
        panel(&mut s, 470.0, "simulated time to first token (ms)", &[("p50", p50), ("p99", p99)], " ms");
        s.push_str("</svg>\n");
        s
    }
}

fn escape(text: &str) -> String {
    text.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;").replace('"', "&quot;")
}
