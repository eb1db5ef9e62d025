#!/usr/bin/env python3
"""Trains the embedded default model (qwen3moe) and its draft (dense qwen3) on the Python
standard library, and converts them to the GGUF files Strata ships (docs/MODELS.md).

Three steps, because the GPU machine has no network and another Python (its stdlib differs):

  1. here:    python scripts/train_default_model.py prepare --out .dev/train/data
     Corpus (strata.stdlib_corpus: pinned file rule, named held-out modules), the byte-level
     BPE tokenizer (HF tokenizers, 8192 entries with the ChatML specials) and the token ids
     (train.npy / heldout.npy, uint16, in one compressed data.npz), plus vocab.json (the GGUF
     tokenizer) and manifest.json.
  2. device:  python3 scripts/train_default_model.py train --data DIR --out $OUT --which moe
     (and --which draft, in a second process on the same GPU). PyTorch from HF
     Qwen3MoeConfig / Qwen3Config; seeded; time-bounded (--budget-s: it stops, evaluates and
     writes its checkpoint before the limit); resumable (--resume DIR: the checkpoint of a
     previous call, weights and step; the AdamW moments do not fit the output folder and
     restart). The checkpoint is the weights in float16, split into pieces of < 16 MiB
     (moe.ckpt.0.npz, ...), plus moe.meta.npz: the state (config, step, losses, as json) and
     HF's float32 logits of the float16-rounded weights on held-out prompts (the float
     oracle that `convert` checks our forward pass against).
  3. here:    python scripts/train_default_model.py convert --data DIR --ckpt DIR --out DIR
     GGUF with strata.modelgen (tokenizer and chat template in the metadata), F32, then Q8_0
     through llama.cpp's quantizer: python/strata/models/strata-default-qwen3moe-q8_0.gguf
     and strata-draft-qwen3-q8_0.gguf.

The shipped run: `train --which moe --steps 1461` and `train --which draft --steps 4000`
(docs/MODELS.md); with --steps 0 the count is sized from the measured step time.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

N_VOCAB = 8192
SEQ = 512
SEED = 1234
PIECE_BYTES = 15 * 1024 * 1024

# The two models, as HF config keyword arguments (common ones in _COMMON).
_COMMON: dict[str, Any] = {
    "vocab_size": N_VOCAB,
    "max_position_embeddings": 4096,
    "rms_norm_eps": 1e-6,
    "rope_theta": 1e6,
    "tie_word_embeddings": False,
    "attention_bias": False,
    "hidden_act": "silu",
    "head_dim": 64,
}
MODELS: dict[str, dict[str, Any]] = {
    # qwen3moe: hidden 256, 5 layers, 32 experts top-4 of width 128; ~21 M weights.
    "moe": {
        **_COMMON,
        "hidden_size": 256,
        "num_hidden_layers": 5,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "num_experts": 32,
        "num_experts_per_tok": 4,
        "moe_intermediate_size": 128,
        "intermediate_size": 512,
        "norm_topk_prob": True,
        "decoder_sparse_step": 1,
        "mlp_only_layers": [],
        "router_aux_loss_coef": 0.01,
        "output_router_logits": True,
    },
    # dense qwen3: hidden 128, 2 layers, FFN 256; ~0.3 M non-embedding weights (the default
    # model has ~3 M active non-embedding weights per token).
    "draft": {
        **_COMMON,
        "hidden_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "intermediate_size": 256,
    },
}
LR = {"moe": 2e-3, "draft": 3e-3}
BATCH = 64  # sequences of SEQ tokens per step
GOLDEN_PROMPTS, GOLDEN_LEN = 2, 32


# ---- 1. prepare (here) ---------------------------------------------------------------------


def prepare(out: Path) -> None:
    from strata import stdlib_corpus as sc

    out.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    train, held = sc.split(sc.select_files())
    docs = sc.documents(train)
    tok, vocab = sc.train_tokenizer(docs, N_VOCAB)
    eot = vocab.bos_id
    ids_train = np.asarray(sc.encode(tok, docs, eot), dtype=np.uint16)
    held_docs = [f"# {f.rel}\n{f.text}" for f in held]
    ids_held = np.asarray(sc.encode(tok, held_docs, eot), dtype=np.uint16)
    np.savez_compressed(out / "data.npz", train=ids_train, heldout=ids_held)
    (out / "vocab.json").write_text(json.dumps(vocab.metadata()))
    (out / "tokenizer.json").write_text(tok.to_str())
    m = sc.manifest(train, held)
    m.update(
        n_vocab=N_VOCAB,
        train_tokens=len(ids_train),
        heldout_tokens=len(ids_held),
        chat_examples=len(docs) - len(train),
        train_sha256=sc.stream_digest(ids_train),
        heldout_sha256=sc.stream_digest(ids_held),
    )
    (out / "manifest.json").write_text(sc.dump_manifest(m))
    print(sc.dump_manifest({k: v for k, v in m.items() if k != "heldout_files"}))
    print(f"prepared in {time.time() - t0:.0f} s")


# ---- 2. train (device) ---------------------------------------------------------------------


def hf_model(which: str) -> Any:
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM, Qwen3MoeConfig, Qwen3MoeForCausalLM

    kw = dict(MODELS[which])
    cfg = (Qwen3MoeConfig if which == "moe" else Qwen3Config)(**kw)
    rp = getattr(cfg, "rope_parameters", None)  # transformers >= 5 keeps the base here
    if isinstance(rp, dict):
        rp["rope_theta"] = kw["rope_theta"]
        rp.setdefault("rope_type", "default")
    torch.manual_seed(SEED + (0 if which == "moe" else 1))
    return (Qwen3MoeForCausalLM if which == "moe" else Qwen3ForCausalLM)(cfg)


def _set_experts_impl(model: Any, impl: str) -> None:
    if hasattr(model.config, "_experts_implementation"):
        model.config._experts_implementation = impl


def _batch(ids: np.ndarray, step: int, which: str, n: int) -> np.ndarray:
    """`n` windows of SEQ+1 tokens at offsets drawn from (SEED, step): the same batches in
    every run and after a resume."""
    rng = np.random.default_rng([SEED, step, 0 if which == "moe" else 1])
    starts = rng.integers(0, len(ids) - SEQ - 1, n)
    return np.stack([ids[s : s + SEQ + 1] for s in starts]).astype(np.int64)


def heldout_windows(ids: np.ndarray, n: int) -> np.ndarray:
    """`n` evenly spaced windows of SEQ+1 held-out tokens (the same ones here and there)."""
    starts = np.linspace(0, len(ids) - SEQ - 2, n).astype(np.int64)
    return np.stack([ids[s : s + SEQ + 1] for s in starts]).astype(np.int64)


def train(args: argparse.Namespace) -> None:
    import torch

    which: str = args.which
    t_start = time.time()
    deadline = t_start + args.budget_s
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    torch.backends.cuda.matmul.allow_tf32 = True
    data = np.load(Path(args.data) / "data.npz")
    ids, held = data["train"], data["heldout"]
    model = hf_model(which).to(dev)
    state: dict[str, Any] = {"step": 0, "steps": args.steps, "log": []}
    if args.resume:
        state = read_state(Path(args.resume), which)
        state["steps"] = max(state["steps"], args.steps)  # --steps N extends a finished run
        model.load_state_dict(load_ckpt(Path(args.resume), which), strict=True)
        print(f"[{which}] resumed at step {state['step']}", flush=True)
    impl = "eager"
    if which == "moe" and not args.eager:
        impl = _pick_experts_impl(model, ids, dev)
    n_params = sum(p.numel() for p in model.parameters())
    print(f"[{which}] {n_params / 1e6:.2f} M weights, experts: {impl}, device {dev}", flush=True)
    opt = _optimizer(model, which, dev)
    batch = args.batch
    if not state["steps"]:  # size the run from the measured step time
        for s in range(2):  # warm-up: the first steps pay for kernel selection
            _step(model, opt, _batch(ids, 10**9 + s, which, batch), dev, 0.0)
        t0 = time.time()
        for s in range(2, 6):
            _step(model, opt, _batch(ids, 10**9 + s, which, batch), dev, 0.0)
        per = (time.time() - t0) / 4  # _step syncs (it reads the loss)
        left = deadline - time.time() - args.reserve_s
        state["steps"] = max(10, int(left / per))
        model = hf_model(which).to(dev)  # the timing steps touched the weights: start again
        _set_experts_impl(model, impl)
        opt = _optimizer(model, which, dev)
        print(f"[{which}] {per * 1e3:.0f} ms/step -> {state['steps']} steps", flush=True)
    steps = state["steps"]
    warm = min(200, steps // 10)
    val = torch.from_numpy(heldout_windows(held, 32))
    last_log = time.time()
    best: tuple[float, int, dict[str, Any]] = (math.inf, 0, {})
    while state["step"] < steps:
        if time.time() > deadline - args.reserve_s:
            print(f"[{which}] time limit at step {state['step']}/{steps}", flush=True)
            break
        s = state["step"]
        # warmup, then cosine to 10% of the peak
        f = s / max(1, warm) if s < warm else 0.1 + 0.45 * (1 + math.cos(math.pi * s / steps))
        loss = _step(model, opt, _batch(ids, s, which, batch), dev, LR[which] * min(1.0, f))
        state["step"] = s + 1
        if time.time() - last_log > 30 or state["step"] == steps:
            v = evaluate(model, val, dev)
            if v < best[0]:  # many epochs over a small corpus: keep the best held-out weights
                best = (
                    v,
                    state["step"],
                    {k: t.detach().clone() for k, t in model.state_dict().items()},
                )
            state["log"].append([state["step"], round(loss, 4), round(v, 4)])
            print(f"[{which}] step {state['step']}/{steps} loss {loss:.3f} val {v:.3f}", flush=True)
            last_log = time.time()
    state["val_loss"] = evaluate(model, val, dev)
    if best[0] < state["val_loss"]:
        model.load_state_dict(best[2])
        state["val_loss"], state["best_step"] = best[0], best[1]
    state["done"] = state["step"] >= steps
    state["config"] = MODELS[which]
    state["experts_impl"] = impl
    state["elapsed_s"] = round(time.time() - t_start, 1)
    out = Path(args.out)
    save_ckpt(model, out, which)
    # the state (json) and the golden logits in one file: the output folder takes 8 files
    np.savez_compressed(
        out / f"{which}.meta.npz", state=json.dumps(state), **golden(model, held, dev)
    )
    print(f"[{which}] saved step {state['step']} val {state['val_loss']:.4f}", flush=True)


def _optimizer(model: Any, which: str, dev: Any) -> Any:
    """AdamW, weight decay 0.1 on the matrices but the embeddings, none on norms."""
    import torch

    decay = [p for n, p in model.named_parameters() if p.dim() >= 2 and "embed" not in n]
    rest = [p for n, p in model.named_parameters() if not (p.dim() >= 2 and "embed" not in n)]
    return torch.optim.AdamW(
        [{"params": decay, "weight_decay": 0.1}, {"params": rest, "weight_decay": 0.0}],
        lr=LR[which],
        betas=(0.9, 0.95),
        eps=1e-8,
        fused=dev.type == "cuda",
    )


def _pick_experts_impl(model: Any, ids: np.ndarray, dev: Any) -> str:
    """transformers' grouped_mm experts where they run (one forward and backward tried on a
    copy), else its eager loop over experts."""
    import copy

    import torch

    if dev.type != "cuda":
        return "eager"
    try:
        m2 = copy.deepcopy(model)
        _set_experts_impl(m2, "grouped_mm")
        x = torch.from_numpy(_batch(ids, 0, "moe", 2)).to(dev)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            out = m2(input_ids=x[:, :-1], labels=x[:, 1:])
        out.loss.backward()
        del m2
        _set_experts_impl(model, "grouped_mm")
        return "grouped_mm"
    except Exception as e:  # the eager loop is always there
        print(f"grouped_mm experts unavailable ({type(e).__name__}: {e}); eager", flush=True)
        return "eager"


def _step(model: Any, opt: Any, xb: np.ndarray, dev: Any, lr: float) -> float:
    import torch

    for g in opt.param_groups:
        g["lr"] = lr
    x = torch.from_numpy(xb).to(dev, non_blocking=True)
    with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=dev.type == "cuda"):
        out = model(input_ids=x[:, :-1], labels=x[:, :-1].clone())
    # HF shifts labels itself: labels = inputs (the loss predicts token t+1 from t)
    out.loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    opt.zero_grad(set_to_none=True)
    return float(out.loss.detach())


def evaluate(model: Any, windows: Any, dev: Any) -> float:
    """Mean next-token cross-entropy (nats) of the language-model head alone on `windows`."""
    import torch
    import torch.nn.functional as F

    model.eval()
    tot, n = 0.0, 0
    with torch.no_grad():
        for i in range(0, len(windows), 8):
            x = windows[i : i + 8].to(dev)
            with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=dev.type == "cuda"):
                logits = model(input_ids=x[:, :-1]).logits.float()
            ce = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), x[:, 1:].reshape(-1))
            tot += float(ce) * x[:, 1:].numel()
            n += x[:, 1:].numel()
    model.train()
    return tot / n


def save_ckpt(model: Any, out: Path, which: str) -> None:
    """float16 weights in pieces of < PIECE_BYTES (the output folder's file limit)."""
    out.mkdir(parents=True, exist_ok=True)
    for old in out.glob(f"{which}.ckpt.*.npz"):
        old.unlink()
    piece: dict[str, np.ndarray] = {}
    size, k = 0, 0
    for name, t in model.state_dict().items():
        a = t.detach().float().cpu().numpy().astype(np.float16)
        if piece and size + a.nbytes > PIECE_BYTES:
            np.savez(out / f"{which}.ckpt.{k}.npz", **piece)
            piece, size, k = {}, 0, k + 1
        piece[name] = a
        size += a.nbytes
    np.savez(out / f"{which}.ckpt.{k}.npz", **piece)


def load_ckpt(d: Path, which: str) -> dict[str, Any]:
    """The float32 state dict (torch tensors) of the pieces in `d`."""
    import torch

    sd: dict[str, Any] = {}
    for p in sorted(d.glob(f"{which}.ckpt.*.npz")):
        with np.load(p) as z:
            sd.update({k: torch.from_numpy(z[k].astype(np.float32)) for k in z.files})
    return sd


def golden(model: Any, held: np.ndarray, dev: Any) -> dict[str, Any]:
    """HF's float32 logits of the float16-rounded weights (what the GGUF holds) on held-out
    prompts: the float oracle for our forward pass on the F32 file."""
    import torch

    m = type(model)(model.config).float()
    sd = {k: v.detach().half().float() for k, v in model.state_dict().items()}
    m.load_state_dict(sd)
    _set_experts_impl(m, "eager")
    m = m.to(dev).eval()
    starts = np.linspace(0, len(held) - GOLDEN_LEN - 1, GOLDEN_PROMPTS).astype(np.int64)
    prompts = np.stack([held[s : s + GOLDEN_LEN] for s in starts]).astype(np.int64)
    with torch.no_grad():
        prev = torch.backends.cuda.matmul.allow_tf32
        torch.backends.cuda.matmul.allow_tf32 = False
        logits = m(input_ids=torch.from_numpy(prompts).to(dev)).logits.float().cpu().numpy()
        torch.backends.cuda.matmul.allow_tf32 = prev
    import transformers

    return {"prompts": prompts, "logits": logits, "transformers_version": transformers.__version__}


def read_state(d: Path, which: str) -> dict[str, Any]:
    with np.load(d / f"{which}.meta.npz") as z:
        state: dict[str, Any] = json.loads(str(z["state"]))
    return state


# ---- 3. convert (here) ---------------------------------------------------------------------


def convert(args: argparse.Namespace) -> None:
    from strata import hfconvert, modelgen
    from strata.vocabgen import GGUFVocab

    meta = json.loads((Path(args.data) / "vocab.json").read_text())
    vocab = GGUFVocab(
        tokens=meta["tokenizer.ggml.tokens"],
        token_types=meta["tokenizer.ggml.token_type"],
        merges=meta["tokenizer.ggml.merges"],
        bos_id=meta["tokenizer.ggml.bos_token_id"],
        eos_id=meta["tokenizer.ggml.eos_token_id"],
        pad_id=meta["tokenizer.ggml.padding_token_id"],
        chat_template=meta["tokenizer.chat_template"],
    )
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    ckpt = Path(args.ckpt)
    for which, name, desc in (
        ("moe", "strata-default-qwen3moe", DESC_MOE),
        ("draft", "strata-draft-qwen3", DESC_DRAFT),
    ):
        state = read_state(ckpt, which)
        sd: dict[str, np.ndarray] = {}
        for p in sorted(ckpt.glob(f"{which}.ckpt.*.npz")):
            with np.load(p) as z:
                sd.update({k: z[k].astype(np.float32) for k in z.files})
        spec = hfconvert.spec_from_hf_config(state["config"])
        spec = modelgen.ModelSpec(**{**spec.__dict__, "name": name})
        weights = hfconvert.hf_to_gguf(sd, spec)
        f32 = out / f"{name}-f32.gguf"
        modelgen.write_qwen3moe(f32, spec, vocab=vocab, weights=weights, description=desc)
        print(f"{which}: ours vs transformers on the F32 file: {float_oracle(f32, ckpt, which)}")
        if args.f32_only:
            continue
        q8 = out / f"{name}-q8_0.gguf"
        try:
            modelgen.quantize(f32, q8, "Q8_0")  # llama.cpp's quantizer
            how = "llama.cpp"
        except ModuleNotFoundError:  # no llama-cpp-python: gguf-py's bit-exact Q8_0
            modelgen.write_qwen3moe(
                q8, spec, dtype="q8_0", vocab=vocab, weights=weights, description=desc
            )
            how = "gguf-py"
        print(f"{which}: step {state['step']}, val loss {state['val_loss']:.4f} -> {q8} ({how})")
        print(f"  {f32.stat().st_size / 1e6:.1f} MB F32, {q8.stat().st_size / 1e6:.1f} MB Q8_0")


def float_oracle(f32: Path, ckpt: Path, which: str) -> str:
    """Our forward pass on the F32 file against HF's float32 logits of the same (float16-
    rounded) weights, computed on the GPU machine (`golden`): max |Δ| / max |ref|, top-1."""
    from strata._core import Model

    with np.load(ckpt / f"{which}.meta.npz") as z:
        prompts, ref = z["prompts"], z["logits"]
    m = Model.open(f32, n_ctx=int(prompts.shape[1]), n_slots=1, kv_type="f32")
    worst, top1 = 0.0, []
    for p, r in zip(prompts, ref, strict=True):
        m.free(0)
        ours = m.forward(0, [int(x) for x in p], logits="all")
        worst = max(worst, float(np.abs(ours - r).max() / np.abs(r).max()))
        top1.extend(ours.argmax(1) == r.argmax(1))
    return f"max |Δ| / max |ref| = {worst:.2e}, top-1 agreement {np.mean(top1):.4f}"


DESC_MOE = (
    "Strata's default model: a small qwen3moe trained on the Python standard library's "
    "sources (scripts/train_default_model.py); it completes Python code, nothing more"
)
DESC_DRAFT = (
    "Strata's draft model: a small dense qwen3 trained on the Python standard library's "
    "sources with the default model's tokenizer, for speculative decoding"
)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("prepare")
    p.add_argument("--out", type=Path, required=True)
    t = sub.add_parser("train")
    t.add_argument("--data", required=True)
    t.add_argument("--out", required=True)
    t.add_argument("--which", choices=sorted(MODELS), required=True)
    t.add_argument("--budget-s", type=float, default=400.0, help="wall-clock limit")
    t.add_argument("--reserve-s", type=float, default=25.0, help="kept for eval and saving")
    t.add_argument("--steps", type=int, default=0, help="0: as many as fit the budget")
    t.add_argument("--batch", type=int, default=BATCH)
    t.add_argument("--resume", default="", help="folder with a previous call's checkpoint")
    t.add_argument("--eager", action="store_true", help="transformers' eager experts loop")
    c = sub.add_parser("convert")
    c.add_argument("--data", required=True)
    c.add_argument("--ckpt", required=True)
    c.add_argument("--out", required=True)
    c.add_argument("--f32-only", action="store_true", help="no Q8_0 (needs llama-cpp-python)")
    args = ap.parse_args(argv)
    if args.cmd == "prepare":
        prepare(args.out)
    elif args.cmd == "train":
        train(args)
    else:
        convert(args)


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "true")
    main()
