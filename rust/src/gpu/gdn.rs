//! A hybrid family's DeltaNet layers as kernel launches (the GPU side of
//! `model::deltanet::Recurrent::mix`; kernels in cuda/deltanet.cu, the state they carry in
//! `gdn_state`).
//!
//! Legend: T = rows of the step, H = hidden, C = conv channels, Nv = value heads, S = head
//! size, Lr = recurrent layers.

use super::launch::{Launcher, Seg};
use super::weights::GpuDeltaNet;
use crate::cuda::ops::deltanet::{self as gdn, Gates};
use crate::cuda::ops::quant;
use crate::cuda::ops::quant_shared;
use crate::cuda::ops::view::Dv;
use crate::error::Result;
use crate::model::deltanet::{BetaAlpha, HeadOrder};

impl Launcher {
    /// The DeltaNet mixer of layer `dn` over the pieces `segs`: h f32 [T, H] (normed) → o
    /// f32 [T, H]; each piece continues its slot's state.
    pub(super) fn gdn_mix(&self, dn: &GpuDeltaNet, segs: &[Seg]) -> Result<()> {
        let t = super::step::rows(segs);
        let (g, s, b) = (&*self.gpu, &self.stream, &self.b);
        let st = self
            .rec
            .as_ref()
            .expect("a hybrid family's launcher has its state");
        let sp = &st.sp;
        let (c, vd, nv, hd) = (sp.conv_dim(), sp.v_dim(), sp.n_v, self.hp.n_embd);
        let eps = self.hp.rms_eps;
        let scr = b.scratch.ptr();
        let (h, o) = (Dv::of(&b.h), Dv::of(&b.o));
        let (qkv, z, ba) = (Dv::of(&st.qkv), Dv::of(&st.z), Dv::of(&st.ba));
        let (gates, core) = (Dv::of(&st.gates), Dv::of(&st.core));
        // projections of h: qkv [T, C], z [T, Nv·S], β/α (h quantized once for all)
        let (beta, alpha) = (ba.f32s(0, t * nv)?, ba.f32s(t * nv, t * nv)?);
        let mut mats = vec![
            (dn.qkv.ty, dn.qkv.ptr(), dn.qkv.rows, qkv.ptr),
            (dn.gate.ty, dn.gate.ptr(), dn.gate.rows, z.ptr),
        ];
        let gate_rows = match (&dn.ba[..], st.opts.ba) {
            ([fused], BetaAlpha::Fused) => {
                mats.push((fused.ty, fused.ptr(), fused.rows, ba.ptr));
                Gates::Fused(ba)
            }
            ([b_, a_], BetaAlpha::Split) => {
                mats.push((b_.ty, b_.ptr(), b_.rows, beta.ptr));
                mats.push((a_.ty, a_.ptr(), a_.rows, alpha.ptr));
                Gates::Split(beta, alpha)
            }
            _ => unreachable!("the loader gives one fused or two split β/α projections"),
        };
        let br = Some(&self.br);
        quant_shared::matmul_shared_x(&self.q, s, &mats, hd, h.ptr, t, scr, br, None)?;
        let (cs, ss) = sp.state_floats();
        let lr = sp.recurrent.iter().filter(|&&r| r).count();
        let (conv_off, ssm_off) = (dn.index * cs, lr * cs + dn.index * ss);
        let params = Dv::of(&b.params);
        let heads = st.heads();
        for (i, sg) in segs.iter().enumerate() {
            let x = qkv.f32s(sg.r0 * c, sg.t * c)?;
            let at = st.at(params, i, conv_off)?;
            gdn::conv(g, s, x, Dv::of(&dn.conv), at, sg.t, c, sp.d_conv)?;
        }
        let (dtb, a) = (Dv::of(&dn.dt_bias), Dv::of(&dn.a));
        gdn::prep(g, s, qkv, gate_rows, dtb, a, gates, t, heads, eps)?;
        let grouped = st.opts.heads == HeadOrder::Grouped;
        for (i, sg) in segs.iter().enumerate() {
            let x = qkv.f32s(sg.r0 * c, sg.t * c)?;
            let gr = gates.f32s(sg.r0 * 2 * nv, sg.t * 2 * nv)?;
            let co = core.f32s(sg.r0 * vd, sg.t * vd)?;
            let at = st.at(params, i, ssm_off)?;
            gdn::recur(g, s, x, gr, co, at, sg.t, heads, grouped)?;
        }
        gdn::gated_norm(g, s, core, z, Dv::of(&dn.norm), t, nv, sp.d_state, eps)?;
        let w = &dn.out;
        quant::matmul(
            &self.q,
            s,
            w.ty,
            w.ptr(),
            w.rows,
            w.cols,
            core.ptr,
            o.ptr,
            t,
            scr,
        )
    }
}
