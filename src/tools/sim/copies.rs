//! The shape of the host-tier copies the engines hand out at each step.
//!
//! A GPU moves a step's copies wave by wave ([`copy_waves`]): a wave that
//! offloads and onboards keeps PCIe busy both ways at once, and a direction
//! whose host pages follow each other moves as long runs that the copy
//! engines take at full speed (docs/benchmarks.md, "Host tier"). These
//! counters say how often the engine's real traffic gets either.

use kvcore::{BlockCopy, Tier, copy_waves};

/// Host-tier copy counters of a pass, over every worker and step.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct CopyCounts {
    /// Blocks offloaded (device to host).
    pub offload_blocks: u64,
    /// Blocks onboarded (host to device).
    pub onboard_blocks: u64,
    /// Steps with at least one host-tier copy.
    pub steps: u64,
    /// Of those, steps that both offload and onboard.
    pub steps_both_ways: u64,
    /// Waves that carry a host-tier copy.
    pub waves: u64,
    /// Of those, waves that carry both directions.
    pub waves_both_ways: u64,
    /// Runs of consecutive host pages over every wave's offloads (each
    /// wave's pages sorted, as the staged copy path sorts them).
    pub offload_runs: u64,
    /// The same for onboards.
    pub onboard_runs: u64,
}

/// Runs of consecutive values in `pages` once sorted (0 for none).
fn runs(pages: &mut [u32]) -> u64 {
    pages.sort_unstable();
    pages.windows(2).filter(|w| w[1] != w[0] + 1).count() as u64 + u64::from(!pages.is_empty())
}

impl CopyCounts {
    /// Counts one step's copies, in the order the engine handed them out.
    pub fn observe(&mut self, copies: &[BlockCopy]) {
        let mut start = 0;
        let mut step_off = false;
        let mut step_on = false;
        let mut off = Vec::new();
        let mut on = Vec::new();
        for end in copy_waves(copies) {
            off.clear();
            on.clear();
            for c in &copies[start..end] {
                match (c.src.medium, c.dst.medium) {
                    (Tier::Device, Tier::Host) => off.push(c.dst.page),
                    (Tier::Host, Tier::Device) => on.push(c.src.page),
                    _ => {}
                }
            }
            start = end;
            if off.is_empty() && on.is_empty() {
                continue;
            }
            self.waves += 1;
            self.waves_both_ways += u64::from(!off.is_empty() && !on.is_empty());
            self.offload_blocks += off.len() as u64;
            self.onboard_blocks += on.len() as u64;
            self.offload_runs += runs(&mut off);
            self.onboard_runs += runs(&mut on);
            step_off |= !off.is_empty();
            step_on |= !on.is_empty();
        }
        self.steps += u64::from(step_off || step_on);
        self.steps_both_ways += u64::from(step_off && step_on);
    }

    /// Mean offload run, in blocks.
    pub fn offload_mean_run(&self) -> f64 {
        self.offload_blocks as f64 / self.offload_runs.max(1) as f64
    }

    /// Mean onboard run, in blocks.
    pub fn onboard_mean_run(&self) -> f64 {
        self.onboard_blocks as f64 / self.onboard_runs.max(1) as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kvcore::PageRef;

    fn copy(src: (Tier, u32), dst: (Tier, u32)) -> BlockCopy {
        BlockCopy {
            src: PageRef { medium: src.0, page: src.1 },
            dst: PageRef { medium: dst.0, page: dst.1 },
            tokens: 16,
            group: 0,
        }
    }

    #[test]
    fn counts_directions_waves_and_runs() {
        // Goal: the counters follow the waves and sorted host pages. Method: one
        // step whose onboard reuses the device page an offload reads (two
        // waves), then one step with both directions in one wave.
        use Tier::{Device, Host};
        let mut c = CopyCounts::default();
        c.observe(&[copy((Device, 3), (Host, 7)), copy((Device, 4), (Host, 5)), copy((Host, 9), (Device, 3))]);
        assert_eq!((c.steps, c.steps_both_ways, c.waves, c.waves_both_ways), (1, 1, 2, 0));
        assert_eq!((c.offload_blocks, c.offload_runs, c.onboard_blocks, c.onboard_runs), (2, 2, 1, 1));
        c.observe(&[copy((Device, 1), (Host, 10)), copy((Device, 2), (Host, 11)), copy((Host, 20), (Device, 5))]);
        c.observe(&[copy((Device, 1), (Device, 2))]);
        assert_eq!((c.steps, c.steps_both_ways, c.waves, c.waves_both_ways), (2, 2, 3, 1));
        assert_eq!((c.offload_blocks, c.offload_runs), (4, 3));
        assert!((c.offload_mean_run() - 4.0 / 3.0).abs() < 1e-12);
        assert_eq!(runs(&mut []), 0);
        assert_eq!(runs(&mut [5, 3, 4, 9]), 2);
    }
}
