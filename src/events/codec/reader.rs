//! msgpack reads over bytes from the network: never a panic, and never an
//! allocation the input cannot back (every element costs at least one input
//! byte, so no capacity exceeds the bytes left; see [`Reader::cap`]); values
//! are skipped iteratively, so no nesting an attacker can deepen costs
//! stack.

use super::error::{DecodeError, Result};

/// A cursor over msgpack bytes. Every read checks the bytes left and fails
/// with the position instead of panicking.
pub(super) struct Reader<'a> {
    /// The input.
    pub(super) buf: &'a [u8],
    /// The next byte to read.
    pub(super) pos: usize,
}

impl<'a> Reader<'a> {
    pub(super) fn remaining(&self) -> usize {
        self.buf.len() - self.pos
    }

    /// A capacity for `n` claimed elements of at least `min_bytes` each: never
    /// more than the bytes left could hold, so a hostile length allocates
    /// nothing it cannot back with input.
    pub(super) fn cap(&self, n: usize, min_bytes: usize) -> usize {
        n.min(self.remaining() / min_bytes)
    }

    pub(super) fn peek(&self) -> Result<u8> {
        self.buf.get(self.pos).copied().ok_or(DecodeError::Truncated(self.pos))
    }

    pub(super) fn byte(&mut self) -> Result<u8> {
        let b = self.peek()?;
        self.pos += 1;
        Ok(b)
    }

    pub(super) fn take(&mut self, n: usize) -> Result<&'a [u8]> {
        if n > self.remaining() {
            return Err(DecodeError::Truncated(self.buf.len()));
        }
        let s = &self.buf[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }

    pub(super) fn be<const N: usize>(&mut self) -> Result<[u8; N]> {
        let s = self.take(N)?;
        let mut a = [0u8; N];
        a.copy_from_slice(s);
        Ok(a)
    }

    pub(super) fn unexpected(&self, at: usize, what: &'static str) -> DecodeError {
        DecodeError::Unexpected { pos: at, marker: self.buf.get(at).copied().unwrap_or(0), what }
    }

    /// Consumes a nil if one is next.
    pub(super) fn nil(&mut self) -> Result<bool> {
        if self.peek()? == 0xc0 {
            self.pos += 1;
            return Ok(true);
        }
        Ok(false)
    }

    pub(super) fn array_len(&mut self, what: &'static str) -> Result<usize> {
        let at = self.pos;
        let n = match self.byte()? {
            m @ 0x90..=0x9f => (m & 0x0f) as usize,
            0xdc => u16::from_be_bytes(self.be()?) as usize,
            0xdd => u32::from_be_bytes(self.be()?) as usize,
            _ => return Err(self.unexpected(at, what)),
        };
        Ok(n)
    }

    pub(super) fn map_len(&mut self, what: &'static str) -> Result<usize> {
        let at = self.pos;
        let n = match self.byte()? {
            m @ 0x80..=0x8f => (m & 0x0f) as usize,
            0xde => u16::from_be_bytes(self.be()?) as usize,
            0xdf => u32::from_be_bytes(self.be()?) as usize,
            _ => return Err(self.unexpected(at, what)),
        };
        Ok(n)
    }

    /// Any msgpack integer, widened so that u64 and i64 both fit.
    pub(super) fn int(&mut self, what: &'static str) -> Result<i128> {
        let at = self.pos;
        Ok(match self.byte()? {
            m @ 0x00..=0x7f => m.into(),
            m @ 0xe0..=0xff => (m as i8).into(),
            0xcc => self.byte()?.into(),
            0xcd => u16::from_be_bytes(self.be()?).into(),
            0xce => u32::from_be_bytes(self.be()?).into(),
            0xcf => u64::from_be_bytes(self.be()?).into(),
            0xd0 => (self.byte()? as i8).into(),
            0xd1 => i16::from_be_bytes(self.be()?).into(),
            0xd2 => i32::from_be_bytes(self.be()?).into(),
            0xd3 => i64::from_be_bytes(self.be()?).into(),
            _ => return Err(self.unexpected(at, what)),
        })
    }

    /// A 64-bit integer sent signed or unsigned, kept as its 64 bits.
    pub(super) fn bits64(&mut self, what: &'static str) -> Result<u64> {
        let v = self.int(what)?;
        Ok(if v < 0 { v as i64 as u64 } else { v as u64 })
    }

    pub(super) fn i64_bits(&mut self, what: &'static str) -> Result<i64> {
        Ok(self.bits64(what)? as i64)
    }

    pub(super) fn opt_i64(&mut self, what: &'static str) -> Result<Option<i64>> {
        if self.nil()? {
            return Ok(None);
        }
        let at = self.pos;
        let v = self.int(what)?;
        i64::try_from(v).map(Some).map_err(|_| DecodeError::OutOfRange { pos: at, what })
    }

