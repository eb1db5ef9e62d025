//! The model's tensors in VRAM: every matrix's GGUF bytes uploaded once as they are in the
//! file (the GPU kernels read GGUF rows), the norm vectors as f32, and per expert tensor a
//! device table of each expert's address (what the grouped expert kernels take).
//!
//! In the hybrid mode (`gpu::hybrid`) the stacked expert tensors are not uploaded at all: the
//! expert kernels read the VRAM tier's slots through its pointer tables instead.
//!
//! Shapes in numpy order: H = hidden, V = vocab, Nh·D / Nkv·D = q / kv width, E = experts,
//! F = expert FFN width.

use crate::cuda::ops::{quant, router};
use crate::cuda::{DevBuf, Gpu};
use crate::error::{Error, Result};
use crate::gguf::TensorInfo;
use crate::model::weights::{SharedExpert, Weights};
use crate::quant::GgmlType;
use std::ops::Range;
use std::sync::Arc;

/// A 2-D weight [rows, cols] in its GGUF type.
pub struct GpuMat {
    pub name: String,
    pub ty: GgmlType,
    pub buf: Arc<DevBuf>,
    pub rows: usize,
    pub cols: usize,
}

impl GpuMat {
    pub fn ptr(&self) -> u64 {
        self.buf.ptr()
    }
}

/// A stacked expert tensor [E, rows, cols] and its table of expert addresses (u64 [E]).
pub struct Stacked {
    pub buf: DevBuf,
    pub ptrs: DevBuf,
}

/// An expert tensor's type and shape; `stacked` holds its bytes in VRAM (None in the hybrid
/// mode, where the experts live in the VRAM tier's slots).
pub struct GpuExperts {
    pub ty: GgmlType,
    pub stacked: Option<Stacked>,
    pub n_expert: usize,
    pub rows: usize,
    pub cols: usize,
}

pub struct GpuLayer {
    pub attn_norm: DevBuf, // f32 [H]
    pub wq: GpuMat,        // (Nh·D, H)
    pub wk: GpuMat,        // (Nkv·D, H)
    pub wv: GpuMat,        // (Nkv·D, H)
    pub wo: GpuMat,        // (H, Nh·D)
    /// f32 [D] each, where the graph has q/k norms.
    pub qk_norm: Option<[DevBuf; 2]>,
    /// f32 [Nh·D], [Nkv·D], [Nkv·D], where the graph has Q/K/V biases.
    pub qkv_bias: Option<[DevBuf; 3]>,
    pub ffn_norm: DevBuf, // f32 [H]
    /// The shared expert, where the graph has one (`GpuFfn`, launched by `ffn`).
    pub shared: Option<GpuFfn>,
    pub router: GpuMat, // (E, H)
    /// f32 [E]: the selection bias of the sigmoid routing (`exp_probs_b`), where it has one.
    pub sel_bias: Option<DevBuf>,
    pub gate: GpuExperts, // (E, F, H)
    pub up: GpuExperts,   // (E, F, H)
    pub down: GpuExperts, // (E, H, F)
    /// A leading dense layer's FFN (`Graph::dense_lead`): it stands for the router and the
    /// routed experts, whose entries above then hold shapes only.
    pub dense: Option<GpuFfn>,
    /// A hybrid family's recurrent layer: its DeltaNet mixer stands for the attention
    /// (whose matrices above are then empty).
    pub deltanet: Option<GpuDeltaNet>,
    /// f32 [H]: `attn_output.bias`, where the graph has it (gpt-oss).
    pub o_bias: Option<DevBuf>,
    /// f32 [Nh]: the attention sinks, where the graph has them (gpt-oss).
    pub sinks: Option<DevBuf>,
    /// f32 [E]: `ffn_gate_inp.bias`, added to the router logits (gpt-oss).
    pub router_bias: Option<DevBuf>,
    /// f32 [E, F], [E, F], [E, H]: the experts' gate, up and down biases (gpt-oss).
    pub exp_bias: Option<[DevBuf; 3]>,
}

/// A DeltaNet layer in VRAM (`model::deltanet::DeltaNetWeights`; shapes in numpy order).
pub struct GpuDeltaNet {
    /// Its index among the recurrent layers (its part of a slot's state).
    pub index: usize,
    pub qkv: GpuMat,  // (C, H)
    pub gate: GpuMat, // (Nv·S, H): z
    /// (2·Nv, H) `ssm_ba`, or [(Nv, H) `ssm_beta`, (Nv, H) `ssm_alpha`].
    pub ba: Vec<GpuMat>,
    pub out: GpuMat,     // (H, Nv·S)
    pub conv: DevBuf,    // f32 [C, Kc]
    pub dt_bias: DevBuf, // f32 [Nv]
    pub a: DevBuf,       // f32 [Nv]
    pub norm: DevBuf,    // f32 [S]
}

