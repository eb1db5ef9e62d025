//! Host → device copies from pageable memory (the GGUF mapping) at PCIe speed: CPU threads
//! ("lanes") copy pieces of the source into page-locked bounce buffers and queue a DMA of each
//! piece from there. A `cuMemcpyHtoDAsync` from pageable memory makes the driver stage the
//! bytes itself, blocks the calling thread and runs far below the link's speed; from
//! page-locked memory it returns at once and the DMA engine runs at full speed.
//!
//! Protocol, per lane with `B` ≥ 2 buffers: piece j of the lane goes through buffer `j % B`:
//!   1. wait on the buffer's fence (its previous DMA has read it),
//!   2. memcpy the piece from the source into the buffer,
//!   3. queue the DMA buffer → destination on the copy stream, then record the buffer's fence.
//!
//! So piece j's DMA runs while piece j+1 is being filled (and the other lanes' pieces). A lane
//! only ever waits for its own earlier DMAs; the caller records its own "copied" event on the
//! copy stream after `copy_pieces` returns (every DMA of the call is queued by then).
//!
//! The pipeline is generic over `Dma` so its host side is tested without a device.

use crate::error::Result;
use crate::tier::vram::StageBuf;

/// Bytes of one bounce buffer (one piece).
pub const PIECE_BYTES: usize = 4 << 20;
/// Bounce buffers per lane.
pub const BUFS_PER_LANE: usize = 2;
/// Most lanes (threads) used when `stream_threads` is 0.
pub const MAX_AUTO_LANES: usize = 8;

/// `stream_threads` (0: one per core, at most `MAX_AUTO_LANES`).
pub fn lanes_for(threads: usize) -> usize {
    if threads > 0 {
        return threads;
    }
    std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .clamp(1, MAX_AUTO_LANES)
}

/// One piece: `src` goes to byte `dst` of the destination.
#[derive(Clone, Copy, Debug)]
pub struct Piece<'a> {
    pub src: &'a [u8],
    pub dst: u64,
}

/// Cut `src` → `dst` into pieces of at most `max` bytes, appended to `out`.
pub fn cut<'a>(src: &'a [u8], dst: u64, max: usize, out: &mut Vec<Piece<'a>>) {
    let max = max.max(1);
    for (i, c) in src.chunks(max).enumerate() {
        out.push(Piece {
            src: c,
            dst: dst + (i * max) as u64,
        });
    }
}

/// The device side of the pipeline.
pub trait Dma: Sync {
    type Buf: StageBuf;
    type Fence: Send;
    /// Wait until the DMA last queued behind `f` has read its buffer (at once if none).
    fn wait(&self, f: &Self::Fence) -> Result<()>;
    /// Queue the copy of `buf[..len]` to destination byte `dst`, then record `f` after it.
    fn issue(&self, buf: &Self::Buf, len: usize, dst: u64, f: &Self::Fence) -> Result<()>;
}

/// One lane's bounce buffers and their fences.
pub struct Lane<B, F> {
    pub bufs: Vec<B>,
    pub fences: Vec<F>,
}

fn run_lane<'p, D: Dma>(
    d: &D,
    lane: &mut Lane<D::Buf, D::Fence>,
    pieces: impl Iterator<Item = Piece<'p>>,
) -> Result<()> {
    let nb = lane.bufs.len();
    for (j, p) in pieces.enumerate() {
        let b = j % nb;
        d.wait(&lane.fences[b])?;
        let buf = &mut lane.bufs[b];
        buf.bytes_mut()[..p.src.len()].copy_from_slice(p.src);
        d.issue(buf, p.src.len(), p.dst, &lane.fences[b])?;
    }
    Ok(())
}

