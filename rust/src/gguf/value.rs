//! GGUF metadata values (docs/FORMATS.md §1, value types 0–12).

use super::cursor::Cursor;
use crate::error::Result;

/// Hard caps against crafted files. Each is far above what real models use
/// (Qwen3's vocabulary is 151,936 strings; its chat template ~4 KiB).
pub const MAX_STRING_BYTES: usize = 64 << 20;
pub const MAX_KEY_BYTES: usize = 65_535;
/// Array elements summed over one file's metadata. A decoded element takes 32 bytes however
/// few bytes encode it (a UINT8 takes one), so this bounds the decoded metadata at 256 MiB
/// plus the string bytes the file itself holds. Real models use well under a million
/// (Qwen3: three vocabulary-sized arrays, about 455,000 elements).
pub const MAX_METADATA_ELEMENTS: u64 = 1 << 23;

#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    F32(f32),
    Bool(bool),
    Str(String),
    Array(Vec<Value>),
    U64(u64),
    I64(i64),
    F64(f64),
}

impl Value {
    pub fn as_u64(&self) -> Option<u64> {
        match *self {
            Value::U8(v) => Some(v as u64),
            Value::U16(v) => Some(v as u64),
            Value::U32(v) => Some(v as u64),
            Value::U64(v) => Some(v),
            Value::I8(v) => u64::try_from(v).ok(),
            Value::I16(v) => u64::try_from(v).ok(),
            Value::I32(v) => u64::try_from(v).ok(),
            Value::I64(v) => u64::try_from(v).ok(),
            _ => None, // a BOOL is no count (block_count = true is a broken file)
        }
    }

    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            Value::F32(v) => Some(v as f64),
            Value::F64(v) => Some(v),
            _ => self.as_u64().map(|v| v as f64),
        }
    }

    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::Str(s) => Some(s),
            _ => None,
        }
    }

    pub fn type_name(&self) -> &'static str {
        match self {
            Value::U8(_) => "UINT8",
            Value::I8(_) => "INT8",
            Value::U16(_) => "UINT16",
            Value::I16(_) => "INT16",
            Value::U32(_) => "UINT32",
            Value::I32(_) => "INT32",
            Value::F32(_) => "FLOAT32",
            Value::Bool(_) => "BOOL",
            Value::Str(_) => "STRING",
            Value::Array(_) => "ARRAY",
            Value::U64(_) => "UINT64",
            Value::I64(_) => "INT64",
            Value::F64(_) => "FLOAT64",
        }
    }
}

/// Smallest encoded size of one element of `ty`, used to refuse array counts that cannot fit
/// in the bytes left before anything is allocated.
fn min_size(ty: u32) -> usize {
    match ty {
        0 | 1 | 7 => 1,
        2 | 3 => 2,
        4..=6 => 4,
        8 | 10..=12 => 8,
        _ => 1,
    }
}

/// Reads one value of type `ty`. `elements_left` is the file's remaining budget of array
/// elements (`MAX_METADATA_ELEMENTS` at the start of the metadata).
pub(crate) fn read_value(
    c: &mut Cursor<'_>,
    ty: u32,
    what: &str,
    depth: u32,
    elements_left: &mut u64,
) -> Result<Value> {
    let at = c.pos();
    Ok(match ty {
        0 => Value::U8(c.u8(what)?),
        1 => Value::I8(c.u8(what)? as i8),
        2 => Value::U16(c.u16(what)?),
        3 => Value::I16(c.u16(what)? as i16),
        4 => Value::U32(c.u32(what)?),
        5 => Value::I32(c.u32(what)? as i32),
        6 => Value::F32(f32::from_bits(c.u32(what)?)),
        7 => Value::Bool(c.u8(what)? != 0),
        8 => {
            let b = c.string(what, MAX_STRING_BYTES)?;
            Value::Str(String::from_utf8_lossy(b).into_owned())
        }
        9 => {
            if depth > 0 {
                return Err(c.err(at, format!("{what}: nested arrays are not supported")));
            }
            let ety = c.u32(what)?;
            if ety > 12 {
                return Err(c.err(at, format!("{what}: unknown array element type {ety}")));
            }
            if ety == 9 {
                return Err(c.err(at, format!("{what}: nested arrays are not supported")));
            }
            let n_at = c.pos();
            let n = c.u64(what)?;
            let need = usize::try_from(n)
                .ok()
                .and_then(|n| n.checked_mul(min_size(ety)));
            if need.is_none_or(|need| need > c.remaining()) {
                return Err(c.err(
                    n_at,
                    format!(
                        "{what}: array of {n} elements cannot fit in the {} bytes left",
                        c.remaining()
                    ),
                ));
            }
            if n > *elements_left {
                return Err(c.err(
                    n_at,
                    format!(
                        "{what}: array of {n} elements takes the file's metadata past the cap of \
                         {MAX_METADATA_ELEMENTS} array elements in all"
                    ),
                ));
            }
            *elements_left -= n;
            let mut v = Vec::with_capacity(n as usize);
            for _ in 0..n {
                v.push(read_value(c, ety, what, depth + 1, elements_left)?);
            }
            Value::Array(v)
        }
        10 => Value::U64(c.u64(what)?),
        11 => Value::I64(c.u64(what)? as i64),
        12 => Value::F64(f64::from_bits(c.u64(what)?)),
        _ => return Err(c.err(at, format!("{what}: unknown value type {ty}"))),
    })
}
