//! The pool's per-call path allocates nothing once its scratch has grown: a counting global
//! allocator sees zero allocations (on any thread) across repeated MoE and dense calls.
//! Built with `harness = false` (rust/Cargo.toml): the process runs only this check, so no
//! test-harness thread allocates inside the measured window.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};
use strata_core::pool::{ExpertLayer, MoeInput, Pool, PoolConfig, QExperts, QMatrix};
use strata_core::quant::GgmlType;

struct Counting;

static ALLOCS: AtomicUsize = AtomicUsize::new(0);

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        ALLOCS.fetch_add(1, Ordering::Relaxed);
        System.alloc(l)
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        System.dealloc(p, l)
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, n: usize) -> *mut u8 {
        ALLOCS.fetch_add(1, Ordering::Relaxed);
        System.realloc(p, l, n)
    }
}

#[global_allocator]
static A: Counting = Counting;

fn main() {
    calls_after_the_first_allocate_nothing();
    println!("pool_no_alloc: ok (no allocation on the per-call path)");
}

fn calls_after_the_first_allocate_nothing() {
    let (e, h, i) = (16usize, 64usize, 32usize);
    // Q8_0 blocks with a fixed scale and varied quants.
    let block = |n: usize| -> Vec<u8> {
        (0..n)
            .flat_map(|b| {
                let mut v = vec![0x00, 0x1c]; // f16 0.0039
                v.extend((0..32).map(|j| ((b * 7 + j * 13) % 251) as u8));
                v
            })
            .collect()
    };
    let gate = block(e * i * h / 32);
    let up = block(e * i * h / 32);
    let down = block(e * h * i / 32);
    let m = |d: &'static [u8], rows, cols| QExperts {
        ty: GgmlType::Q8_0,
        data: d,
        n_expert: e,
        rows,
        cols,
        slabs: None,
    };
    let (gate, up, down): (&'static [u8], &'static [u8], &'static [u8]) = (
        Box::leak(gate.into_boxed_slice()),
        Box::leak(up.into_boxed_slice()),
        Box::leak(down.into_boxed_slice()),
    );
    let layer = ExpertLayer {
        gate: m(gate, i, h),
        up: m(up, i, h),
        down: m(down, h, i),
    };
    for pipelined in [false, true] {
        let pool = Pool::new(PoolConfig {
            workers: 2,
            host_participates: true,
            pipelined,
            pin: false,
            spin_us: 100,
            balanced: true,
        });
        pool.reserve(4, 4, h, i, e);
        let x = vec![0.5f32; 4 * h];
        let ids: Vec<u32> = (0..16).map(|n| (n * 5 % 16) as u32).collect();
        let w = [0.25f32; 16];
        let mut y = vec![0f32; 4 * h];
        let wm = QMatrix {
            ty: GgmlType::Q8_0,
            data: &gate[..i * h / 32 * 34],
            rows: i,
            cols: h,
        };
        let mut yd = vec![0f32; 4 * i];
        let before = ALLOCS.load(Ordering::SeqCst);
        for round in 0..50 {
            let t = 1 + round % 4;
            pool.moe(
                &layer,
                &MoeInput::new(&x[..t * h], &ids[..t * 4], &w[..t * 4], 4),
                &mut y[..t * h],
            )
            .unwrap();
            pool.matmul(&wm, &x[..t * h], t, &mut yd[..t * i]).unwrap();
            // Let the workers park now and then, so wake-ups are on the measured path too.
            if round % 10 == 0 {
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
        }
        let after = ALLOCS.load(Ordering::SeqCst);
        assert_eq!(after - before, 0, "allocations on the per-call path");
    }
}
