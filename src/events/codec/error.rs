//! Why bytes did not decode.

/// Why bytes did not decode. Positions are byte offsets into the payload.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    /// The input ended inside a value.
    #[error("input truncated at byte {0}")]
    Truncated(usize),
    /// A value of the wrong msgpack type.
    #[error("byte {pos}: unexpected msgpack marker 0x{marker:02x} for {what}")]
    Unexpected {
        /// Where.
        pos: usize,
        /// The marker found.
        marker: u8,
        /// What was expected.
        what: &'static str,
    },
    /// An integer that does not fit its field.
    #[error("byte {pos}: {what} out of range")]
    OutOfRange {
        /// Where.
        pos: usize,
        /// The field.
        what: &'static str,
    },
    /// A string that is not UTF-8.
    #[error("byte {0}: string is not UTF-8")]
    Utf8(usize),
    /// A required field is missing.
    #[error("{event}: missing field {field}")]
    Missing {
        /// The event type.
        event: &'static str,
        /// The field.
        field: &'static str,
    },
    /// A value that is well-formed msgpack but inconsistent.
    #[error("{0}")]
    Invalid(&'static str),
    /// Bytes after the payload's value.
    #[error("{0} trailing bytes after the payload")]
    Trailing(usize),
    /// A message without exactly three frames.
    #[error("message has {0} frames, expected 3 (topic, seq, payload)")]
    FrameCount(usize),
    /// A sequence frame that is not 8 bytes.
    #[error("seq frame has {0} bytes, expected 8")]
    SeqLength(usize),
}

pub(super) type Result<T> = std::result::Result<T, DecodeError>;
