//! Model profiles: how a request given as text and images becomes the token
//! ids and image placements that the engine will see.
//!
//! A router that hashes a request must produce exactly the tokens the serving
//! framework produces, or no key will ever match. Two things vary by model:
//! the chat template, and how many placeholder tokens stand for an image. A
//! profile pins both down. A model without an entry gets [`ModelProfile::plain`]:
//! the text as given and a fixed number of placeholders per image, so routing
//! still works for text prefixes instead of failing.
//!
//! | profile | template | image tokens |
//! |---|---|---|
//! | `qwen2-vl` | `<|im_start|>role\n…<|im_end|>\n`, default system prompt | `<|vision_start|>` + (h'/28)(w'/28) × `<|image_pad|>` + `<|vision_end|>` |
//! | `qwen3-vl` | same, no default system prompt | same with patch 16: (h'/32)(w'/32) |
//! | plain (any other model) | none | `tokens_per_image` × placeholder |
//!
//! `h'` and `w'` come from Qwen2-VL's resize rule (the `smart_resize` of its
//! image processor): round each side to a multiple of `patch × merge`, then
//! scale both sides to keep the pixel count within `[min_pixels, max_pixels]`.
//!
//! Text segments are tokenized one by one without adding special tokens, and
//! image tokens are inserted between them. Every boundary sits next to a
//! special token (vision start/end, or the placeholder), which tokenizers
//! never merge across, so this equals tokenizing the templated string whole.

use tokenizers::Tokenizer;

use crate::hashing::{ImagePlacement, ImageRef, TokenRequest};
use kvcore::QWEN_IMAGE_PAD_TOKEN;

/// Qwen2-VL / Qwen3-VL `<|vision_start|>`.
pub const QWEN_VISION_START_TOKEN: u32 = 151_652;
/// Qwen2-VL / Qwen3-VL `<|vision_end|>`.
pub const QWEN_VISION_END_TOKEN: u32 = 151_653;

/// How the messages of a chat become one prompt.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ChatTemplate {
    /// Contents are concatenated in order, roles ignored.
    Plain,
    /// ChatML as Qwen uses it, ending with the assistant's turn opened.
    Qwen {
        /// The system prompt inserted when the chat has none.
        default_system: Option<String>,
    },
}

/// How many placeholder tokens an image becomes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ImageTokens {
    /// Every image is this many placeholders, whatever its size.
    Fixed(u32),
    /// Qwen's grid rule: the image is resized to multiples of
    /// `patch * merge` within the pixel bounds, and each `merge × merge`
    /// group of patches is one token.
    QwenGrid {
        /// Vision patch side in pixels (14 for Qwen2-VL, 16 for Qwen3-VL).
        patch: u32,
        /// Spatial merge size (2).
        merge: u32,
        /// Fewest pixels after resizing.
        min_pixels: u64,
        /// Most pixels after resizing.
        max_pixels: u64,
    },
}

/// A model profile (see the module docs).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ModelProfile {
    /// The profile's name.
    pub name: String,
    /// The chat template.
    pub template: ChatTemplate,
    /// The image placeholder token id (what the engine advertises at image
    /// positions).
    pub image_placeholder: u32,
    /// Token put before each image's placeholders, if any.
    pub image_start: Option<u32>,
    /// Token put after each image's placeholders, if any.
    pub image_end: Option<u32>,
    /// How many placeholders an image becomes.
    pub image_tokens: ImageTokens,
}

/// Why a text request cannot be turned into tokens.
#[derive(Debug, thiserror::Error)]
pub enum ProfileError {
    /// The tokenizer failed.
    #[error("tokenizer: {0}")]
    Tokenizer(String),
    /// An image needs a size for this profile.
    #[error("image {image} needs its width and height (in pixels) for profile {profile}")]
    ImageSizeMissing {
        /// Index of the image.
        image: usize,
        /// The profile.
        profile: String,
    },
    /// An image size is unusable.
    #[error("image {image}: {why}")]
    BadImageSize {
        /// Index of the image.
        image: usize,
        /// What is wrong.
        why: &'static str,
    },
}