    pub(super) fn u32(&mut self, what: &'static str) -> Result<u32> {
        let at = self.pos;
        let v = self.int(what)?;
        u32::try_from(v).map_err(|_| DecodeError::OutOfRange { pos: at, what })
    }

    pub(super) fn f64(&mut self, what: &'static str) -> Result<f64> {
        let at = self.pos;
        match self.peek()? {
            0xcb => {
                self.pos += 1;
                Ok(f64::from_be_bytes(self.be()?))
            }
            0xca => {
                self.pos += 1;
                Ok(f32::from_be_bytes(self.be()?).into())
            }
            _ => self.int(what).map(|v| v as f64).map_err(|_| self.unexpected(at, what)),
        }
    }

    pub(super) fn str(&mut self, what: &'static str) -> Result<&'a str> {
        let at = self.pos;
        let n = match self.byte()? {
            m @ 0xa0..=0xbf => (m & 0x1f) as usize,
            0xd9 => self.byte()? as usize,
            0xda => u16::from_be_bytes(self.be()?) as usize,
            0xdb => u32::from_be_bytes(self.be()?) as usize,
            _ => return Err(self.unexpected(at, what)),
        };
        let bytes = self.take(n)?;
        std::str::from_utf8(bytes).map_err(|_| DecodeError::Utf8(at))
    }

    pub(super) fn opt_string(&mut self, what: &'static str) -> Result<Option<String>> {
        if self.nil()? {
            return Ok(None);
        }
        self.str(what).map(|s| Some(s.to_owned()))
    }

    pub(super) fn bin(&mut self, what: &'static str) -> Result<&'a [u8]> {
        let at = self.pos;
        let n = match self.byte()? {
            0xc4 => self.byte()? as usize,
            0xc5 => u16::from_be_bytes(self.be()?) as usize,
            0xc6 => u32::from_be_bytes(self.be()?) as usize,
            _ => return Err(self.unexpected(at, what)),
        };
        self.take(n)
    }

    /// Skips one value of any type, iteratively: nesting depth costs no stack.
    pub(super) fn skip(&mut self) -> Result<()> {
        let mut pending: u64 = 1;
        while pending > 0 {
            pending -= 1;
            let at = self.pos;
            let m = self.byte()?;
            let (children, payload): (u64, usize) = match m {
                0x00..=0x7f | 0xe0..=0xff | 0xc0 | 0xc2 | 0xc3 => (0, 0),
                0x80..=0x8f => (2 * u64::from(m & 0x0f), 0),
                0x90..=0x9f => (u64::from(m & 0x0f), 0),
                0xa0..=0xbf => (0, (m & 0x1f) as usize),
                0xc4 | 0xd9 => (0, self.byte()? as usize),
                0xc5 | 0xda => (0, u16::from_be_bytes(self.be()?) as usize),
                0xc6 | 0xdb => (0, u32::from_be_bytes(self.be()?) as usize),
                0xc7 => (0, self.byte()? as usize + 1),
                0xc8 => (0, u16::from_be_bytes(self.be()?) as usize + 1),
                0xc9 => (0, u32::from_be_bytes(self.be()?) as usize + 1),
                0xca => (0, 4),
                0xcb => (0, 8),
                0xcc | 0xd0 => (0, 1),
                0xcd | 0xd1 => (0, 2),
                0xce | 0xd2 => (0, 4),
                0xcf | 0xd3 => (0, 8),
                0xd4 => (0, 2),
                0xd5 => (0, 3),
                0xd6 => (0, 5),
                0xd7 => (0, 9),
                0xd8 => (0, 17),
                0xdc => (u16::from_be_bytes(self.be()?).into(), 0),
                0xdd => (u32::from_be_bytes(self.be()?).into(), 0),
                0xde => (2 * u64::from(u16::from_be_bytes(self.be()?)), 0),
                0xdf => (2 * u64::from(u32::from_be_bytes(self.be()?)), 0),
                0xc1 => return Err(self.unexpected(at, "a msgpack value (0xc1 is never used)")),
            };
            self.take(payload)?;
            pending += children;
            // Each pending value needs at least one more byte.
            if pending > self.remaining() as u64 {
                return Err(DecodeError::Truncated(self.buf.len()));
            }
        }
        Ok(())
    }

    /// (skipped). The value is left for the caller.
    pub(super) fn key(&mut self) -> Result<Option<&'a str>> {
        match self.peek()? {
            0xa0..=0xbf | 0xd9 | 0xda | 0xdb => self.str("field name").map(Some),
            _ => self.skip().map(|()| None),
        }
    }
}
