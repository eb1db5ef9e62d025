//! Expert hotness profiles on disk, and the model fingerprint that ties a profile to a model.
//!
//! Format (version 1): a small little-endian binary file, chosen over JSON because the reader
//! needs no parser dependency, every size is checked against hard caps before anything is
//! reserved (as the GGUF reader does), and counts round-trip bit-exactly. `strata-fill show`
//! is the human view.
//!
//! ```text
//! off  size  field
//!   0     8  magic "STRPROF\0"
//!   8     4  version u32 (1)
//!  12     4  n_layer u32
//!  16     4  n_expert u32
//!  20     4  reserved u32 (0)
//!  24     8  model fingerprint u64
//!  32     8  tokens run u64
//!  40     4  model description length u32 (≤ 4096)
//!  44     4  source description length u32 (≤ 4096)
//!  48     …  model description UTF-8, then source description UTF-8
//!   …  4·L·E  counts f32 [layer][expert]
//!   …     8  FNV-1a 64 of every byte before it
//! ```

use super::layout::ExpertLayout;
use crate::error::{Error, Result};
use crate::gguf::Gguf;
use std::fmt::Write as _;
use std::path::Path;

pub const MAGIC: &[u8; 8] = b"STRPROF\0";
pub const VERSION: u32 = 1;
pub const MAX_LAYERS: u32 = 4096;
pub const MAX_EXPERTS: u32 = 65536;
pub const MAX_CELLS: u64 = 1 << 24;
pub const MAX_TEXT: u32 = 4096;
const HEADER: usize = 48;