impl GpuLayer {
    /// Whether the layer has routed experts (not a leading dense layer).
    pub fn routed(&self) -> bool {
        self.dense.is_none()
    }
}

/// One stage's share of the model (`split.rs`): its layers, the embedding on the first stage,
/// the final norm and head on the last (one stage: every tensor).
pub struct GpuWeights {
    pub token_embd: Option<GpuMat>,  // (V, H): the first stage's
    pub output_norm: Option<DevBuf>, // f32 [H]: the last stage's
    pub output: Option<GpuMat>, // (V, H): the last stage's; shares token_embd's buffer when tied
    /// The stage's layers, `first_layer ..`.
    pub layers: Vec<GpuLayer>,
    pub first_layer: usize,
    /// Bytes uploaded (weights only).
    pub bytes: usize,
}

/// `Error::Model` naming the tensor when the GPU kernels cannot run its type.
pub fn check_type(name: &str, ty: GgmlType) -> Result<()> {
    if quant::supports(ty) {
        return Ok(());
    }
    let ok: Vec<&str> = GgmlType::ALL
        .iter()
        .filter(|t| quant::supports(**t))
        .map(|t| t.name())
        .collect();
    Err(Error::Model(format!(
        "tensor {name} has type {}, which the GPU kernels cannot run; they run: {}",
        ty.name(),
        ok.join(", ")
    )))
}

/// Checks every matrix of `w` before anything is uploaded (a refusal costs no VRAM).
pub fn check_types(w: &Weights) -> Result<()> {
    let mut all: Vec<&TensorInfo> = vec![&w.token_embd, &w.output];
    for l in &w.layers {
        all.extend([
            &l.wq, &l.wk, &l.wv, &l.wo, &l.router, &l.gate, &l.up, &l.down,
        ]);
        if let Some(sh) = &l.shared {
            all.extend([&sh.gate, &sh.up, &sh.down]);
            all.extend(&sh.gate_inp);
        }
        if let Some(dw) = &l.deltanet {
            all.extend([&dw.qkv, &dw.gate, &dw.out]);
            all.extend(&dw.ba);
        }
    }
    // a recurrent layer's absent attention projections are empty
    all.iter()
        .filter(|t| t.nbytes > 0)
        .try_for_each(|t| check_type(&t.name, t.ty))
}

struct Uploader<'a> {
    gpu: &'a Gpu,
    w: &'a Weights,
    bytes: usize,
    /// Upload the stacked expert tensors (false: hybrid mode, shapes only).
    experts: bool,
}

impl Uploader<'_> {
    fn raw(&mut self, t: &TensorInfo) -> Result<DevBuf> {
        let data = self.w.gguf.data(t);
        self.bytes += data.len();
        self.gpu.upload(data)
    }

    fn mat(&mut self, t: &TensorInfo) -> Result<GpuMat> {
        Ok(GpuMat {
            name: t.name.clone(),
            ty: t.ty,
            buf: Arc::new(self.raw(t)?),
            rows: t.dims[1] as usize,
            cols: t.dims[0] as usize,
        })
    }

    /// An expert tensor; its bytes only when `upload` and the uploader takes experts.
    fn experts(&mut self, t: &TensorInfo, upload: bool) -> Result<GpuExperts> {
        let (cols, rows, n) = (t.dims[0] as usize, t.dims[1] as usize, t.dims[2] as usize);
        if !self.experts || !upload {
            return Ok(GpuExperts {
                ty: t.ty,
                stacked: None,
                n_expert: n,
                rows,
                cols,
            });
        }
        let row_bytes = t
            .ty
            .row_bytes(cols)
            .ok_or_else(|| Error::Model(format!("tensor {}: rows are not whole blocks", t.name)))?;
        let buf = self.raw(t)?;
        let eb = (rows * row_bytes) as u64;
        let table: Vec<u64> = (0..n as u64).map(|e| buf.ptr() + e * eb).collect();
        // The expert kernels treat a misaligned expert address as absent: refuse it here.
        let align = quant::weight_align(t.ty).unwrap_or(1).max(1);
        if let Some(bad) = table.iter().position(|p| !p.is_multiple_of(align)) {
            return Err(Error::Model(format!(
                "tensor {}: expert {bad} starts at a {}-byte offset, not {align}-byte aligned \
                 as the GPU kernels for {} need",
                t.name,
                bad as u64 * eb,
                t.ty.name()
            )));
        }
        Ok(GpuExperts {
            ty: t.ty,
            stacked: Some(Stacked {
                ptrs: self.gpu.upload_pod(&table)?,
                buf,
            }),
            n_expert: n,
            rows,
            cols,
        })
    }

    fn vec(&mut self, v: &[f32]) -> Result<DevBuf> {
        self.gpu.upload_pod(v)
    }
}

