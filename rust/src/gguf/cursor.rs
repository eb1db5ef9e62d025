//! A bounds-checked little-endian reader over the mapped header bytes. Every read checks the
//! remaining length first, so a crafted length can never cause a large allocation or a read
//! past the end of the file.

use crate::error::{Error, Result};
use std::path::Path;

pub(crate) struct Cursor<'a> {
    buf: &'a [u8],
    pos: usize,
    path: &'a Path,
}

impl<'a> Cursor<'a> {
    pub fn new(buf: &'a [u8], path: &'a Path) -> Self {
        Cursor { buf, pos: 0, path }
    }

    pub fn pos(&self) -> usize {
        self.pos
    }

    pub fn remaining(&self) -> usize {
        self.buf.len() - self.pos
    }

    pub fn err(&self, at: usize, msg: impl Into<String>) -> Error {
        Error::gguf(self.path, at as u64, msg)
    }

    pub fn bytes(&mut self, n: usize, what: &str) -> Result<&'a [u8]> {
        if n > self.remaining() {
            return Err(self.err(
                self.pos,
                format!(
                    "file ends while reading {what}: need {n} bytes, {} left",
                    self.remaining()
                ),
            ));
        }
        let s = &self.buf[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }

    pub fn array<const N: usize>(&mut self, what: &str) -> Result<[u8; N]> {
        let b = self.bytes(N, what)?;
        let mut a = [0u8; N];
        a.copy_from_slice(b);
        Ok(a)
    }

    pub fn u8(&mut self, what: &str) -> Result<u8> {
        Ok(self.array::<1>(what)?[0])
    }
    pub fn u16(&mut self, what: &str) -> Result<u16> {
        Ok(u16::from_le_bytes(self.array(what)?))
    }
    pub fn u32(&mut self, what: &str) -> Result<u32> {
        Ok(u32::from_le_bytes(self.array(what)?))
    }
    pub fn u64(&mut self, what: &str) -> Result<u64> {
        Ok(u64::from_le_bytes(self.array(what)?))
    }

    /// A gguf string: u64 length, then that many bytes, capped at `max` bytes.
    pub fn string(&mut self, what: &str, max: usize) -> Result<&'a [u8]> {
        let at = self.pos;
        let len = self.u64(what)?;
        if len > max as u64 {
            return Err(self.err(
                at,
                format!("{what} length {len} exceeds the cap of {max} bytes"),
            ));
        }
        self.bytes(len as usize, what)
    }

    pub fn utf8(&mut self, what: &str, max: usize) -> Result<&'a str> {
        let at = self.pos;
        let b = self.string(what, max)?;
        std::str::from_utf8(b).map_err(|e| self.err(at, format!("{what} is not valid UTF-8: {e}")))
    }
}