/// One image of a text request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ImageInput {
    /// Its identity.
    pub image: ImageRef,
    /// Width in pixels, when known.
    pub width: Option<u32>,
    /// Height in pixels, when known.
    pub height: Option<u32>,
}

/// A part of a message's content.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Part {
    /// Text.
    Text(String),
    /// An image.
    Image(ImageInput),
}

/// One chat message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Message {
    /// `system`, `user` or `assistant`.
    pub role: String,
    /// Its content, in order.
    pub parts: Vec<Part>,
}

/// A piece of the templated prompt.
enum Segment<'a> {
    Text(std::borrow::Cow<'a, str>),
    Image(&'a ImageInput),
}

impl ModelProfile {
    /// Qwen2-VL (and Qwen2.5-VL): patch 14, merge 2, the pixel bounds of the
    /// released models' `preprocessor_config.json` (3136 = 56×56 to
    /// 12845056 = 28×28×16384), and its default system prompt.
    pub fn qwen2_vl() -> Self {
        Self {
            name: "qwen2-vl".into(),
            template: ChatTemplate::Qwen { default_system: Some("You are a helpful assistant.".into()) },
            image_placeholder: QWEN_IMAGE_PAD_TOKEN,
            image_start: Some(QWEN_VISION_START_TOKEN),
            image_end: Some(QWEN_VISION_END_TOKEN),
            image_tokens: ImageTokens::QwenGrid {
                patch: 14,
                merge: 2,
                min_pixels: 56 * 56,
                max_pixels: 28 * 28 * 16384,
            },
        }
    }

    /// Qwen3-VL: as Qwen2-VL with patch 16, the pixel bounds of its
    /// `preprocessor_config.json` (65536 = 256×256 to 16777216 = 4096×4096)
    /// and no default system prompt.
    pub fn qwen3_vl() -> Self {
        Self {
            name: "qwen3-vl".into(),
            template: ChatTemplate::Qwen { default_system: None },
            image_tokens: ImageTokens::QwenGrid { patch: 16, merge: 2, min_pixels: 256 * 256, max_pixels: 4096 * 4096 },
            ..Self::qwen2_vl()
        }
    }

    /// The safe default: plain text, `tokens_per_image` placeholders per image.
    pub fn plain(image_placeholder: u32, tokens_per_image: u32) -> Self {
        Self {
            name: "plain".into(),
            template: ChatTemplate::Plain,
            image_placeholder,
            image_start: None,
            image_end: None,
            image_tokens: ImageTokens::Fixed(tokens_per_image.max(1)),
        }
    }

    /// The profile for a model name: matched case-insensitively on the family
    /// (`qwen2-vl`, `qwen2.5-vl`, `qwen3-vl`, with `_` or `-`), else
    /// [`ModelProfile::plain`] with the Qwen placeholder and one token per image.
    pub fn for_model(model: &str) -> Self {
        let m = model.to_ascii_lowercase().replace('_', "-");
        let m = m.rsplit('/').next().unwrap_or(&m).to_owned();
        if m.starts_with("qwen3-vl") {
            Self::qwen3_vl()
        } else if m.starts_with("qwen2-vl") || m.starts_with("qwen2.5-vl") {
            Self::qwen2_vl()
        } else {
            Self::plain(QWEN_IMAGE_PAD_TOKEN, 1)
        }
    }

    /// The number of placeholder tokens for an image of `width × height`.
    pub fn image_token_count(
        &self,
        width: Option<u32>,
        height: Option<u32>,
        image: usize,
    ) -> Result<u32, ProfileError> {
        match &self.image_tokens {
            ImageTokens::Fixed(n) => Ok(*n),
            ImageTokens::QwenGrid { patch, merge, min_pixels, max_pixels } => {
                let (Some(w), Some(h)) = (width, height) else {
                    return Err(ProfileError::ImageSizeMissing { image, profile: self.name.clone() });
                };
                let (rh, rw) = qwen_resize(h, w, patch * merge, *min_pixels, *max_pixels)
                    .map_err(|why| ProfileError::BadImageSize { image, why })?;
                let factor = (patch * merge) as u64;
                Ok(((rh / factor) * (rw / factor)) as u32)
            }
        }
    }

    fn segments<'a>(&self, messages: &'a [Message]) -> Vec<Segment<'a>> {
        let mut out = Vec::new();
        match &self.template {
            ChatTemplate::Plain => {
                for m in messages {
                    for p in &m.parts {
                        out.push(match p {
                            Part::Text(t) => Segment::Text(t.as_str().into()),
                            Part::Image(i) => Segment::Image(i),
                        });
                    }
                }
            }
            ChatTemplate::Qwen { default_system } => {
                if let Some(sys) = default_system
                    && messages.first().is_none_or(|m| m.role != "system")
                {
                    out.push(Segment::Text(format!("<|im_start|>system\n{sys}<|im_end|>\n").into()));
                }
                for m in messages {
                    out.push(Segment::Text(format!("<|im_start|>{}\n", m.role).into()));
                    for p in &m.parts {
                        out.push(match p {
                            Part::Text(t) => Segment::Text(t.as_str().into()),
                            Part::Image(i) => Segment::Image(i),
                        });
                    }
                    out.push(Segment::Text("<|im_end|>\n".into()));
                }
                out.push(Segment::Text("<|im_start|>assistant\n".into()));
            }
        }
        out
    }

    /// Applies the template, tokenizes, and expands each image into its
    /// placeholder run: the request as the engine will see it.
    pub fn render(
        &self,
        tokenizer: &Tokenizer,
        messages: &[Message],
        lora: Option<String>,
        cache_salt: Option<String>,
    ) -> Result<TokenRequest, ProfileError> {
        self.render_segments(tokenizer, self.segments(messages), lora, cache_salt)
    }

    /// Tokenizes an already templated prompt in which each image is marked by
    /// `marker` (for Qwen, `<|vision_start|><|image_pad|><|vision_end|>`), the
    /// `k`-th marker standing for `images[k]`. Markers beyond the images are
    /// kept as text; images beyond the markers are appended at the end.
    pub fn render_prompt(
        &self,
        tokenizer: &Tokenizer,
        prompt: &str,
        marker: &str,
        images: &[ImageInput],
        lora: Option<String>,
        cache_salt: Option<String>,
    ) -> Result<TokenRequest, ProfileError> {
        let mut segments = Vec::new();
        let mut rest = prompt;
        let mut next = images.iter();
        while !marker.is_empty()
            && let Some(at) = rest.find(marker)
        {
            let Some(image) = next.next() else { break };
            segments.push(Segment::Text(rest[..at].into()));
            segments.push(Segment::Image(image));
            rest = &rest[at + marker.len()..];
        }
        segments.push(Segment::Text(rest.into()));
        segments.extend(next.map(Segment::Image));
        self.render_segments(tokenizer, segments, lora, cache_salt)
    }

    fn render_segments(
        &self,
        tokenizer: &Tokenizer,
        segments: Vec<Segment<'_>>,
        lora: Option<String>,
        cache_salt: Option<String>,
    ) -> Result<TokenRequest, ProfileError> {
        let mut out = TokenRequest { lora, cache_salt, ..Default::default() };
        let mut image_index = 0usize;
        for seg in segments {
            match seg {
                Segment::Text(t) if t.is_empty() => {}
                Segment::Text(t) => {
                    let enc =
                        tokenizer.encode(t.as_ref(), false).map_err(|e| ProfileError::Tokenizer(e.to_string()))?;
                    out.tokens.extend_from_slice(enc.get_ids());
                }
                Segment::Image(input) => {
                    let n = self.image_token_count(input.width, input.height, image_index)?;
                    out.tokens.extend(self.image_start);
                    let start = out.tokens.len() as u32;
                    out.tokens.extend(std::iter::repeat_n(self.image_placeholder, n as usize));
                    out.tokens.extend(self.image_end);
                    out.images.push(ImagePlacement { image: input.image.clone(), runs: vec![(start, n)] });
                    image_index += 1;
                }
            }
        }
        Ok(out)
    }
}

