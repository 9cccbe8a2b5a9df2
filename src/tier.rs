//! The cache tiers a block can live in, and their names on the wire.

/// The tier a cached block lives in.
///
/// On the wire (vLLM's `medium`) the device is `"GPU"` and the host tier
/// `"CPU"`; an absent `medium` means the device. The discriminants index
/// per-tier arrays.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Tier {
    /// Device memory: the pages the forward pass reads.
    Device = 0,
    /// The pinned host tier (for a router, any lower tier: CPU, disk...),
    /// reusable after an onboard copy.
    Host = 1,
}

impl Tier {
    /// The `medium` name routers expect: `"GPU"` or `"CPU"`.
    pub fn as_str(self) -> &'static str {
        match self {
            Tier::Device => "GPU",
            Tier::Host => "CPU",
        }
    }

    /// The tier of a wire `medium`: absent or `"GPU"` (any case) is the
    /// device, any other name a lower tier. Inline: the router asks it for
    /// every stored event.
    #[inline]
    pub fn from_medium(medium: Option<&str>) -> Self {
        match medium {
            None => Tier::Device,
            Some(m) if m.eq_ignore_ascii_case("GPU") => Tier::Device,
            Some(_) => Tier::Host,
        }
    }
}
