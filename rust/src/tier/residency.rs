//! The RAM tier: where every expert lives, and the arena that holds the resident ones.
//!
//! Modes (`ram_mode`): `mmap` reads every expert through the GGUF map (page cache); `resident`
//! copies every expert into one anonymous arena; `budget` copies the hottest experts (by
//! profile) that fit in N bytes and leaves the rest mapped. The arena is planned up front
//! (each chosen expert gets a fixed offset) and filled by `fill`; an expert's slot is published
//! (Release) only after its bytes are copied, and readers load it with Acquire, so a reader
//! sees either the map or a complete copy, never a partial one. Published copies are never
//! written again while the table lives.
//!
//! Arena record of one expert: `[gate | pad | up | pad | down | pad]`, each slab starting on a
//! 64-byte boundary.

use super::layout::{ExpertLayout, LayerSlabs};
use super::profile::{model_id, ModelId, Profile};
use super::sys;
use crate::error::{Error, Result};
use crate::gguf::Gguf;
use memmap2::MmapMut;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

const ALIGN: usize = 64;
/// Slot value of an expert that is read through the map.
const MAPPED: u64 = u64::MAX;
const GIB: f64 = (1u64 << 30) as f64;

fn align(n: usize) -> usize {
    n.div_ceil(ALIGN) * ALIGN
}

#[derive(Clone, Copy, Debug, PartialEq)]
pub enum RamMode {
    Mmap,
    Resident,
    /// Bytes of arena for the hottest experts.
    Budget(u64),
}

impl RamMode {
    /// `mmap`, `resident` or `budget` (with `budget_gib` > 0).
    pub fn parse(name: &str, budget_gib: f64) -> Result<RamMode> {
        match name {
            "mmap" => Ok(RamMode::Mmap),
            "resident" => Ok(RamMode::Resident),
            "budget" if budget_gib.is_finite() && budget_gib > 0.0 => {
                Ok(RamMode::Budget((budget_gib * GIB) as u64))
            }
            "budget" => Err(Error::Config(format!(
                "ram_budget_gib must be a finite number > 0 in budget mode (got {budget_gib})"
            ))),
            other => Err(Error::Config(format!(
                "ram_mode must be mmap, resident or budget (got {other:?})"
            ))),
        }
    }

    pub fn name(&self) -> &'static str {
        match self {
            RamMode::Mmap => "mmap",
            RamMode::Resident => "resident",
            RamMode::Budget(_) => "budget",
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Place {
    /// Read through the GGUF map (page cache, or the disk on a miss).
    Mapped,
    /// In the arena at this byte offset (the gate slab; up and down follow).
    Resident(u64),
}

/// One expert's weights: row-major slabs as stored in the GGUF (quant blocks).
#[derive(Clone, Copy, Debug)]
pub struct ExpertBytes<'a> {
    /// `[n_ff_exp rows × n_embd cols]` in the tensor's ggml type.
    pub gate: &'a [u8],
    /// `[n_ff_exp rows × n_embd cols]`.
    pub up: &'a [u8],
    /// `[n_embd rows × n_ff_exp cols]`.
    pub down: &'a [u8],
}

/// The anonymous arena. Fill threads write disjoint, planned ranges through the raw pointer;
/// readers only read ranges whose slot was published after the write.
struct Arena {
    map: MmapMut,
    ptr: *mut u8,
}

// SAFETY: the pointer is the map's own; concurrent access follows the publish protocol above.
unsafe impl Send for Arena {}
unsafe impl Sync for Arena {}

/// A counter on its own cache line (pool threads bump these).
#[repr(align(64))]
#[derive(Default)]
struct Padded(AtomicU64);

#[derive(Default)]
struct Uses {
    resident_hits: Padded,
    resident_bytes: Padded,
    mapped_hits: Padded,
    mapped_bytes: Padded,
}

/// Reads per tier since the table was built (`expert_bytes` calls).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TierUses {
    pub resident_hits: u64,
    pub resident_bytes: u64,
    pub mapped_hits: u64,
    pub mapped_bytes: u64,
}

