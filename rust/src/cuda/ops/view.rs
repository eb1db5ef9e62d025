//! `Dv`: a byte range of device memory, the unit the model launchers check sizes against
//! (a whole `DevBuf` or a checked sub-range of one), and the small checked conversions the
//! launchers share.

use crate::cuda::{Arg, DevBuf, Gpu, PinnedBuf, Stream};
use crate::error::{Error, Result};

/// `len` bytes of device memory at `ptr`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Dv {
    pub ptr: u64,
    pub len: usize,
}

impl Dv {
    /// The whole buffer.
    pub fn of(b: &DevBuf) -> Dv {
        Dv {
            ptr: b.ptr(),
            len: b.len(),
        }
    }

    /// The whole of a mapped pinned host buffer, at its device address (kernels read and
    /// write it over the link).
    pub fn mapped(b: &PinnedBuf) -> Dv {
        Dv {
            ptr: b.dev_ptr(),
            len: b.len(),
        }
    }

    /// Bytes [off, off + len) of this range, or `Error::Shape`.
    pub fn sub(self, off: usize, len: usize) -> Result<Dv> {
        match off.checked_add(len) {
            Some(end) if end <= self.len => Ok(Dv {
                ptr: self.ptr + off as u64,
                len,
            }),
            _ => Err(Error::Shape(format!(
                "device range [{off}, {off}+{len}) outside {} bytes",
                self.len
            ))),
        }
    }

    /// f32 elements [off, off + n) of this range.
    pub fn f32s(self, off: usize, n: usize) -> Result<Dv> {
        self.sub(bytes(off, 4)?, bytes(n, 4)?)
    }

    /// `Error::Shape` unless the range holds `need` bytes.
    pub fn need(self, what: &str, need: usize) -> Result<()> {
        if self.len < need {
            return Err(Error::Shape(format!(
                "{what}: needs {need} bytes of device memory, has {}",
                self.len
            )));
        }
        Ok(())
    }

    pub fn arg(self) -> Arg {
        Arg::Ptr(self.ptr)
    }
}

/// n · size without overflow.
pub fn bytes(n: usize, size: usize) -> Result<usize> {
    n.checked_mul(size)
        .ok_or_else(|| Error::Shape(format!("{n} elements of {size} bytes overflow")))
}

/// Product of dimensions without overflow.
pub fn prod(dims: &[usize]) -> Result<usize> {
    dims.iter().try_fold(1usize, |a, &d| {
        a.checked_mul(d)
            .ok_or_else(|| Error::Shape(format!("shape {dims:?} overflows")))
    })
}

/// `v` as a kernel's i32 argument.
pub fn i32_of(what: &str, v: usize) -> Result<i32> {
    i32::try_from(v).map_err(|_| Error::Shape(format!("{what} = {v} exceeds i32")))
}

/// `v` as a grid dimension (x: < 2^31, y and z: < 65536).
pub fn grid_dim(what: &str, v: usize, max: usize) -> Result<u32> {
    if v == 0 || v > max {
        return Err(Error::Shape(format!(
            "{what} = {v} is outside the grid's 1..={max}"
        )));
    }
    Ok(v as u32)
}

pub const GRID_X: usize = (1 << 31) - 1;
pub const GRID_YZ: usize = 65535;

/// Launches kernel `name` (resolved through the GPU's kernel cache) with no dynamic shared
/// memory.
pub fn launch(
    gpu: &Gpu,
    s: &Stream,
    name: &str,
    grid: (u32, u32, u32),
    block: u32,
    args: &[Arg],
) -> Result<()> {
    gpu.kernel(name)?.launch(s, grid, (block, 1, 1), 0, args)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sub_ranges_are_checked() {
        let d = Dv { ptr: 1000, len: 64 };
        assert_eq!(d.sub(8, 16).unwrap(), Dv { ptr: 1008, len: 16 });
        assert_eq!(d.sub(64, 0).unwrap(), Dv { ptr: 1064, len: 0 });
        assert!(matches!(d.sub(60, 8), Err(Error::Shape(_))));
        assert!(matches!(d.sub(usize::MAX, 2), Err(Error::Shape(_))));
        assert_eq!(d.f32s(2, 3).unwrap(), Dv { ptr: 1008, len: 12 });
        assert!(d.f32s(15, 2).is_err());
        assert!(d.need("x", 64).is_ok() && d.need("x", 65).is_err());
        assert!(prod(&[usize::MAX, 2]).is_err());
        assert_eq!(prod(&[3, 4, 5]).unwrap(), 60);
        assert!(i32_of("n", 1 << 31).is_err());
        assert!(grid_dim("g", 0, 10).is_err() && grid_dim("g", 11, 10).is_err());
        assert_eq!(grid_dim("g", 10, 10).unwrap(), 10);
    }
}
