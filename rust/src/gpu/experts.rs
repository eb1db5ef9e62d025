//! The routed-expert tensors as the hybrid placement reaches them in RAM: per layer the
//! (gate, up, down) tensors of the GGUF mapping and one expert's shape, and the stager that
//! copies an expert's slot record from the mapping.

use crate::error::{Error, Result};
use crate::gguf::{Gguf, TensorInfo};
use crate::model::weights::Weights;
use crate::tier::vram::{ExpertShape, Key, Proj, StageBuf, Stager};
use std::sync::Arc;

/// Per layer: the (gate, up, down) expert tensors and the shape of one expert (None: a layer
/// without routed experts).
pub type ExpertTensors = Vec<Option<([TensorInfo; 3], ExpertShape)>>;

/// Host-only staging of an expert's slot record from the GGUF mapping (RAM). Runs on the
/// async tier's helper thread: it never calls the device.
pub struct GgufStager<B> {
    gguf: Arc<Gguf>,
    layers: ExpertTensors,
    _buf: std::marker::PhantomData<fn() -> B>,
}

impl<B> GgufStager<B> {
    pub fn new(gguf: Arc<Gguf>, layers: ExpertTensors) -> Self {
        GgufStager {
            gguf,
            layers,
            _buf: std::marker::PhantomData,
        }
    }
}

impl<B: StageBuf> Stager for GgufStager<B> {
    type Buf = B;

    fn stage(&mut self, (l, e): Key, buf: &mut B) -> Result<u64> {
        let (ts, shape) = self
            .layers
            .get(l as usize)
            .and_then(Option::as_ref)
            .ok_or_else(|| Error::Config(format!("layer {l} has no experts")))?;
        let dst = buf.bytes_mut();
        if (dst.len() as u64) < shape.record_bytes() {
            return Err(Error::Config(format!(
                "staging buffer of {} bytes for a record of {}",
                dst.len(),
                shape.record_bytes()
            )));
        }
        for (t, p) in ts.iter().zip(Proj::ALL) {
            let eb = shape.bytes(p) as usize;
            let src = self.gguf.data(t);
            let part = src
                .get(e as usize * eb..(e as usize + 1) * eb)
                .ok_or_else(|| Error::Config(format!("expert ({l}, {e}) is out of range")))?;
            let o = shape.offset(p) as usize;
            dst[o..o + eb].copy_from_slice(part);
        }
        Ok(shape.expert_bytes())
    }
}

fn expert_shape(ts: &[&TensorInfo; 3]) -> Result<ExpertShape> {
    let one = |t: &TensorInfo| -> Result<u64> {
        let n = t.dims.get(2).copied().unwrap_or(1).max(1) as usize;
        if !t.nbytes.is_multiple_of(n) {
            return Err(Error::Model(format!(
                "tensor {}: {} bytes are not {n} equal experts",
                t.name, t.nbytes
            )));
        }
        Ok((t.nbytes / n) as u64)
    };
    Ok(ExpertShape {
        gate: one(ts[0])?,
        up: one(ts[1])?,
        down: one(ts[2])?,
    })
}

/// Per-layer expert shapes of `w` (None: a leading dense layer, without routed experts).
pub fn shapes(w: &Weights) -> Result<Vec<Option<ExpertShape>>> {
    w.layers
        .iter()
        .map(|l| match l.dense_ffn {
            true => Ok(None),
            false => expert_shape(&[&l.gate, &l.up, &l.down]).map(Some),
        })
        .collect()
}

/// Per layer: the expert tensors and one expert's shape (None: no routed experts).
pub(super) fn layers_of(w: &Weights, shapes: &[Option<ExpertShape>]) -> ExpertTensors {
    w.layers
        .iter()
        .zip(shapes)
        .map(|(l, s)| s.map(|s| ([l.gate.clone(), l.up.clone(), l.down.clone()], s)))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tier::residency::{RamMode, Residency};
    use crate::tier::vram::{plan, shapes_of, BudgetInputs, RamStager};

    /// The GGUF stager writes the same slot record as the RAM tier's stager (whose expert
    /// slices come from the tier's own layout; the test model's slabs hold patterns naming
    /// layer, tensor and expert, so a wrong slice shows).
    #[test]
    fn gguf_stager_writes_the_ram_stagers_record() {
        let path = crate::tier::tests::write_model("hybrid-stage", 3, 4, &[1], 0);
        let g = Arc::new(Gguf::open(&path).unwrap());
        let ram = Residency::new(g.clone(), RamMode::Mmap, None, false).unwrap();
        let shapes = shapes_of(ram.layout());
        let p = plan(&BudgetInputs {
            free_bytes: 1 << 30,
            reserve_mib: 0,
            budget_mib: None,
            dense_bytes: 0,
            kv_bytes: 0,
            buffer_bytes: 0,
            n_expert: 4,
            layers: shapes.clone(),
        })
        .unwrap();
        let layers: ExpertTensors = (0..3)
            .map(|l| {
                let t = |w: &str| g.tensor(&format!("blk.{l}.ffn_{w}_exps.weight")).cloned();
                let ts = [t("gate")?, t("up")?, t("down")?];
                let sh = expert_shape(&[&ts[0], &ts[1], &ts[2]]).unwrap();
                Some((ts, sh))
            })
            .collect();
        assert!(layers[1].is_none() && layers[0].is_some() && layers[2].is_some());
        for (l, s) in layers.iter().enumerate() {
            assert_eq!(s.as_ref().map(|s| s.1), shapes[l], "layer {l} shape");
        }
        let mut ours: GgufStager<Vec<u8>> = GgufStager::new(g.clone(), layers);
        let mut theirs: RamStager<Vec<u8>> = RamStager::new(ram.clone(), &p);
        let n = p.slot_bytes as usize;
        for key in [(0u32, 0u32), (0, 3), (2, 1), (2, 3)] {
            let (mut a, mut b) = (vec![0u8; n], vec![0u8; n]);
            assert_eq!(
                ours.stage(key, &mut a).unwrap(),
                theirs.stage(key, &mut b).unwrap()
            );
            assert_eq!(a, b, "{key:?}");
        }
        assert!(
            ours.stage((1, 0), &mut vec![0u8; n]).is_err(),
            "dense layer"
        );
        assert!(
            ours.stage((0, 4), &mut vec![0u8; n]).is_err(),
            "expert out of range"
        );
        assert!(
            ours.stage((0, 0), &mut vec![0u8; 16]).is_err(),
            "small buffer"
        );
        let _ = std::fs::remove_file(path);
    }
}
