//! `Kernel` (a resolved `__global__` function) and `Arg` (one by-value kernel parameter).

use super::ctx::Ctx;
use super::ffi::{self, cu, CUfunction};
use super::stream::Stream;
use crate::error::{Error, Result};
use std::ffi::c_void;
use std::sync::Arc;

/// The most parameters one launch may pass.
pub const MAX_ARGS: usize = 32;

/// One kernel parameter, passed by value, in the kernel's declaration order.
/// `Ptr` is a device address (`DevBuf::ptr`/`slice_ptr`); `U32` matches `uint32_t`/`unsigned`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Arg {
    Ptr(u64),
    I32(i32),
    U32(u32),
    I64(i64),
    U64(u64),
    F32(f32),
}

impl Arg {
    /// Size in bytes of the C parameter this argument fills.
    pub fn size(&self) -> usize {
        match self {
            Arg::Ptr(_) | Arg::I64(_) | Arg::U64(_) => 8,
            Arg::I32(_) | Arg::U32(_) | Arg::F32(_) => 4,
        }
    }

    /// The value's bytes at the start of an 8-byte, 8-aligned slot (what the driver reads).
    pub(crate) fn slot(&self) -> u64 {
        let mut b = [0u8; 8];
        match *self {
            Arg::Ptr(v) | Arg::U64(v) => b = v.to_ne_bytes(),
            Arg::I64(v) => b = v.to_ne_bytes(),
            Arg::I32(v) => b[..4].copy_from_slice(&v.to_ne_bytes()),
            Arg::U32(v) => b[..4].copy_from_slice(&v.to_ne_bytes()),
            Arg::F32(v) => b[..4].copy_from_slice(&v.to_ne_bytes()),
        }
        u64::from_ne_bytes(b)
    }
}

/// A kernel of a loaded module. Cheap to clone; keeps the context alive. Send + Sync.
#[derive(Clone)]
pub struct Kernel {
    ctx: Arc<Ctx>,
    f: CUfunction,
    name: Arc<str>,
    /// Each parameter's size in bytes, from `cuFuncGetParamInfo` (None: driver too old).
    params: Option<Arc<[usize]>>,
}

// SAFETY: a CUfunction handle is immutable and valid on every thread of its context.
unsafe impl Send for Kernel {}
unsafe impl Sync for Kernel {}

