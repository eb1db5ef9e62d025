#!/usr/bin/env python3
"""Trains a small qwen35moe with its MTP layer on the default model's corpus, for issue 18's
MTP speedup measurement (bench/bench_spec.py mtp), and converts it with llama.cpp's own
converter.

The trunk is transformers' Qwen3_5MoeForCausalLM; transformers has no module for the MTP
layer (it drops `mtp.*` on load), so it is built here from transformers' own blocks the way
the released checkpoints name it and llama.cpp's `DECODER_MTP` graph runs it: at position p
the pair (x_p, h_{p-1}) — x_p's embedding and the trunk's hidden state at p - 1 after its
output norm, h_{-1} = 0 — goes through `mtp.fc` (H, 2H) over
[pre_fc_norm_embedding(e) ; pre_fc_norm_hidden(h)], one full-attention MoE decoder layer
(`mtp.layers.0.*`), `mtp.norm` and the shared head: the logits of x_{p+1}. Trained jointly:
loss = trunk CE + MTP_WEIGHT · MTP CE (+ the router's load-balancing loss), as DeepSeek-V3
and Qwen3-Next train theirs (the MTP loss reaches the trunk through h).

  1. here:    python scripts/train_default_model.py prepare --out .dev/train/data
              (the default model's data: corpus, tokenizer, token ids), and llama.cpp's
              converter beside it: cp -r LLAMA_CPP/{convert_hf_to_gguf.py,conversion,gguf-py}
              .dev/train/llama/
  2. device:  python3 scripts/train_mtp_model.py train --data .dev/train/data
              --llama-cpp .dev/train/llama --out $OUT [--budget-s 420]
              (carry [".dev/train"]): trains for the budget, keeps the best held-out weights,
              writes the F16 GGUF in pieces of < 16 MiB (mtp-f16.gguf.part0, ...: the
              device's output folder takes files of at most 16 MiB) and mtp.meta.npz: the
              training log and PyTorch's float32 logits of the float16-rounded weights (trunk
              and MTP rows) on held-out prompts — the float oracle of `check`.
  3. here:    python scripts/train_mtp_model.py join --pieces DIR --out FILE.gguf
              python scripts/train_mtp_model.py check --gguf FILE.gguf --meta DIR/mtp.meta.npz
              then llama-quantize FILE.gguf Q8_0 for the benchmark.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import train_default_model as tdm  # the data, batches, optimizer, checkpoints

MTP_WEIGHT = 0.5
LR = 2e-3
PIECE = 15 * 1024 * 1024
# hidden 256, 4 layers (3 Gated DeltaNet + 1 gated full attention), 32 experts top-4 of width
# 128 and a shared expert of 256 (the default model's widths), heads of 64 with a quarter
# rotated (M-RoPE sections over the 8 rotated pairs: text positions are equal in each).
CONFIG: dict[str, Any] = dict(
    vocab_size=tdm.N_VOCAB,
    hidden_size=256,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=64,
    full_attention_interval=4,
    num_experts=32,
    num_experts_per_tok=4,
    moe_intermediate_size=128,
    shared_expert_intermediate_size=256,
    linear_conv_kernel_dim=4,
    linear_key_head_dim=64,
    linear_value_head_dim=64,
    linear_num_key_heads=2,
    linear_num_value_heads=4,
    rms_norm_eps=1e-6,
    max_position_embeddings=4096,
    tie_word_embeddings=False,
    router_aux_loss_coef=0.01,
    rope_parameters={
        "rope_type": "default",
        "rope_theta": 1e6,
        "partial_rotary_factor": 0.25,
        "mrope_section": [3, 3, 2],
        "mrope_interleaved": True,
    },
)


def build(seed: int = tdm.SEED) -> Any:
    """(trunk, MTP) as one torch module: `.lm` is Qwen3_5MoeForCausalLM, `.mtp` the MTP
    layer with the released checkpoints' names (fc, pre_fc_norm_*, layers.0, norm)."""
    import torch
    from torch import nn
    from transformers import Qwen3_5MoeForCausalLM, Qwen3_5MoeTextConfig
    from transformers.models.qwen3_5_moe import modeling_qwen3_5_moe as mq

    cfg = Qwen3_5MoeTextConfig(**CONFIG)
    cfg._attn_implementation = "sdpa"
    torch.manual_seed(seed)

    class WithMtp(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lm = Qwen3_5MoeForCausalLM(cfg)
            h, eps = cfg.hidden_size, cfg.rms_norm_eps
            mtp = nn.Module()
            mtp.fc = nn.Linear(2 * h, h, bias=False)  # (H, 2H) over [e ; h]
            mtp.pre_fc_norm_embedding = mq.Qwen3_5MoeRMSNorm(h, eps=eps)
            mtp.pre_fc_norm_hidden = mq.Qwen3_5MoeRMSNorm(h, eps=eps)
            mtp.norm = mq.Qwen3_5MoeRMSNorm(h, eps=eps)
            full = cfg.layer_types.index("full_attention")
            mtp.layers = nn.ModuleList([mq.Qwen3_5MoeDecoderLayer(cfg, full)])
            nn.init.normal_(mtp.fc.weight, std=cfg.initializer_range)
            self.mtp = mtp

        def forward(self, x: Any) -> tuple[Any, Any, Any]:
            """x [B, L] → (trunk logits [B, L, V], MTP logits [B, L, V], router aux loss)."""
            b, n = x.shape
            out = self.lm.model(input_ids=x, output_router_logits=True)
            h = out.last_hidden_state  # [B, L, H] after the output norm
            logits = self.lm.lm_head(h)
            e = self.lm.model.embed_tokens(x)  # [B, L, H]
            hp = nn.functional.pad(h[:, :-1], (0, 0, 1, 0))  # h_{p-1}, 0 at p = 0
            m = self.mtp
            y = m.fc(torch.cat([m.pre_fc_norm_embedding(e), m.pre_fc_norm_hidden(hp)], -1))
            pos = torch.arange(n, device=x.device)
            pe = self.lm.model.rotary_emb(y, pos.view(1, 1, n).expand(3, b, n))
            causal = torch.full((n, n), float("-inf"), device=x.device).triu(1)
            mask = causal.to(y.dtype).view(1, 1, n, n)
            y = m.layers[0](
                y, position_embeddings=pe, attention_mask=mask, position_ids=pos.expand(b, n)
            )
            if isinstance(y, tuple):
                y = y[0]
            mlogits = self.lm.lm_head(m.norm(y))
            aux = _aux_loss(out, cfg, mq)
            return logits, mlogits, aux

    return WithMtp()


def _aux_loss(out: Any, cfg: Any, mq: Any) -> Any:
    rl = getattr(out, "router_logits", None)
    if not rl:
        return 0.0
    return mq.load_balancing_loss_func(rl, cfg.num_experts, cfg.num_experts_per_tok, None)


def losses(model: Any, xb: Any) -> tuple[Any, Any, Any, Any, Any]:
    """(trunk CE, MTP CE, aux, trunk logits, MTP logits) of windows xb [B, L+1]."""
    import torch.nn.functional as F

    x, y = xb[:, :-1], xb[:, 1:]
    logits, mlogits, aux = model(x)
    v = logits.shape[-1]
    lm = F.cross_entropy(logits.float().reshape(-1, v), y.reshape(-1))
    mt = F.cross_entropy(mlogits.float().reshape(-1, v), y.reshape(-1))
    return lm, mt, aux, logits, mlogits


def evaluate(model: Any, windows: Any, dev: Any) -> dict[str, float]:
    """Held-out trunk and MTP cross-entropy, and the MTP's greedy agreement with the trunk
    one step on: at p + 1 the MTP's argmax of (x_{p+1}, h_p) vs the trunk's at p + 1 — the
    draft acceptance a greedy decode would see for one-token windows."""
    import torch

    model.eval()
    s = {"lm": 0.0, "mtp": 0.0, "agree": 0.0}
    n = 0
    with torch.no_grad():
        for i in range(0, len(windows), 8):
            xb = windows[i : i + 8].to(dev)
            with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=dev.type == "cuda"):
                lm, mt, _, lg, ml = losses(model, xb)
            s["lm"] += float(lm)
            s["mtp"] += float(mt)
            s["agree"] += float((ml.argmax(-1) == lg.argmax(-1)).float().mean())
            n += 1
    model.train()
    return {k: round(v / n, 4) for k, v in s.items()}