impl GpuWeights {
    /// Uploads every tensor of `w` (types checked first); the stacked expert tensors only
    /// when `experts` (the hybrid mode keeps them in RAM and the VRAM tier's slots).
    pub fn upload(gpu: &Gpu, w: &Weights, experts: bool) -> Result<GpuWeights> {
        Self::upload_stage(gpu, w, experts, 0..w.layers.len())
    }

    /// One stage's tensors: the layers `layers`, the embedding when the range starts at 0,
    /// the final norm and head when it ends at the last layer.
    pub fn upload_stage(
        gpu: &Gpu,
        w: &Weights,
        experts: bool,
        layers: Range<usize>,
    ) -> Result<GpuWeights> {
        check_types(w)?;
        let (first, last) = (layers.start == 0, layers.end == w.layers.len());
        let mut u = Uploader {
            gpu,
            w,
            bytes: 0,
            experts,
        };
        let tied = w.output.name == w.token_embd.name;
        let token_embd = match first || (last && tied) {
            true => Some(u.mat(&w.token_embd)?),
            false => None,
        };
        let output = match (last, &token_embd) {
            (false, _) => None,
            (true, Some(te)) if tied => Some(GpuMat {
                name: te.name.clone(),
                ty: te.ty,
                buf: te.buf.clone(),
                rows: te.rows,
                cols: te.cols,
            }),
            (true, _) => Some(u.mat(&w.output)?),
        };
        let output_norm = last.then(|| u.vec(&w.output_norm)).transpose()?;
        let token_embd = token_embd.filter(|_| first);
        let first_layer = layers.start;
        let mut out = Vec::with_capacity(layers.len());
        for l in &w.layers[layers] {
            out.push(GpuLayer {
                attn_norm: u.vec(&l.attn_norm)?,
                wq: u.mat(&l.wq)?,
                wk: u.mat(&l.wk)?,
                wv: u.mat(&l.wv)?,
                wo: u.mat(&l.wo)?,
                qk_norm: match (&l.q_norm, &l.k_norm) {
                    (Some(qn), Some(kn)) => Some([u.vec(qn)?, u.vec(kn)?]),
                    _ => None,
                },
                qkv_bias: match &l.qkv_bias {
                    Some([bq, bk, bv]) => Some([u.vec(bq)?, u.vec(bk)?, u.vec(bv)?]),
                    None => None,
                },
                ffn_norm: u.vec(&l.ffn_norm)?,
                shared: match &l.shared {
                    Some(sh) => {
                        let mats = [u.mat(&sh.gate)?, u.mat(&sh.up)?, u.mat(&sh.down)?];
                        let gi = sh.gate_inp.as_ref().map(|g| u.mat(g)).transpose()?;
                        let scale = FfnScale::of(sh);
                        Some(GpuFfn::new(gpu, mats, gi, scale)?)
                    }
                    None => None,
                },
                router: u.mat(&l.router)?,
                sel_bias: l.exp_probs_b.as_deref().map(|b| u.vec(b)).transpose()?,
                gate: u.experts(&l.gate, !l.dense_ffn)?,
                up: u.experts(&l.up, !l.dense_ffn)?,
                down: u.experts(&l.down, !l.dense_ffn)?,
                dense: match l.dense_ffn {
                    true => {
                        let mats = [u.mat(&l.gate)?, u.mat(&l.up)?, u.mat(&l.down)?];
                        Some(GpuFfn::new(gpu, mats, None, FfnScale::One)?)
                    }
                    false => None,
                },
                deltanet: match &l.deltanet {
                    Some(dw) => Some(GpuDeltaNet {
                        index: dw.index,
                        qkv: u.mat(&dw.qkv)?,
                        gate: u.mat(&dw.gate)?,
                        ba: dw.ba.iter().map(|m| u.mat(m)).collect::<Result<_>>()?,
                        out: u.mat(&dw.out)?,
                        conv: u.vec(&dw.conv)?,
                        dt_bias: u.vec(&dw.dt_bias)?,
                        a: u.vec(&dw.a)?,
                        norm: u.vec(&dw.norm)?,
                    }),
                    None => None,
                },
                o_bias: l.o_bias.as_deref().map(|b| u.vec(b)).transpose()?,
                sinks: l.sinks.as_deref().map(|b| u.vec(b)).transpose()?,
                router_bias: l.router_bias.as_deref().map(|b| u.vec(b)).transpose()?,
                exp_bias: match &l.exp_bias {
                    Some(b) => Some([u.vec(&b.gate)?, u.vec(&b.up)?, u.vec(&b.down)?]),
                    None => None,
                },
            });
        }
        Ok(GpuWeights {
            bytes: u.bytes,
            token_embd,
            output_norm,
            output,
            layers: out,
            first_layer,
        })
    }