impl Kernel {
    pub(crate) fn new(ctx: &Arc<Ctx>, f: CUfunction, name: &str) -> Result<Kernel> {
        let drv = ctx.drv;
        // Loads the function now if the driver loads lazily (so that a broken image fails
        // here, naming the kernel, and never inside a graph capture).
        let mut regs = 0;
        if let Err(Error::Cuda { call, code, msg }) =
            cu!(drv.cuFuncGetAttribute(&mut regs, ffi::CU_FUNC_ATTRIBUTE_NUM_REGS, f))
        {
            return Err(Error::Cuda {
                call,
                code,
                msg: format!("{name}: {msg}"),
            });
        }
        let params = match drv.cuFuncGetParamInfo {
            None => None,
            Some(info) => {
                let mut sizes = Vec::new();
                // The driver answers an error past the last parameter.
                while sizes.len() <= MAX_ARGS {
                    let (mut off, mut size) = (0usize, 0usize);
                    // SAFETY: `f` is a live function; the driver writes two size_t values.
                    let r = unsafe { info(f, sizes.len(), &mut off, &mut size) };
                    if r != ffi::CUDA_SUCCESS {
                        break;
                    }
                    sizes.push(size);
                }
                // No parameter at all is indistinguishable from "cannot tell": don't check.
                (!sizes.is_empty()).then(|| sizes.into())
            }
        };
        Ok(Kernel {
            ctx: ctx.clone(),
            f,
            name: name.into(),
            params,
        })
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// Each parameter's size in bytes, when the driver can tell (CUDA ≥ 12.4).
    pub fn param_sizes(&self) -> Option<&[usize]> {
        self.params.as_deref()
    }

    /// Checks `args` against the kernel's parameter list (count and sizes) when known.
    fn check_args(&self, args: &[Arg]) -> Result<()> {
        if args.len() > MAX_ARGS {
            return Err(Error::Config(format!(
                "{}: {} arguments, at most {MAX_ARGS}",
                self.name,
                args.len()
            )));
        }
        if let Some(p) = &self.params {
            let given: Vec<usize> = args.iter().map(Arg::size).collect();
            if given[..] != p[..] {
                return Err(Error::Config(format!(
                    "{}: arguments of {given:?} bytes, the kernel takes {:?}",
                    self.name,
                    &p[..]
                )));
            }
        }
        Ok(())
    }

    /// Queues the kernel on `s` with `grid` blocks of `block` threads, `shmem` bytes of dynamic
    /// shared memory and `args` by value. The launch is asynchronous: errors inside the kernel
    /// surface at a later sync.
    pub fn launch(
        &self,
        s: &Stream,
        grid: (u32, u32, u32),
        block: (u32, u32, u32),
        shmem: u32,
        args: &[Arg],
    ) -> Result<()> {
        self.check_args(args)?;
        let mut slots = [0u64; MAX_ARGS];
        let mut ptrs = [std::ptr::null_mut::<c_void>(); MAX_ARGS];
        for (i, a) in args.iter().enumerate() {
            slots[i] = a.slot();
        }
        for (i, p) in ptrs.iter_mut().enumerate().take(args.len()) {
            *p = (&mut slots[i] as *mut u64).cast();
        }
        self.ctx.bind()?;
        let drv = self.ctx.drv;
        // SAFETY: `ptrs[i]` points at argument i's value, alive until the call returns (the
        // driver copies parameters at launch); the count/sizes were checked when known.
        let r = unsafe {
            (drv.cuLaunchKernel)(
                self.f,
                grid.0,
                grid.1,
                grid.2,
                block.0,
                block.1,
                block.2,
                shmem,
                s.raw(),
                ptrs.as_mut_ptr(),
                std::ptr::null_mut(),
            )
        };
        if r != ffi::CUDA_SUCCESS {
            return Err(Error::Cuda {
                call: "cuLaunchKernel",
                code: r,
                msg: format!(
                    "{} grid {grid:?} block {block:?} shmem {shmem}: {}",
                    self.name,
                    ffi::describe(drv, r)
                ),
            });
        }
        Ok(())
    }

    /// Lets launches use up to `bytes` of dynamic shared memory (above the 48 KiB default).
    pub fn set_max_dynamic_shmem(&self, bytes: u32) -> Result<()> {
        self.ctx.bind()?;
        let drv = self.ctx.drv;
        let v = i32::try_from(bytes)
            .map_err(|_| Error::Config(format!("{}: shmem {bytes} too large", self.name)))?;
        cu!(drv.cuFuncSetAttribute(
            self.f,
            ffi::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
            v
        ))
    }

    /// A function attribute (`CU_FUNC_ATTRIBUTE_*`), e.g. 0 = max threads per block, 4 = registers.
    pub fn attribute(&self, attr: i32) -> Result<i32> {
        self.ctx.bind()?;
        let drv = self.ctx.drv;
        let mut v = 0;
        cu!(drv.cuFuncGetAttribute(&mut v, attr, self.f))?;
        Ok(v)
    }
}

impl std::fmt::Debug for Kernel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Kernel({})", self.name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_hold_native_bytes_at_offset_zero() {
        let read4 = |s: u64| <[u8; 4]>::try_from(&s.to_ne_bytes()[..4]).unwrap();
        assert_eq!(read4(Arg::F32(1.5).slot()), 1.5f32.to_ne_bytes());
        assert_eq!(read4(Arg::I32(-7).slot()), (-7i32).to_ne_bytes());
        assert_eq!(
            read4(Arg::U32(0xdead_beef).slot()),
            0xdead_beefu32.to_ne_bytes()
        );
        assert_eq!(Arg::Ptr(0x7f00_1234_5678).slot(), 0x7f00_1234_5678);
        assert_eq!(Arg::I64(-2).slot(), u64::MAX - 1);
        assert_eq!(Arg::U32(1).size(), 4);
        assert_eq!(Arg::Ptr(1).size(), 8);
    }
}
