//! Request-side hashing from text and images through a tokenizer.json and a
//! model profile, with the tokenizer the tests build themselves.

mod router_support;

use kvcore_router::{
    ImageInput, ImageRef, Message, ModelProfile, NoUuids, Part, QWEN_VISION_END_TOKEN, QWEN_VISION_START_TOKEN,
    hash_request,
};
use tokenizers::Tokenizer;

fn tokenizer() -> Tokenizer {
    let dir = router_support::temp_dir("router-text");
    let path = router_support::write_test_tokenizer(&dir);
    Tokenizer::from_file(&path).expect("the test tokenizer loads")
}

fn image(w: u32, h: u32) -> ImageInput {
    ImageInput { image: ImageRef::Uuid("img-1".into()), width: Some(w), height: Some(h) }
}

/// The Qwen2-VL profile must lay out the chat exactly as its template does
/// (default system prompt, ChatML turns, the assistant turn opened) and
/// expand an image into vision start, (h/28)(w/28) pads and vision end; the
/// same prompt given pre-templated with the image marker tokenizes the same.
#[test]
fn qwen2_vl_chat_renders_as_the_template() {
    let tok = tokenizer();
    let p = ModelProfile::qwen2_vl();
    let id = |s: &str| tok.token_to_id(s).expect("in vocab");
    let messages = vec![Message {
        role: "user".into(),
        parts: vec![Part::Image(image(448, 280)), Part::Text("describe this image .".into())],
    }];
    let req = p.render(&tok, &messages, None, None).unwrap();
    let pads = (448 / 28) * (280 / 28);
    let mut want = vec![id("<|im_start|>"), id("system")];
    want.extend(["You", "are", "a", "helpful", "assistant", "."].map(id));
    want.extend([id("<|im_end|>"), id("<|im_start|>"), id("user"), QWEN_VISION_START_TOKEN]);
    let start = want.len() as u32;
    want.extend(std::iter::repeat_n(151_655, pads as usize));
    want.push(QWEN_VISION_END_TOKEN);
    want.extend(["describe", "this", "image", "."].map(id));
    want.extend([id("<|im_end|>"), id("<|im_start|>"), id("assistant")]);
    assert_eq!(req.tokens, want);
    assert_eq!(req.images.len(), 1);
    assert_eq!(req.images[0].runs, vec![(start, pads)]);

    let prompt = "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\n\
                  <|vision_start|><|image_pad|><|vision_end|>describe this image .<|im_end|>\n<|im_start|>assistant\n";
    let marker = "<|vision_start|><|image_pad|><|vision_end|>";
    let again = p.render_prompt(&tok, prompt, marker, &[image(448, 280)], None, None).unwrap();
    assert_eq!(again, req);
}

/// An unknown model falls back to plain text with one placeholder per image
/// and no size needed; keys stop at the image when its UUID is unknown, and
/// text-only prefixes still hash.
#[test]
fn unknown_model_gets_safe_defaults() {
    let tok = tokenizer();
    let p = ModelProfile::for_model("some-llm-7b");
    let no_size = ImageInput { image: ImageRef::Uuid("x".into()), width: None, height: None };
    let messages = vec![Message {
        role: "user".into(),
        parts: vec![Part::Text("tell me a story about one cat and two dog".into()), Part::Image(no_size)],
    }];
    let req = p.render(&tok, &messages, None, None).unwrap();
    assert_eq!(req.tokens.len(), 11);
    assert_eq!(req.images[0].runs, vec![(10, 1)]);
    let h = hash_request(&req, 4, p.image_placeholder, &NoUuids).unwrap();
    assert_eq!(h.blocks_full, 2);
    assert_eq!(h.keys.len(), 2, "the image sits in the partial third block");
    let h = hash_request(&req, 2, p.image_placeholder, &NoUuids).unwrap();
    assert_eq!(h.keys.len(), 5, "keys stop at the block holding the unresolved image");
}

/// A Qwen profile refuses an image without its size with a clear error.
#[test]
fn qwen_image_without_size_is_an_error() {
    let tok = tokenizer();
    let no_size = ImageInput { image: ImageRef::Uuid("x".into()), width: None, height: Some(4) };
    let messages = vec![Message { role: "user".into(), parts: vec![Part::Image(no_size)] }];
    let err = ModelProfile::qwen3_vl().render(&tok, &messages, None, None).unwrap_err();
    assert!(err.to_string().contains("needs its width and height"), "{err}");
}