/// Queue every piece through the lanes (piece i on lane i % lanes; one thread per lane when
/// there are several). Returns the bytes queued; every DMA is queued when it returns.
pub fn copy_pieces<D: Dma>(
    d: &D,
    lanes: &mut [Lane<D::Buf, D::Fence>],
    pieces: &[Piece<'_>],
) -> Result<u64> {
    let bytes = pieces.iter().map(|p| p.src.len() as u64).sum();
    let n = lanes.len().min(pieces.len());
    if n == 0 {
        return Ok(bytes);
    }
    if n == 1 {
        run_lane(d, &mut lanes[0], pieces.iter().copied())?;
        return Ok(bytes);
    }
    std::thread::scope(|sc| {
        let hs: Vec<_> = lanes[..n]
            .iter_mut()
            .enumerate()
            .map(|(i, lane)| {
                sc.spawn(move || run_lane(d, lane, pieces.iter().skip(i).step_by(n).copied()))
            })
            .collect();
        let mut r = Ok(());
        for h in hs {
            let x = h.join().unwrap_or_else(|_| {
                Err(crate::error::Error::Model(
                    "a bounce copy thread panicked".into(),
                ))
            });
            if r.is_ok() {
                r = x;
            }
        }
        r
    })?;
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
    use std::sync::Mutex;

    /// A device that copies at `issue` and checks the protocol: a buffer is never refilled
    /// before its fence was waited on after its last DMA.
    struct Fake {
        dst: Mutex<Vec<u8>>,
        issued: AtomicUsize,
    }

    /// (DMAs behind the fence, DMAs waited for).
    struct Fence(Mutex<(usize, usize)>);

    impl Dma for Fake {
        type Buf = Vec<u8>;
        type Fence = Fence;
        fn wait(&self, f: &Fence) -> Result<()> {
            let mut g = f.0.lock().unwrap();
            g.1 = g.0;
            Ok(())
        }
        fn issue(&self, buf: &Vec<u8>, len: usize, dst: u64, f: &Fence) -> Result<()> {
            let mut g = f.0.lock().unwrap();
            assert_eq!(g.0, g.1, "buffer refilled before its fence was waited on");
            g.0 += 1;
            let d = dst as usize;
            self.dst.lock().unwrap()[d..d + len].copy_from_slice(&buf[..len]);
            self.issued.fetch_add(1, SeqCst);
            Ok(())
        }
    }

    fn lanes(n: usize, piece: usize) -> Vec<Lane<Vec<u8>, Fence>> {
        (0..n)
            .map(|_| Lane {
                bufs: (0..BUFS_PER_LANE).map(|_| vec![0u8; piece]).collect(),
                fences: (0..BUFS_PER_LANE)
                    .map(|_| Fence(Mutex::new((0, 0))))
                    .collect(),
            })
            .collect()
    }

    #[test]
    fn pieces_land_where_they_belong() {
        // source: two runs (as two projections' runs of missing experts), gaps between
        let src: Vec<u8> = (0..10_000u32).map(|i| (i * 7 + i / 251) as u8).collect();
        for (n_lanes, piece) in [(1, 1000), (3, 777), (4, 4096), (8, 1)] {
            let mut ps = Vec::new();
            cut(&src[100..5100], 0, piece, &mut ps);
            cut(&src[6000..9999], 6000, piece, &mut ps);
            assert_eq!(
                ps.len(),
                5000usize.div_ceil(piece) + 3999usize.div_ceil(piece)
            );
            let d = Fake {
                dst: Mutex::new(vec![0u8; 10_000]),
                issued: AtomicUsize::new(0),
            };
            let mut ls = lanes(n_lanes, piece);
            let bytes = copy_pieces(&d, &mut ls, &ps).unwrap();
            assert_eq!(bytes, 5000 + 3999);
            assert_eq!(d.issued.load(SeqCst), ps.len());
            let out = d.dst.into_inner().unwrap();
            assert_eq!(
                &out[..5000],
                &src[100..5100],
                "lanes {n_lanes} piece {piece}"
            );
            assert!(out[5000..6000].iter().all(|&b| b == 0));
            assert_eq!(&out[6000..9999], &src[6000..9999]);
        }
    }

    #[test]
    fn no_pieces_and_errors() {
        let d = Fake {
            dst: Mutex::new(vec![]),
            issued: AtomicUsize::new(0),
        };
        assert_eq!(copy_pieces(&d, &mut lanes(2, 8), &[]).unwrap(), 0);
        assert_eq!(lanes_for(3), 3);
        assert!((1..=MAX_AUTO_LANES).contains(&lanes_for(0)));
    }
}