pub struct Residency {
    gguf: Arc<Gguf>,
    layout: ExpertLayout,
    id: ModelId,
    mode: RamMode,
    arena: Option<Arena>,
    /// `[layer][expert]`: `MAPPED` or the arena offset, published after the copy.
    slots: Box<[AtomicU64]>,
    /// Arena copies still to make, hottest first: `(layer, expert, arena offset)`.
    plan: Vec<(u32, u32, u64)>,
    /// Every expert hottest first (profile order; file order without a profile).
    order: Vec<(u32, u32)>,
    warnings: Vec<String>,
    locked: bool,
    /// The shard files, for `pread` into the arena (empty without an arena).
    files: Vec<File>,
    pub(crate) filling: AtomicBool,
    uses: Uses,
}

impl Residency {
    /// Build the table for `gguf` in `mode`. A profile orders the fill and picks the budget's
    /// residents; one made for another model is refused (`Error::ProfileMismatch`). `lock`
    /// asks for the arena to be locked in RAM; where the limit refuses, a warning says how to
    /// raise it. Nothing is copied yet: `fill` does that.
    pub fn new(
        gguf: Arc<Gguf>,
        mode: RamMode,
        profile: Option<&Profile>,
        lock: bool,
    ) -> Result<Arc<Residency>> {
        let layout = ExpertLayout::from_gguf(&gguf)?;
        let id = model_id(&gguf, &layout);
        if let Some(p) = profile {
            p.check(std::path::Path::new("profile"), &id, &layout)?;
        }
        let mut warnings = Vec::new();
        let order = match profile {
            Some(p) => p
                .order()
                .into_iter()
                .filter(|&(l, _)| layout.layer(l as usize).is_some())
                .collect(),
            None => layout.all_experts(),
        };
        // Without a profile a budget takes the same share of every layer: expert 0 of every
        // layer, then expert 1, ...
        let pick_order: Vec<(u32, u32)> = match (mode, profile) {
            (RamMode::Budget(_), None) => {
                warnings.push(
                    "budget mode without a profile: each layer keeps the same share of its \
                     experts resident; a profile (`strata-fill profile`) picks the hot ones"
                        .to_string(),
                );
                let mut v = order.clone();
                v.sort_by_key(|&(l, e)| (e, l));
                v
            }
            _ => order.clone(),
        };
        let budget = match mode {
            RamMode::Mmap => 0,
            RamMode::Resident => u64::MAX,
            RamMode::Budget(b) => b,
        };
        let mut plan = Vec::new();
        let mut used: u64 = 0;
        for &(l, e) in &pick_order {
            let s = layout.layer(l as usize).expect("filtered above");
            let need = record_bytes(s) as u64;
            if used + need <= budget {
                plan.push((l, e, used));
                used += need;
            }
        }
        if let (RamMode::Resident | RamMode::Budget(_), Some(avail)) = (mode, sys::mem_available())
        {
            if used > avail {
                return Err(Error::Config(format!(
                    "ram_mode {} needs {:.2} GiB of RAM for the expert arena but only {:.2} GiB is \
                     available; use ram_mode=budget with ram_budget_gib below {:.1}, or mmap",
                    mode.name(),
                    used as f64 / GIB,
                    avail as f64 / GIB,
                    avail as f64 / GIB * 0.8
                )));
            }
        }
        let arena = if used > 0 {
            let map = MmapMut::map_anon(used as usize).map_err(|e| Error::Io {
                path: "anonymous expert arena".into(),
                source: e,
            })?;
            let mut a = Arena {
                map,
                ptr: std::ptr::null_mut(),
            };
            a.ptr = a.map.as_mut_ptr();
            sys::huge_pages(&a.map);
            Some(a)
        } else {
            None
        };
        let mut locked = false;
        if let (true, Some(a)) = (lock, &arena) {
            match sys::mlock_on_fault(&a.map) {
                Ok(()) => locked = true,
                Err(e) => warnings.push(lock_warning(used, e)),
            }
        }
        let mut files = Vec::new();
        if arena.is_some() {
            for sh in &gguf.shards {
                files.push(File::open(&sh.path).map_err(|e| Error::Io {
                    path: sh.path.clone(),
                    source: e,
                })?);
            }
        }
        let slots = (0..layout.n_layer() * layout.n_expert)
            .map(|_| AtomicU64::new(MAPPED))
            .collect();
        Ok(Arc::new(Residency {
            gguf,
            layout,
            id,
            mode,
            arena,
            slots,
            plan,
            order,
            warnings,
            locked,
            files,
            filling: AtomicBool::new(false),
            uses: Uses::default(),
        }))
    }

    pub fn layout(&self) -> &ExpertLayout {
        &self.layout
    }

    pub fn model_id(&self) -> &ModelId {
        &self.id
    }

