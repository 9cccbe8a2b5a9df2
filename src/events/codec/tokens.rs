//! Token ids, most of a stored event's bytes, read in place: a loop with a
//! branch per form where the forms repeat, one without a branch on the form
//! where they are mixed at random.

use super::error::Result;
use super::reader::Reader;

/// For each msgpack marker byte, the number of value bytes that follow it
/// when it is one of the unsigned forms a u32 token id is read from in place
/// (a positive fixint: 0; uint8: 1; uint16: 2; uint32: 4), else
/// [`TOKEN_FORM_OTHER`].
const TOKEN_FORMS: [u8; 256] = {
    let mut t = [TOKEN_FORM_OTHER; 256];
    let mut m = 0;
    while m < 0x80 {
        t[m] = 0;
        m += 1;
    }
    t[0xcc] = 1;
    t[0xcd] = 2;
    t[0xce] = 4;
    t
};

/// A marker that `TOKEN_FORMS` leaves to the general reader.
const TOKEN_FORM_OTHER: u8 = 0xff;

/// Tokens whose forms [`forms_mixed`] looks at.
const TOKEN_WINDOW: usize = 16;

/// Form changes among those above which the forms count as mixed.
const TOKEN_MIXED: u32 = 4;

/// Whether the forms of the first `TOKEN_WINDOW` token ids at the start of
/// `buf` change more than `TOKEN_MIXED` times (false where a marker is not
/// one of the four unsigned forms or the bytes run out: the loop with a
/// branch per form handles those).
fn forms_mixed(buf: &[u8]) -> bool {
    let (mut pos, mut prev, mut changes) = (0usize, 0u8, 0u32);
    for _ in 0..TOKEN_WINDOW {
        let Some(&m) = buf.get(pos) else { return false };
        let form = TOKEN_FORMS[m as usize];
        if form == TOKEN_FORM_OTHER {
            return false;
        }
        changes += (form != prev) as u32;
        prev = form;
        pos += 1 + form as usize;
    }
    changes > TOKEN_MIXED
}

/// Reads token ids into `out` from `pos` without a branch on the form, while
/// each is an unsigned form with its four following bytes in `buf`; returns
/// the position reached and the count read.
///
/// Two ids a step: where one token starts depends on the marker of the one
/// before, so that chain sets the pace. The two markers are taken from one
/// 8-byte load by shifts, and each count of value bytes is computed from its
/// marker by arithmetic, so a step waits on one load instead of four; the
/// table only checks the forms, off that chain.
fn tokens_branch_free(buf: &[u8], mut pos: usize, out: &mut [u32]) -> (usize, usize) {
    /// The count of value bytes of a valid unsigned marker, by arithmetic
    /// (0 for a fixint; 1, 2, 4 for 0xcc, 0xcd, 0xce).
    #[inline(always)]
    fn value_bytes(m: u64) -> usize {
        if m < 0x80 { 0 } else { 1 << (m.wrapping_sub(0xcc) & 3) }
    }
    /// The id whose marker is `m` and whose value bytes start `bytes`.
    #[inline(always)]
    fn id(m: u64, form: usize, bytes: [u8; 4]) -> u32 {
        let word = u32::from_be_bytes(bytes) as u64;
        // A fixint (no value bytes) shifts the word out entirely and is its
        // own marker.
        let fixint = m as u32 & 0u32.wrapping_sub((form == 0) as u32);
        (word >> (32 - 8 * form as u32)) as u32 | fixint
    }
    let mut i = 0;
    while i + 2 <= out.len() {
        // Two ids take ten bytes at most.
        let Some(b) = buf.get(pos..pos + 10) else { break };
        let w = u64::from_le_bytes([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]]);
        let m1 = w & 0xff;
        let f1 = value_bytes(m1);
        // (An invalid first marker may give a shift past 63: it wraps, and
        // the check below rejects the pair whatever `m2` came out.)
        let m2 = w.wrapping_shr(8 * (1 + f1) as u32) & 0xff;
        let f2 = value_bytes(m2);
        if TOKEN_FORMS[m1 as usize] == TOKEN_FORM_OTHER || TOKEN_FORMS[m2 as usize] == TOKEN_FORM_OTHER {
            break;
        }
        out[i] = id(m1, f1, [b[1], b[2], b[3], b[4]]);
        let o = 2 + f1;
        out[i + 1] = id(m2, f2, [b[o], b[o + 1], b[o + 2], b[o + 3]]);
        pos += 2 + f1 + f2;
        i += 2;
    }
    while i < out.len() {
        let Some(&[m, b1, b2, b3, b4]) = buf.get(pos..pos + 5) else { break };
        if TOKEN_FORMS[m as usize] == TOKEN_FORM_OTHER {
            break;
        }
        let form = value_bytes(m as u64);
        out[i] = id(m as u64, form, [b1, b2, b3, b4]);
        pos += 1 + form;
        i += 1;
    }
    (pos, i)
}

impl Reader<'_> {
    pub(super) fn opt_tokens(&mut self) -> Result<Option<Vec<u32>>> {
        if self.nil()? {
            return Ok(None);
        }
        let n = self.array_len("token_ids")?;
        let mut v = Vec::with_capacity(self.cap(n, 1));
        // Token ids are most of a stored event's bytes, so they get loops of
        // their own: the unsigned forms an encoder picks for a u32 (fixint,
        // uint8, uint16, uint32) are read in place; any other form (a signed
        // or 64-bit encoding, a bad marker, a value out of range) goes
        // through the general reader, which decodes or rejects it.
        //
        // Why two loops: with one form throughout (ids of one size), the
        // branch per form below is always predicted and the CPU runs ahead
        // of the loads, faster than a loop whose next position waits on the
        // marker it just read. With forms mixed at random (uniform ids over a
        // vocabulary larger than 65 536, as in `route-bench`), every other
        // token mispredicts there, and `tokens_branch_free` is about twice as
        // fast. `forms_mixed` looks at the first tokens to choose.
        if n >= TOKEN_WINDOW && n <= self.remaining() && forms_mixed(&self.buf[self.pos..]) {
            // Forms mixed at random: the loop without a branch on the form,
            // while the input has five bytes left, one token through the
            // general reader where it stops.
            v.resize(n, 0);
            let mut i = 0;
            while i < n {
                let (p, k) = tokens_branch_free(self.buf, self.pos, &mut v[i..]);
                self.pos = p;
                i += k;
                if i < n {
                    v[i] = self.u32("token id")?;
                    i += 1;
                }
            }
            return Ok(Some(v));
        }
        let buf = self.buf;
        let mut pos = self.pos;
        for _ in 0..n {
            let (value, len) = match buf.get(pos) {
                Some(&m @ 0x00..=0x7f) => (m as u32, 1),
                Some(0xcc) if pos + 2 <= buf.len() => (buf[pos + 1] as u32, 2),
                Some(0xcd) if pos + 3 <= buf.len() => (u16::from_be_bytes([buf[pos + 1], buf[pos + 2]]) as u32, 3),
                Some(0xce) if pos + 5 <= buf.len() => {
                    (u32::from_be_bytes([buf[pos + 1], buf[pos + 2], buf[pos + 3], buf[pos + 4]]), 5)
                }
                _ => {
                    self.pos = pos;
                    v.push(self.u32("token id")?);
                    pos = self.pos;
                    continue;
                }
            };
            v.push(value);
            pos += len;
        }
        self.pos = pos;
        Ok(Some(v))
    }
}