    /// Layer `l` (a global index inside this stage's range).
    pub fn layer(&self, l: usize) -> &GpuLayer {
        &self.layers[l - self.first_layer]
    }

    /// The embedding, the final norm, the head: an error on a stage that lacks it.
    pub fn embd(&self) -> Result<&GpuMat> {
        self.token_embd
            .as_ref()
            .ok_or_else(|| Error::Config("only the first stage holds the embedding".into()))
    }

    pub fn out_norm(&self) -> Result<&DevBuf> {
        self.output_norm
            .as_ref()
            .ok_or_else(|| Error::Config("only the last stage holds the final norm".into()))
    }

    pub fn head(&self) -> Result<&GpuMat> {
        self.output
            .as_ref()
            .ok_or_else(|| Error::Config("only the last stage holds the output head".into()))
    }
}

/// How a dense FFN's output is scaled per row (the `Shared` strategy of the family's graph).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FfnScale {
    /// Added as is (glm4moe's shared expert, a leading dense layer).
    One,
    /// × silu(g)/g of g = gate_inp·h (qwen2moe's ggml_silu then ggml_div; g = 0 gives 0.5).
    SiluOverX,
    /// × σ(g) (qwen3next, qwen35moe).
    Sigmoid,
}

impl FfnScale {
    /// The scale of a shared expert as its graph loaded it (`arch::Shared`: no gate row is
    /// `Plain`, a sigmoid one `Sigmoid`, else `Gated`).
    pub fn of(sh: &SharedExpert) -> FfnScale {
        match (&sh.gate_inp, sh.sigmoid) {
            (None, _) => FfnScale::One,
            (Some(_), true) => FfnScale::Sigmoid,
            (Some(_), false) => FfnScale::SiluOverX,
        }
    }

    /// The `router::ffn_gate` mode of a gated scale.
    pub(super) fn mode(self) -> Option<router::GateMode> {
        match self {
            FfnScale::One => None,
            FfnScale::SiluOverX => Some(router::GateMode::SiluOverX),
            FfnScale::Sigmoid => Some(router::GateMode::Sigmoid),
        }
    }
}

/// One dense SwiGLU FFN in VRAM.
pub struct GpuFfn {
    pub gate: GpuMat, // (F, H)
    pub up: GpuMat,   // (F, H)
    pub down: GpuMat, // (H, F)
    /// (1, H): the gate logit's row, where `scale` is gated.
    pub gate_inp: Option<GpuMat>,
    pub scale: FfnScale,
    /// u64 [3]: the addresses of gate, up and down (each a table of one expert).
    pub tab: DevBuf,
}

impl GpuFfn {
    /// The FFN over uploaded matrices; refuses a misaligned matrix as the expert kernels
    /// would skip it.
    pub fn new(
        gpu: &Gpu,
        [gate, up, down]: [GpuMat; 3],
        gate_inp: Option<GpuMat>,
        scale: FfnScale,
    ) -> Result<GpuFfn> {
        for m in [&gate, &up, &down] {
            let align = quant::weight_align(m.ty).unwrap_or(1).max(1);
            if !m.ptr().is_multiple_of(align) {
                return Err(Error::Model(format!(
                    "tensor {}: not {align}-byte aligned in VRAM as the GPU kernels for {} need",
                    m.name,
                    m.ty.name()
                )));
            }
        }
        if scale != FfnScale::One && gate_inp.is_none() {
            return Err(Error::Model(format!(
                "{}: a gated FFN without its gate row",
                gate.name
            )));
        }
        let tab = gpu.upload_pod(&[gate.ptr(), up.ptr(), down.ptr()])?;
        Ok(GpuFfn {
            gate,
            up,
            down,
            gate_inp,
            scale,
            tab,
        })
    }

    /// F: the FFN's width.
    pub fn width(&self) -> usize {
        self.gate.rows
    }

    pub fn mats(&self) -> impl Iterator<Item = &GpuMat> {
        [&self.gate, &self.up, &self.down]
            .into_iter()
            .chain(self.gate_inp.as_ref())
    }
}