    pub fn gguf(&self) -> &Arc<Gguf> {
        &self.gguf
    }

    pub fn mode(&self) -> RamMode {
        self.mode
    }

    pub fn warnings(&self) -> &[String] {
        &self.warnings
    }

    /// Whether the arena is locked in RAM (false without an arena).
    pub fn locked(&self) -> bool {
        self.locked
    }

    pub fn arena_bytes(&self) -> u64 {
        self.arena.as_ref().map_or(0, |a| a.map.len() as u64)
    }

    /// Every expert, hottest first (the warm order).
    pub fn order(&self) -> &[(u32, u32)] {
        &self.order
    }

    /// The arena copies, hottest first: `(layer, expert, arena offset)`.
    pub fn plan(&self) -> &[(u32, u32, u64)] {
        &self.plan
    }

    fn slot(&self, layer: usize, expert: usize) -> Option<&AtomicU64> {
        if expert >= self.layout.n_expert {
            return None;
        }
        self.slots.get(layer * self.layout.n_expert + expert)
    }

    pub fn place(&self, layer: usize, expert: usize) -> Option<Place> {
        self.layout.layer(layer)?;
        let v = self.slot(layer, expert)?.load(Ordering::Acquire);
        Some(if v == MAPPED {
            Place::Mapped
        } else {
            Place::Resident(v)
        })
    }

    /// `[layer][expert]` flattened: 1 resident, 0 mapped, 255 a layer without experts.
    pub fn table(&self) -> Vec<u8> {
        let ne = self.layout.n_expert;
        (0..self.slots.len())
            .map(|i| match self.place(i / ne, i % ne) {
                Some(Place::Resident(_)) => 1,
                Some(Place::Mapped) => 0,
                None => 255,
            })
            .collect()
    }

    /// `(experts, bytes)` resident now.
    pub fn resident(&self) -> (usize, u64) {
        let mut n = 0;
        let mut b = 0;
        for (i, s) in self.slots.iter().enumerate() {
            if s.load(Ordering::Acquire) != MAPPED {
                n += 1;
                b += self.layout.expert_bytes(i / self.layout.n_expert) as u64;
            }
        }
        (n, b)
    }