/// Python's `round` on a non-negative ratio: half to even.
fn round_half_even(num: u64, den: u64) -> u64 {
    let (q, r) = (num / den, num % den);
    match (2 * r).cmp(&den) {
        std::cmp::Ordering::Less => q,
        std::cmp::Ordering::Greater => q + 1,
        std::cmp::Ordering::Equal => q + (q & 1),
    }
}

/// Qwen2-VL's resize rule for an image of `h × w` pixels: returns the
/// resized `(h', w')`, both multiples of `factor`, with
/// `min_pixels <= h'·w' <= max_pixels` (up to one factor of rounding).
fn qwen_resize(h: u32, w: u32, factor: u32, min_pixels: u64, max_pixels: u64) -> Result<(u64, u64), &'static str> {
    if h == 0 || w == 0 {
        return Err("width and height must be at least 1 pixel");
    }
    let (h, w, f) = (h as u64, w as u64, factor as u64);
    if h.max(w) > 200 * h.min(w) {
        return Err("aspect ratio must be at most 200");
    }
    let mut hb = f.max(round_half_even(h, f) * f);
    let mut wb = f.max(round_half_even(w, f) * f);
    let (hf, wf, ff) = (h as f64, w as f64, f as f64);
    if hb * wb > max_pixels {
        let beta = (hf * wf / max_pixels as f64).sqrt();
        hb = f.max(((hf / beta) / ff).floor() as u64 * f);
        wb = f.max(((wf / beta) / ff).floor() as u64 * f);
    } else if hb * wb < min_pixels {
        let beta = (min_pixels as f64 / (hf * wf)).sqrt();
        hb = ((hf * beta) / ff).ceil() as u64 * f;
        wb = ((wf * beta) / ff).ceil() as u64 * f;
    }
    Ok((hb, wb))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The Qwen2-VL grid rule on known sizes: a 448×448 image is 16×16
    /// patches of 28 → 256 tokens; sizes round to the nearest multiple of
    /// 28 (half to even); huge images are scaled under max_pixels; tiny ones
    /// up to min_pixels; zero and extreme ratios are errors.
    #[test]
    fn qwen2_vl_image_token_counts() {
        let p = ModelProfile::qwen2_vl();
        assert_eq!(p.image_token_count(Some(448), Some(448), 0).unwrap(), 256);
        // 500 / 28 = 17.86 → 18; 300 / 28 = 10.71 → 11.
        assert_eq!(p.image_token_count(Some(500), Some(300), 0).unwrap(), 18 * 11);
        // 42 / 28 = 1.5 → 2 (half to even), 14 / 28 = 0.5 → 0 → at least 28.
        assert_eq!(qwen_resize(42, 42, 28, 0, u64::MAX).unwrap(), (56, 56));
        assert_eq!(qwen_resize(70, 70, 28, 0, u64::MAX).unwrap(), (56, 56));
        // 4000 × 3000 fits the bound: 143 × 107 tokens.
        assert_eq!(p.image_token_count(Some(4000), Some(3000), 0).unwrap(), 143 * 107);
        let big = p.image_token_count(Some(8000), Some(6000), 0).unwrap();
        assert!(big <= 16384, "bounded by max_pixels: {big}");
        assert!(big > 15000, "close to the bound: {big}");
        assert_eq!(p.image_token_count(Some(10), Some(10), 0).unwrap(), 4);
        assert!(matches!(p.image_token_count(None, Some(10), 3), Err(ProfileError::ImageSizeMissing { image: 3, .. })));
        assert!(p.image_token_count(Some(0), Some(10), 0).is_err());
        assert!(p.image_token_count(Some(1), Some(1000), 0).is_err());
        assert_eq!(ModelProfile::qwen3_vl().image_token_count(Some(512), Some(512), 0).unwrap(), 256);
    }

    /// Unknown models get the plain profile, known families theirs.
    #[test]
    fn profiles_by_model_name() {
        assert_eq!(ModelProfile::for_model("Qwen/Qwen2-VL-7B-Instruct").name, "qwen2-vl");
        assert_eq!(ModelProfile::for_model("Qwen2.5-VL-3B").name, "qwen2-vl");
        assert_eq!(ModelProfile::for_model("qwen3_vl_8b").name, "qwen3-vl");
        let p = ModelProfile::for_model("llama-3");
        assert_eq!(p.template, ChatTemplate::Plain);
        assert_eq!(p.image_token_count(None, None, 0).unwrap(), 1);
    }
}