/// FNV-1a, 64-bit: stable across builds and platforms (unlike std's hasher).
pub fn fnv1a64(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in bytes {
        h ^= b as u64;
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

/// What a model is, for the fingerprint and for error messages.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ModelId {
    pub fingerprint: u64,
    /// e.g. `qwen3moe, 48 layers × 128 experts, 17.28 GB (Qwen3-30B-A3B-Q4_K_M.gguf)`.
    pub description: String,
}

/// Bytes of each router (`ffn_gate_inp`) hashed into the fingerprint: two models with the
/// same layout but other weights (a fine-tune) route differently.
pub const ROUTER_SAMPLE: usize = 4096;

/// The fingerprint hashes the architecture, the layer and expert counts, the total size of
/// the file(s), for every stacked expert tensor its name, type, dims, shard and offset
/// (anything that moves an expert's bytes or changes what they mean), and the first
/// `ROUTER_SAMPLE` bytes of every layer's router.
pub fn model_id(g: &Gguf, layout: &ExpertLayout) -> ModelId {
    let file_bytes: u64 = g.shards.iter().map(|s| s.map.len() as u64).sum();
    let mut s = String::new();
    let _ = writeln!(s, "strata-fingerprint-v1");
    let _ = writeln!(
        s,
        "{} {} {} {}",
        layout.arch,
        layout.n_layer(),
        layout.n_expert,
        file_bytes
    );
    for i in 0..layout.n_layer() {
        for part in ["gate", "up", "down"] {
            let name = format!("blk.{i}.ffn_{part}_exps.weight");
            if let Some(t) = g.tensor(&name) {
                let _ = writeln!(
                    s,
                    "{name} {} {:?} {} {}",
                    t.ty.name(),
                    t.dims,
                    t.shard,
                    t.offset
                );
            }
        }
        if let Some(t) = g.tensor(&format!("blk.{i}.ffn_gate_inp.weight")) {
            let _ = writeln!(s, "router {i} {:016x}", fnv1a64(&router_sample(g, t)));
        }
    }
    let file = g
        .path()
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    ModelId {
        fingerprint: fnv1a64(s.as_bytes()),
        description: format!(
            "{}, {} layers × {} experts, {:.2} GB ({file})",
            layout.arch,
            layout.n_layer(),
            layout.n_expert,
            file_bytes as f64 / 1e9
        ),
    }
}

/// The first `ROUTER_SAMPLE` bytes of a router. Read with `pread` rather than through the map:
/// a fault on a cold map reads the whole readahead window around it (8 MiB with a large
/// `read_ahead_kb`) for each of the model's layers.
fn router_sample(g: &Gguf, t: &crate::gguf::TensorInfo) -> Vec<u8> {
    use std::os::unix::fs::FileExt;
    let n = t.nbytes.min(ROUTER_SAMPLE);
    let mut buf = vec![0u8; n];
    let read = std::fs::File::open(&g.shards[t.shard].path)
        .and_then(|f| f.read_exact_at(&mut buf, t.offset as u64));
    if read.is_err() {
        buf.copy_from_slice(&g.data(t)[..n]);
    }
    buf
}

#[derive(Clone, Debug, PartialEq)]
pub struct Profile {
    pub fingerprint: u64,
    pub model: String,
    pub source: String,
    pub n_layer: usize,
    pub n_expert: usize,
    /// Tokens the profile run pushed through the model.
    pub tokens: u64,
    /// `[layer][expert]` routing counts, flattened.
    pub counts: Vec<f32>,
}

fn perr(path: &Path, msg: impl std::fmt::Display) -> Error {
    Error::Profile(format!("{}: {msg}", path.display()))
}

impl Profile {
    pub fn new(
        id: &ModelId,
        n_layer: usize,
        n_expert: usize,
        tokens: u64,
        source: &str,
        counts: Vec<f32>,
    ) -> Result<Profile> {
        let p = Profile {
            fingerprint: id.fingerprint,
            model: id.description.clone(),
            source: source.to_string(),
            n_layer,
            n_expert,
            tokens,
            counts,
        };
        p.validate().map_err(Error::Profile)?;
        Ok(p)
    }

    fn validate(&self) -> std::result::Result<(), String> {
        if self.n_layer == 0 || self.n_layer > MAX_LAYERS as usize {
            return Err(format!("n_layer {} not in 1..={MAX_LAYERS}", self.n_layer));
        }
        if self.n_expert == 0 || self.n_expert > MAX_EXPERTS as usize {
            return Err(format!(
                "n_expert {} not in 1..={MAX_EXPERTS}",
                self.n_expert
            ));
        }
        if self.counts.len() != self.n_layer * self.n_expert {
            return Err(format!(
                "{} counts for {} layers × {} experts",
                self.counts.len(),
                self.n_layer,
                self.n_expert
            ));
        }
        if let Some(i) = self.counts.iter().position(|c| !c.is_finite() || *c < 0.0) {
            return Err(format!(
                "count of layer {} expert {} is {} (must be finite and >= 0)",
                i / self.n_expert,
                i % self.n_expert,
                self.counts[i]
            ));
        }
        for (what, s) in [("model", &self.model), ("source", &self.source)] {
            if s.len() > MAX_TEXT as usize {
                return Err(format!("{what} description longer than {MAX_TEXT} bytes"));
            }
        }
        Ok(())
    }

    pub fn count(&self, layer: usize, expert: usize) -> f32 {
        self.counts[layer * self.n_expert + expert]
    }

    pub fn to_bytes(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(HEADER + self.counts.len() * 4 + 8);
        b.extend_from_slice(MAGIC);
        b.extend_from_slice(&VERSION.to_le_bytes());
        b.extend_from_slice(&(self.n_layer as u32).to_le_bytes());
        b.extend_from_slice(&(self.n_expert as u32).to_le_bytes());
        b.extend_from_slice(&0u32.to_le_bytes());
        b.extend_from_slice(&self.fingerprint.to_le_bytes());
        b.extend_from_slice(&self.tokens.to_le_bytes());
        b.extend_from_slice(&(self.model.len() as u32).to_le_bytes());
        b.extend_from_slice(&(self.source.len() as u32).to_le_bytes());
        b.extend_from_slice(self.model.as_bytes());
        b.extend_from_slice(self.source.as_bytes());
        for c in &self.counts {
            b.extend_from_slice(&c.to_le_bytes());
        }
        let sum = fnv1a64(&b);
        b.extend_from_slice(&sum.to_le_bytes());
        b
    }

    pub fn from_bytes(path: &Path, b: &[u8]) -> Result<Profile> {
        let u32_at = |o: usize| u32::from_le_bytes(b[o..o + 4].try_into().unwrap());
        let u64_at = |o: usize| u64::from_le_bytes(b[o..o + 8].try_into().unwrap());
        if b.len() < 8 || &b[..8] != MAGIC {
            return Err(perr(path, "not a Strata profile (bad magic)"));
        }
        if b.len() < HEADER + 8 {
            return Err(perr(path, format!("truncated: {} bytes", b.len())));
        }
        let version = u32_at(8);
        if version != VERSION {
            return Err(perr(
                path,
                format!("profile version {version}; this build reads version {VERSION}"),
            ));
        }
        let (nl, ne) = (u32_at(12), u32_at(16));
        if nl == 0 || nl > MAX_LAYERS || ne == 0 || ne > MAX_EXPERTS {
            return Err(perr(
                path,
                format!("{nl} layers × {ne} experts is implausible"),
            ));
        }
        let cells = nl as u64 * ne as u64;
        if cells > MAX_CELLS {
            return Err(perr(
                path,
                format!("{cells} counts exceed the cap {MAX_CELLS}"),
            ));
        }
        let (lm, ls) = (u32_at(40), u32_at(44));
        if lm > MAX_TEXT || ls > MAX_TEXT {
            return Err(perr(path, "description longer than 4096 bytes"));
        }
        let want = HEADER as u64 + lm as u64 + ls as u64 + 4 * cells + 8;
        if b.len() as u64 != want {
            return Err(perr(
                path,
                format!(
                    "{} bytes, expected {want} for {nl} layers × {ne} experts",
                    b.len()
                ),
            ));
        }
        let body = b.len() - 8;
        if fnv1a64(&b[..body]) != u64_at(body) {
            return Err(perr(path, "checksum mismatch (corrupt file)"));
        }
        let text = |o: usize, n: usize, what: &str| {
            std::str::from_utf8(&b[o..o + n])
                .map(str::to_string)
                .map_err(|_| perr(path, format!("{what} description is not UTF-8")))
        };
        let model = text(HEADER, lm as usize, "model")?;
        let source = text(HEADER + lm as usize, ls as usize, "source")?;
        let c0 = HEADER + lm as usize + ls as usize;
        let counts = b[c0..body]
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
            .collect();
        let p = Profile {
            fingerprint: u64_at(24),
            model,
            source,
            n_layer: nl as usize,
            n_expert: ne as usize,
            tokens: u64_at(32),
            counts,
        };
        p.validate().map_err(|m| perr(path, m))?;
        Ok(p)
    }

    /// Write through a temporary file renamed into place.
    pub fn save(&self, path: &Path) -> Result<()> {
        let io = |e| Error::Io {
            path: path.to_path_buf(),
            source: e,
        };
        let tmp = path.with_extension(format!("tmp.{}", std::process::id()));
        std::fs::write(&tmp, self.to_bytes()).map_err(io)?;
        std::fs::rename(&tmp, path).map_err(|e| {
            let _ = std::fs::remove_file(&tmp);
            io(e)
        })
    }

    pub fn load(path: &Path) -> Result<Profile> {
        let meta = std::fs::metadata(path).map_err(|e| Error::Io {
            path: path.to_path_buf(),
            source: e,
        })?;
        let cap = HEADER as u64 + 2 * MAX_TEXT as u64 + 4 * MAX_CELLS + 8;
        if meta.len() > cap {
            return Err(perr(
                path,
                format!("{} bytes is too large for a profile", meta.len()),
            ));
        }
        let b = std::fs::read(path).map_err(|e| Error::Io {
            path: path.to_path_buf(),
            source: e,
        })?;
        Self::from_bytes(path, &b)
    }

    /// Refuse a profile made for another model.
    pub fn check(&self, path: &Path, id: &ModelId, layout: &ExpertLayout) -> Result<()> {
        let shape_ok = self.n_layer == layout.n_layer() && self.n_expert == layout.n_expert;
        if self.fingerprint != id.fingerprint || !shape_ok {
            return Err(Error::ProfileMismatch(format!(
                "{}: this profile was made for another model: {} [fingerprint {:016x}, {} layers × {} experts]; \
                 the model is {} [fingerprint {:016x}]. Make one for this model with \
                 `strata-fill profile --model MODEL -o PROFILE`",
                path.display(),
                self.model,
                self.fingerprint,
                self.n_layer,
                self.n_expert,
                id.description,
                id.fingerprint
            )));
        }
        Ok(())
    }

    /// Every (layer, expert) hottest first; ties in layer-major file order.
    pub fn order(&self) -> Vec<(u32, u32)> {
        let mut v: Vec<(u32, u32)> = (0..self.n_layer as u32)
            .flat_map(|l| (0..self.n_expert as u32).map(move |e| (l, e)))
            .collect();
        v.sort_by(|a, b| {
            let ca = self.count(a.0 as usize, a.1 as usize);
            let cb = self.count(b.0 as usize, b.1 as usize);
            cb.total_cmp(&ca).then(a.cmp(b))
        });
        v
    }
}