    /// Where the pool reads expert `expert` of `layer` from, wherever it lives. Call once per
    /// expert use (it counts uses per tier), not per row tile. `None` for an id out of range or
    /// a layer without experts.
    #[inline]
    pub fn expert_bytes(&self, layer: usize, expert: usize) -> Option<ExpertBytes<'_>> {
        let s = self.layout.layer(layer)?;
        let v = self.slot(layer, expert)?.load(Ordering::Acquire);
        let total = s.expert_bytes() as u64;
        if v == MAPPED {
            self.uses.mapped_hits.0.fetch_add(1, Ordering::Relaxed);
            self.uses.mapped_bytes.0.fetch_add(total, Ordering::Relaxed);
            Some(self.mapped_bytes(s, expert))
        } else {
            self.uses.resident_hits.0.fetch_add(1, Ordering::Relaxed);
            self.uses
                .resident_bytes
                .0
                .fetch_add(total, Ordering::Relaxed);
            // SAFETY: the slot was published (Release) after the record at `v` was fully
            // written, and the arena outlives `self`'s borrow.
            Some(unsafe { self.arena_record(s, v) })
        }
    }

    pub fn uses(&self) -> TierUses {
        let u = &self.uses;
        TierUses {
            resident_hits: u.resident_hits.0.load(Ordering::Relaxed),
            resident_bytes: u.resident_bytes.0.load(Ordering::Relaxed),
            mapped_hits: u.mapped_hits.0.load(Ordering::Relaxed),
            mapped_bytes: u.mapped_bytes.0.load(Ordering::Relaxed),
        }
    }

    /// The expert's slabs in the GGUF map.
    pub(crate) fn mapped_bytes(&self, s: &LayerSlabs, expert: usize) -> ExpertBytes<'_> {
        let part = |sl: &super::layout::Slab| {
            let o = sl.offset(expert);
            &self.gguf.shards[sl.shard].map[o..o + sl.bytes]
        };
        ExpertBytes {
            gate: part(&s.gate),
            up: part(&s.up),
            down: part(&s.down),
        }
    }

    /// # Safety
    /// `off` must be a planned record offset whose copy has completed.
    unsafe fn arena_record(&self, s: &LayerSlabs, off: u64) -> ExpertBytes<'_> {
        let a = self
            .arena
            .as_ref()
            .expect("a resident slot implies an arena");
        let base = a.ptr.add(off as usize);
        let g = align(s.gate.bytes);
        let u = align(s.up.bytes);
        ExpertBytes {
            gate: std::slice::from_raw_parts(base, s.gate.bytes),
            up: std::slice::from_raw_parts(base.add(g), s.up.bytes),
            down: std::slice::from_raw_parts(base.add(g + u), s.down.bytes),
        }
    }

    /// Copy one planned expert into the arena and publish it. Returns the bytes copied (0 if it
    /// was already resident). Only the fill calls this, and only one fill runs at a time.
    pub(crate) fn copy_in(&self, layer: u32, expert: u32, off: u64) -> u64 {
        let (l, e) = (layer as usize, expert as usize);
        let s = *self.layout.layer(l).expect("planned experts have slabs");
        let slot = self.slot(l, e).expect("planned experts are in range");
        if slot.load(Ordering::Acquire) != MAPPED {
            return 0;
        }
        let a = self.arena.as_ref().expect("a plan implies an arena");
        let src = self.mapped_bytes(&s, e);
        let mut at = off as usize;
        for (sl, part) in [(s.gate, src.gate), (s.up, src.up), (s.down, src.down)] {
            assert!(at + part.len() <= a.map.len(), "arena plan out of bounds");
            // SAFETY: `[at, at+len)` lies in the arena (checked above), belongs to this expert
            // alone by the plan, and is not published yet, so no reader looks at it.
            let dst = unsafe { std::slice::from_raw_parts_mut(a.ptr.add(at), part.len()) };
            // pread straight into the arena: the file's readahead, one copy, no faults on a
            // map (2x faster than copying from the map on a cold cache). The map is the
            // fallback should a read fail.
            let read = self
                .files
                .get(sl.shard)
                .map(|f| f.read_exact_at(dst, sl.offset(e) as u64));
            if !matches!(read, Some(Ok(()))) {
                dst.copy_from_slice(part);
            }
            at += align(part.len());
        }
        slot.store(off, Ordering::Release);
        s.expert_bytes() as u64
    }

    /// Fault one expert's pages of the map into the page cache (and this process's page
    /// tables). Returns the expert's bytes.
    pub fn prefault(&self, layer: u32, expert: u32) -> u64 {
        let Some(s) = self.layout.layer(layer as usize) else {
            return 0;
        };
        let b = self.mapped_bytes(s, expert as usize);
        for part in [b.gate, b.up, b.down] {
            sys::will_need(part);
        }
        for part in [b.gate, b.up, b.down] {
            sys::populate(part);
        }
        s.expert_bytes() as u64
    }

    /// Start asynchronous readahead of one mapped expert without waiting: one `madvise` per
    /// slab that has pages out of memory (`mincore` first: a `WILLNEED` over cached pages
    /// still costs ~10 µs of CPU per MB). Returns false if it is resident or out of range.
    pub fn advise(&self, layer: usize, expert: usize) -> bool {
        match (self.place(layer, expert), self.layout.layer(layer)) {
            (Some(Place::Mapped), Some(s)) => {
                let b = self.mapped_bytes(s, expert);
                for part in [b.gate, b.up, b.down] {
                    if !sys::fully_cached(part) {
                        sys::will_need(part);
                    }
                }
                true
            }
            _ => false,
        }
    }

    /// Every tensor that is not a stacked expert tensor (attention, norms, routers,
    /// embeddings, output): what every token reads. `(shard, offset, bytes)` in file order.
    pub fn dense_ranges(&self) -> Vec<(usize, usize, usize)> {
        let mut experts = Vec::new();
        for s in self.layout.layers.iter().flatten() {
            for sl in [s.gate, s.up, s.down] {
                experts.push((sl.shard, sl.base));
            }
        }
        let mut v: Vec<(usize, usize, usize)> = self
            .gguf
            .tensors()
            .iter()
            .filter(|t| !experts.contains(&(t.shard, t.offset)))
            .map(|t| (t.shard, t.offset, t.nbytes))
            .collect();
        v.sort_unstable();
        v
    }

    /// Fault the dense tensors' pages in (page cache and this map) on `threads` threads, in
    /// 4 MiB pieces. Returns the bytes.
    pub fn prefault_dense(&self, threads: usize) -> u64 {
        const PIECE: usize = 4 << 20;
        let mut pieces = Vec::new();
        for (sh, off, n) in self.dense_ranges() {
            let mut at = 0;
            while at < n {
                let len = PIECE.min(n - at);
                pieces.push((sh, off + at, len));
                at += len;
            }
        }
        let next = std::sync::atomic::AtomicUsize::new(0);
        let work = || loop {
            let i = next.fetch_add(1, Ordering::Relaxed);
            let Some(&(sh, off, len)) = pieces.get(i) else {
                return;
            };
            let part = &self.gguf.shards[sh].map[off..off + len];
            sys::will_need(part);
            sys::populate(part);
        };
        std::thread::scope(|sc| {
            for _ in 1..threads.max(1) {
                sc.spawn(work);
            }
            work();
        });
        pieces.iter().map(|p| p.2 as u64).sum()
    }

    /// Drop the page-cache pages of the mapped experts (`all`: of every expert) so their next
    /// read comes from the disk: out of this table's map (`MADV_DONTNEED`), then out of the
    /// page cache (`posix_fadvise(DONTNEED)` on their file ranges). For measurements (cold
    /// pages on a machine whose RAM holds the model); other maps of the file that hold the
    /// pages keep them cached. Returns the bytes advised.
    pub fn evict(&self, all: bool) -> Result<u64> {
        let mut files = Vec::new();
        for sh in &self.gguf.shards {
            let f = File::open(&sh.path).map_err(|e| Error::Io {
                path: sh.path.clone(),
                source: e,
            })?;
            files.push((f, matches!(*sh.map, crate::gguf::ShardBytes::Map(_))));
        }
        let mut n = 0u64;
        for (l, e) in self.layout.all_experts() {
            if !all && self.place(l as usize, e as usize) != Some(Place::Mapped) {
                continue;
            }
            let s = *self.layout.layer(l as usize).expect("listed");
            let b = self.mapped_bytes(&s, e as usize);
            for (sl, part) in [(s.gate, b.gate), (s.up, b.up), (s.down, b.down)] {
                let (f, mapped) = &files[sl.shard];
                if *mapped {
                    // SAFETY: `part` lies in the read-only map of the shard's file.
                    unsafe { sys::drop_file_map_pages(part) }.map_err(|e| Error::Io {
                        path: "madvise(MADV_DONTNEED) of the model map".into(),
                        source: e,
                    })?;
                }
                sys::evict_range(f, sl.offset(e as usize) as u64, sl.bytes as u64).map_err(
                    |e| Error::Io {
                        path: self.gguf.shards[sl.shard].path.clone(),
                        source: e,
                    },
                )?;
                n += sl.bytes as u64;
            }
        }
        Ok(n)
    }

    /// Fraction of all expert bytes in the GGUF map whose pages are in the page cache
    /// (`mincore`); the arena is not counted.
    pub fn page_cache_fraction(&self) -> f64 {
        let mut hit = 0.0;
        let mut total = 0.0;
        for (l, e) in self.layout.all_experts() {
            let s = self.layout.layer(l as usize).expect("listed");
            let b = self.mapped_bytes(s, e as usize);
            for part in [b.gate, b.up, b.down] {
                let f = sys::resident_fraction(part).unwrap_or(0.0);
                hit += f * part.len() as f64;
                total += part.len() as f64;
            }
        }
        if total == 0.0 {
            1.0
        } else {
            hit / total
        }
    }
}

/// Arena bytes of one expert record (each slab 64-byte aligned).
pub fn record_bytes(s: &LayerSlabs) -> usize {
    align(s.gate.bytes) + align(s.up.bytes) + align(s.down.bytes)
}

fn lock_warning(bytes: u64, e: std::io::Error) -> String {
    let limit = match sys::memlock_limit() {
        None => "unlimited".to_string(),
        Some(b) => format!("{:.1} MiB", b as f64 / (1u64 << 20) as f64),
    };
    format!(
        "could not lock the {:.2} GiB expert arena in RAM ({e}; RLIMIT_MEMLOCK is {limit}), so the \
         kernel may swap it out. Raise the limit with `ulimit -l unlimited` in the shell that starts \
         Strata, a `* - memlock unlimited` line in /etc/security/limits.conf, or \
         LimitMEMLOCK=infinity in a systemd unit (or --cap-add IPC_LOCK / --ulimit memlock=-1 \
         for a container)",
        bytes as f64 / GIB
    )
}
