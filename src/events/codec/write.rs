//! msgpack writes: the smallest encoding of every value, appended to a
//! `Vec<u8>`. Hand-rolled so that every byte is explicit and no write can
//! fail.

pub(super) fn put_nil(out: &mut Vec<u8>) {
    out.push(0xc0);
}

pub(super) fn put_f64(out: &mut Vec<u8>, v: f64) {
    out.push(0xcb);
    out.extend_from_slice(&v.to_be_bytes());
}

/// The smallest encoding of an unsigned integer.
pub(super) fn put_uint(out: &mut Vec<u8>, v: u64) {
    match u32::try_from(v) {
        Ok(v) => put_u32(out, v),
        Err(_) => {
            out.push(0xcf);
            out.extend_from_slice(&v.to_be_bytes());
        }
    }
}

/// The shortest unsigned form of a u32 (token ids go through here one by one).
#[inline]
pub(super) fn put_u32(out: &mut Vec<u8>, v: u32) {
    if v < 128 {
        out.push(v as u8);
    } else if v < 256 {
        out.extend_from_slice(&[0xcc, v as u8]);
    } else if v < 65_536 {
        let [a, b] = (v as u16).to_be_bytes();
        out.extend_from_slice(&[0xcd, a, b]);
    } else {
        let [a, b, c, d] = v.to_be_bytes();
        out.extend_from_slice(&[0xce, a, b, c, d]);
    }
}

/// The smallest encoding of a signed integer (non-negative values use the
/// unsigned forms, as every msgpack library does).
pub(super) fn put_int(out: &mut Vec<u8>, v: i64) {
    if v >= 0 {
        put_uint(out, v as u64);
    } else if v >= -32 {
        out.push(v as i8 as u8);
    } else if v >= i8::MIN.into() {
        out.extend_from_slice(&[0xd0, v as i8 as u8]);
    } else if v >= i16::MIN.into() {
        out.push(0xd1);
        out.extend_from_slice(&(v as i16).to_be_bytes());
    } else if v >= i32::MIN.into() {
        out.push(0xd2);
        out.extend_from_slice(&(v as i32).to_be_bytes());
    } else {
        out.push(0xd3);
        out.extend_from_slice(&v.to_be_bytes());
    }
}

pub(super) fn put_opt_int(out: &mut Vec<u8>, v: Option<i64>) {
    match v {
        Some(v) => put_int(out, v),
        None => put_nil(out),
    }
}

pub(super) fn put_str(out: &mut Vec<u8>, s: &str) {
    let n = s.len();
    if n < 32 {
        out.push(0xa0 | n as u8);
    } else if n < 256 {
        out.extend_from_slice(&[0xd9, n as u8]);
    } else if n < 65_536 {
        out.push(0xda);
        out.extend_from_slice(&(n as u16).to_be_bytes());
    } else {
        out.push(0xdb);
        out.extend_from_slice(&(n as u32).to_be_bytes());
    }
    out.extend_from_slice(s.as_bytes());
}

pub(super) fn put_opt_str(out: &mut Vec<u8>, s: Option<&str>) {
    match s {
        Some(s) => put_str(out, s),
        None => put_nil(out),
    }
}

pub(super) fn put_bin(out: &mut Vec<u8>, b: &[u8]) {
    let n = b.len();
    if n < 256 {
        out.extend_from_slice(&[0xc4, n as u8]);
    } else if n < 65_536 {
        out.push(0xc5);
        out.extend_from_slice(&(n as u16).to_be_bytes());
    } else {
        out.push(0xc6);
        out.extend_from_slice(&(n as u32).to_be_bytes());
    }
    out.extend_from_slice(b);
}

pub(super) fn put_array_len(out: &mut Vec<u8>, n: usize) {
    if n < 16 {
        out.push(0x90 | n as u8);
    } else if n < 65_536 {
        out.push(0xdc);
        out.extend_from_slice(&(n as u16).to_be_bytes());
    } else {
        out.push(0xdd);
        out.extend_from_slice(&(n as u32).to_be_bytes());
    }
}

pub(super) fn put_map_len(out: &mut Vec<u8>, n: usize) {
    if n < 16 {
        out.push(0x80 | n as u8);
    } else if n < 65_536 {
        out.push(0xde);
        out.extend_from_slice(&(n as u16).to_be_bytes());
    } else {
        out.push(0xdf);
        out.extend_from_slice(&(n as u32).to_be_bytes());
    }
}