def train(a: argparse.Namespace) -> None:
    import torch

    t0 = time.time()
    deadline = t0 + a.budget_s
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    torch.backends.cuda.matmul.allow_tf32 = True
    data = np.load(Path(a.data) / "data.npz")
    ids, held = data["train"], data["heldout"]
    model = build().to(dev)
    impl = "eager" if dev.type != "cuda" else tdm._pick_experts_impl(model.lm, ids, dev)
    tdm._set_experts_impl(model.lm, impl)
    opt = tdm._optimizer(model, "moe", dev)
    n_params = sum(p.numel() for p in model.parameters())
    print(f"[mtp] {n_params / 1e6:.2f} M weights, experts {impl}, device {dev}", flush=True)
    val = torch.from_numpy(tdm.heldout_windows(held, 32))

    def step(s: int, lr: float) -> tuple[float, float]:
        for g in opt.param_groups:
            g["lr"] = lr
        xb = torch.from_numpy(tdm._batch(ids, s, "mtp", a.batch)).to(dev, non_blocking=True)
        with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=dev.type == "cuda"):
            lm, mt, aux, _, _ = losses(model, xb)
        loss = lm + MTP_WEIGHT * mt + CONFIG["router_aux_loss_coef"] * aux
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return float(lm), float(mt)

    steps = a.steps
    if not steps:  # size the run from the measured step time (two warm-up steps first)
        step(10**9, 0.0)
        step(10**9 + 1, 0.0)
        t1 = time.time()
        for s in range(2, 5):
            step(10**9 + s, 0.0)
        per = (time.time() - t1) / 3
        steps = max(10, int((deadline - time.time() - a.reserve_s) / per))
        print(f"[mtp] {per * 1e3:.0f} ms/step -> {steps} steps", flush=True)
    warm = min(200, steps // 10)
    log: list[list[Any]] = []
    best: tuple[float, int, dict[str, Any]] = (math.inf, 0, {})
    last = time.time()
    s = 0
    while s < steps and time.time() < deadline - a.reserve_s:
        f = s / max(1, warm) if s < warm else 0.1 + 0.45 * (1 + math.cos(math.pi * s / steps))
        lm, mt = step(s, LR * min(1.0, f))
        s += 1
        if time.time() - last > 30 or s == steps:
            ev = evaluate(model, val, dev)
            score = ev["lm"] + MTP_WEIGHT * ev["mtp"]
            if score < best[0]:
                best = (score, s, {k: t.detach().clone() for k, t in model.state_dict().items()})
            log.append([s, round(lm, 4), round(mt, 4), ev])
            print(f"[mtp] step {s}/{steps} train {lm:.3f}/{mt:.3f} held-out {ev}", flush=True)
            last = time.time()
    ev = evaluate(model, val, dev)
    if best[2] and best[0] < ev["lm"] + MTP_WEIGHT * ev["mtp"]:
        model.load_state_dict(best[2])
        ev = evaluate(model, val, dev)
    state = dict(step=s, steps=steps, log=log, final=ev, config=CONFIG, experts_impl=impl,
                 mtp_weight=MTP_WEIGHT, elapsed_s=round(time.time() - t0, 1))  # fmt: skip
    print(f"[mtp] trained {s} steps in {state['elapsed_s']} s, held-out {ev}", flush=True)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    gold = golden(model, held, dev)
    np.savez_compressed(out / "mtp.meta.npz", state=json.dumps(state), **gold)
    with tempfile.TemporaryDirectory() as d:
        f16 = Path(d) / "mtp-f16.gguf"
        convert(model, Path(a.data), Path(a.llama_cpp), f16)
        split(f16, out)
    print(f"[mtp] done in {time.time() - t0:.0f} s", flush=True)


def golden(model: Any, held: np.ndarray, dev: Any) -> dict[str, Any]:
    """PyTorch's float32 trunk and MTP logits of the float16-rounded weights (what the F16
    GGUF holds) on held-out prompts."""
    import torch

    m = build().to(dev)
    m.load_state_dict({k: v.detach().half().float() for k, v in model.state_dict().items()})
    tdm._set_experts_impl(m.lm, "eager")
    m.eval()
    starts = np.linspace(0, len(held) - tdm.GOLDEN_LEN - 1, tdm.GOLDEN_PROMPTS).astype(np.int64)
    prompts = np.stack([held[s : s + tdm.GOLDEN_LEN] for s in starts]).astype(np.int64)
    prev = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    with torch.no_grad():
        lg, ml, _ = m(torch.from_numpy(prompts).to(dev))
    torch.backends.cuda.matmul.allow_tf32 = prev
    return {"prompts": prompts, "logits": lg.float().cpu().numpy(),
            "mtp_logits": ml.float().cpu().numpy()}  # fmt: skip


def _vocab(data: Path) -> Any:
    """strata.vocabgen's GGUFVocab of the prepared tokenizer (the module loaded by path: the
    device has no strata wheel here)."""
    path = Path(__file__).resolve().parents[1] / "python/strata/vocabgen.py"
    spec = importlib.util.spec_from_file_location("strata_vocabgen", path)
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    meta = json.loads((data / "vocab.json").read_text())
    return mod.GGUFVocab(
        tokens=meta["tokenizer.ggml.tokens"],
        token_types=meta["tokenizer.ggml.token_type"],
        merges=meta["tokenizer.ggml.merges"],
        bos_id=meta["tokenizer.ggml.bos_token_id"],
        eos_id=meta["tokenizer.ggml.eos_token_id"],
        pad_id=meta["tokenizer.ggml.padding_token_id"],
        chat_template=meta["tokenizer.chat_template"],
    )


def convert(model: Any, data: Path, llama_cpp: Path, dst: Path) -> None:
    """The trunk saved by transformers plus the `mtp.*` tensors under the released names,
    `mtp_num_hidden_layers` 1 in its config, through llama.cpp's converter (F16; norms and
    other vectors stay F32), with the prepared tokenizer as the GGUF vocabulary."""
    import safetensors.torch
    import torch

    sys.path[:0] = [str(llama_cpp), str(llama_cpp / "gguf-py")]
    import gguf
    from conversion import ModelBase, get_model_architecture, get_model_class
    from conversion.base import ModelType

    vocab = _vocab(data)
    with tempfile.TemporaryDirectory() as d:
        src = Path(d)
        model.lm.float().save_pretrained(src)
        st = src / "model.safetensors"
        sd = safetensors.torch.load_file(st)
        mtp = {f"mtp.{k}": v.detach().float().cpu().contiguous()
               for k, v in model.mtp.state_dict().items()}  # fmt: skip
        safetensors.torch.save_file({**sd, **mtp}, st, metadata={"format": "pt"})
        cj = src / "config.json"
        conf = json.loads(cj.read_text())
        conf["mtp_num_hidden_layers"] = 1
        cj.write_text(json.dumps(conf))
        hparams = ModelBase.load_hparams(src, False)
        cls = get_model_class(get_model_architecture(hparams, ModelType.TEXT), mmproj=False)
        with torch.inference_mode():
            m = cls(src, gguf.LlamaFileType.MOSTLY_F16, dst, eager=True,
                    model_name="strata-mtp-qwen35moe")  # fmt: skip
            m.set_vocab = lambda: vocab.add_to_writer(m.gguf_writer)
            m.write()


def split(f: Path, out: Path) -> None:
    data = f.read_bytes()
    for i in range(0, len(data), PIECE):
        (out / f"{f.name}.part{i // PIECE}").write_bytes(data[i : i + PIECE])
    print(f"[mtp] {f.name}: {len(data) / 1e6:.1f} MB in {math.ceil(len(data) / PIECE)} pieces")


def join(a: argparse.Namespace) -> None:
    parts = sorted(Path(a.pieces).glob("mtp-f16.gguf.part*"), key=lambda p: int(p.suffix[5:]))
    Path(a.out).write_bytes(b"".join(p.read_bytes() for p in parts))
    print(f"{a.out}: {len(parts)} pieces")


def check(a: argparse.Namespace) -> None:
    """Strata's trunk and MTP logits on the F16 file against PyTorch's (`golden`)."""
    from strata._core import Model

    z = np.load(a.meta)
    state = json.loads(str(z["state"]))
    print("trained:", {k: state[k] for k in ("step", "final", "elapsed_s")})
    prompts, ref, mref = z["prompts"], z["logits"], z["mtp_logits"]
    m = Model.open(a.gguf, n_ctx=int(prompts.shape[1]) + 8, n_slots=1, kv_type="f32")
    m.set_mtp(True)
    worst, mworst = 0.0, 0.0
    for p, r, mr in zip(prompts, ref, mref, strict=True):
        m.free(0)
        ours = m.forward(0, [int(x) for x in p], logits="all")
        worst = max(worst, float(np.abs(ours - r).max() / np.abs(r).max()))
        for n in (0, 1, 5, len(p) // 2, len(p) - 1):
            m.free(0)
            if n:
                m.forward(0, [int(x) for x in p[:n]], logits="none")
            d = m.mtp_draft(0, int(p[n]), True)
            mworst = max(mworst, float(np.abs(d - mr[n]).max() / np.abs(mr[n]).max()))
    print(f"trunk max |Δ| / max |ref| = {worst:.2e}; MTP rows {mworst:.2e}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    t = sub.add_parser("train")
    t.add_argument("--data", required=True)
    t.add_argument("--llama-cpp", required=True)
    t.add_argument("--out", required=True)
    t.add_argument("--budget-s", type=float, default=420.0)
    t.add_argument("--reserve-s", type=float, default=60.0, help="kept for eval and converting")
    t.add_argument("--steps", type=int, default=0, help="0: as many as fit the budget")
    t.add_argument("--batch", type=int, default=tdm.BATCH)
    j = sub.add_parser("join")
    j.add_argument("--pieces", required=True)
    j.add_argument("--out", required=True)
    c = sub.add_parser("check")
    c.add_argument("--gguf", required=True)
    c.add_argument("--meta", required=True)
    a = ap.parse_args()
    {"train": train, "join": join, "check": check}[a.cmd](a)


if __name__ == "__main__":
    main()
