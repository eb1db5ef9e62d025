"""Strata's hybrid step vs llama.cpp's `--n-cpu-moe` at equal VRAM (issue 9).

    python bench/bench_hybrid.py --dir DIR --llama-quantize Q --llama-bench B [--threads 16]
    python bench/bench_hybrid.py --dir DIR --write-f16 uniform|zipf    # one F16 file, then exit
    python bench/bench_hybrid.py --model FILE.gguf --text FILE.txt --llama-bench B  # one file

Two Qwen3-30B-A3B-shaped GGUFs at full width (hidden 2048, 128 experts, top-8, expert FF 768;
`--layers` layers, vocabulary padded to 151936 as in bench/bench_gpu.py), random f16 weights
quantized to Q4_K_M by llama.cpp's quantizer: one with the plain random router ("uniform":
it routes almost uniformly) and one with a Zipf-biased router (`router_zipf`, docs/
TIERS_VRAM.md: what real models look like to a cache). `--write-f16` writes one F16 file, so
a driver script can write both in parallel (bench/run_hybrid_device.sh).

Strata (`Model.open(..., device="cuda", vram_slots=S)`): S = `--share` (25%) of all experts
in VRAM slots, filled hottest first along a profile of `--profile-tokens` random tokens
routed first (what `strata-fill profile` gives a deployment; the adaptive tier swaps every
16 steps), dense weights and KV in VRAM, the other experts computed by the CPU pool
(`--threads` cores: the caller and threads−1 workers). Decode = `--gen` one-token steps after
a 16-token prompt; prompt processing = a fresh slot fed `--pp` tokens in chunks of
`--stream-chunk` (each chunk copies every expert missing from VRAM once over PCIe, through
page-locked bounce buffers, and runs every pair on the GPU; docs/TIERS_VRAM.md; 0: chunks of
`--chunk`); medians of `--reps`. Hit rate = routed pairs served from VRAM during the decode
runs. `--model FILE` benches that file instead (e.g. the trained default, issue 16), and
`--text FILE` takes the prompt and the decoded tokens from that text (tokenized by the model's
tokenizer, so a trained model routes as on real input) instead of random ids.

llama.cpp: llama-bench `-ngl 99 -ncmoe N` (the experts of the first N layers on the CPU) for
each N of `--ncmoe` (default: the N that leaves the same share of expert layers on the GPU,
and its neighbours; N below it gives llama.cpp more VRAM than Strata) and each micro-batch of
`--llama-ubatch` (`-ub 512,4096 -b 4096`: llama.cpp also copies the CPU layers' experts to
the GPU for large batches, and a longer micro-batch moves fewer bytes per token, as
Strata's long chunk does), same threads, its best (N, ubatch) per test taken.

The decode bound: every missed expert's bytes read once from RAM by the CPU at the pool's
measured read bandwidth (`ram_read_gbps`), plus every other weight byte read from HBM at the
device's copy bandwidth; the two legs overlap, so the bound is the slower one.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

# bench/ is the script's folder, first on sys.path: reuse bench_gpu's helpers
from bench_gpu import DECODE_PROMPT, bytes_per_token

ZIPF = 1.1


def f16_path(dir_: Path, layers: int, kind: str) -> Path:
    return dir_ / f"q3moe-{layers}l-{kind}-f16.gguf"


def write_f16(dir_: Path, layers: int, kind: str) -> Path:
    from strata.modelgen import ModelSpec, write_qwen3moe

    dir_.mkdir(parents=True, exist_ok=True)
    out = f16_path(dir_, layers, kind)
    if not out.exists():
        zipf = ZIPF if kind == "zipf" else 0.0
        spec = ModelSpec.qwen3_30b_a3b(
            layers=layers, vocab="small", n_vocab=151936, router_zipf=zipf
        )
        tmp = out.with_suffix(".part")
        write_qwen3moe(tmp, spec, dtype="f16")
        tmp.rename(out)
    return out


def quantized(dir_: Path, layers: int, kind: str, ty: str, quantizer: str | None) -> Path:
    from strata.modelgen import quantize

    out = dir_ / f"q3moe-{layers}l-{kind}-{ty}.gguf"
    if out.exists():
        return out
    f16 = write_f16(dir_, layers, kind)
    print(f"quantizing {out} ...", file=sys.stderr, flush=True)
    tmp = out.with_suffix(".part")
    if quantizer:
        subprocess.run([quantizer, str(f16), str(tmp), ty], check=True, capture_output=True)
    else:
        quantize(f16, tmp, ty)
    tmp.rename(out)
    return out


def strata_run(
    path: Path,
    a: argparse.Namespace,
    frac: float,
    pp_reps: int,
    graph: bool = True,
    defer: int = 0,
    threads: int = 0,
    prefetch: int = -1,
    adapt: int = -1,
) -> dict[str, Any]:
    """Strata's decode (a.reps runs) and prompt (pp_reps runs) at pcie_frac `frac`, decode
    steps replaying per-layer graphs (`graph`) or launching kernel by kernel, each token's
    `defer` lowest-weight CPU misses deferred by one layer (`defer_experts`, not exact), on
    `threads` threads (0: a.threads), the one-token kernels prefetching `prefetch` bytes ahead
    (-1: the built-in distance), the VRAM tier adapting every `adapt` tokens (-1: a.adapt_every;
    0: a static tier)."""
    from strata._core import Model, Profile, set_dot_prefetch

    if prefetch >= 0:
        old = set_dot_prefetch(prefetch)
        try:
            return strata_run(path, a, frac, pp_reps, graph, defer, threads, adapt=adapt)
        finally:
            set_dot_prefetch(old)

    n_layer, n_expert, n_dense = layers_experts(path)
    slots = round(a.share * (n_layer - n_dense) * n_expert)
    n_ctx = max(a.pp + 64, DECODE_PROMPT + a.gen + 64)
    rng = np.random.default_rng(0)
    text_ids: list[int] = []
    if a.text:
        from strata.llm import LLM

        raw = Path(a.text).read_text(errors="replace")
        text_ids = LLM(path, n_ctx=64).encode_prompt(raw)
        need = a.pp + DECODE_PROMPT + a.gen
        text_ids = (text_ids * (need // max(1, len(text_ids)) + 1))[:need]

    def open_model(profile: Profile | None) -> Model:
        return Model.open(
            path,
            n_ctx=n_ctx,
            prefill_chunk=a.chunk,
            device="cuda",
            threads=threads or a.threads,
            vram_slots=slots,
            adapt_every=a.adapt_every if adapt < 0 else adapt,
            profile=profile,
            stream_chunk=a.stream_chunk,
            pool_pipeline=a.pool_pipeline,
            pool_balanced=not a.pool_unbalanced,
            pcie_frac=frac,
            cuda_graph=graph,
            defer_experts=defer,
            gpus=a.gpus,
        )

    profile = None
    if a.profile_tokens > 0:
        # What `strata-fill profile` does on real text: route some tokens, keep the counts,
        # fill the slots hottest first (other tokens than the measured ones below).
        m = open_model(None)
        m.forward(0, rng.integers(0, m.n_vocab, a.profile_tokens).tolist(), logits="none")
        profile = Profile.from_counts(path, m.routing_counts(), a.profile_tokens, "bench")
        del m
    m = open_model(profile)
    info = m.hybrid_info()
    counters = m.hybrid_counters()
    assert info is not None and counters is not None, "the hybrid mode is off"
    v = m.n_vocab
    prompt = rng.integers(0, v, a.pp).tolist()
    if text_ids:
        prompt = text_ids[DECODE_PROMPT + a.gen :]
    runs = 0

    def decode() -> float:
        # Fresh tokens every run: a replayed sequence routes as it did before, and the
        # adaptive tier learns it (five replays of one 64-token sequence took the uniform
        # file's hit rate 0.24 -> 0.55 and decode 302 -> 429 tok/s, 2026-12-05 run M).
        nonlocal runs
        n = DECODE_PROMPT + a.gen
        if text_ids:
            at = (runs * n) % max(1, len(text_ids) - n)
            toks = (text_ids * 2)[at : at + n]
        else:
            toks = rng.integers(0, v, n).tolist()
        runs += 1
        m.free(0)
        m.forward(0, toks[:DECODE_PROMPT], logits="last")
        t = time.perf_counter()
        for tok in toks[DECODE_PROMPT:]:
            m.forward(0, [tok], logits="last")
        return float(a.gen) / (time.perf_counter() - t)

    def prefill() -> float:
        m.free(0)
        t = time.perf_counter()
        m.forward(0, prompt, logits="last")
        return len(prompt) / (time.perf_counter() - t)

    decode()  # warm-up (first-call setup, page cache, the tier adapts)
    tg, pp = [], []
    h0 = counters.totals()
    lt0 = counters.layer_times()
    ct0 = counters.chain_times()
    for r in range(a.reps):
        tg.append(decode())
        print(f"  strata rep {r}: tg{a.gen} {tg[-1]:.1f} tok/s", file=sys.stderr, flush=True)
    h1 = counters.totals()
    lt1 = counters.layer_times()
    ct1 = counters.chain_times()
    info = m.hybrid_info() or info  # after the decode runs: the PCIe share the tuner chose
    n_lay = max(1, lt1["layers"] - lt0["layers"])
    phases = {k: (lt1[k] - lt0[k]) / n_lay / 1e3 for k in lt1 if k != "layers"}
    # the GPU's part by CUDA events (--chain-timing): µs per timed layer
    n_ch = ct1["layers"] - ct0["layers"]
    chain = {k: (ct1[k] - ct0[k]) / n_ch / 1e3 for k in ct1 if k != "layers"} if n_ch else {}
    for r in range(pp_reps):
        pp.append(prefill())
        print(f"  strata rep {r}: pp{a.pp} {pp[-1]:.1f} tok/s", file=sys.stderr, flush=True)
    hits = h1[0] - h0[0]
    total = sum(h1) - sum(h0)
    snap = counters.snapshot()
    return {
        "tg": statistics.median(tg),
        "pp": statistics.median(pp) if pp else float("nan"),
        "hit_rate": hits / total if total else float("nan"),
        "pcie_share": (h1[2] - h0[2]) / max(1, total - hits),
        "swaps": snap["swaps"],
        "phases": phases,
        "chain": chain,
        "info": info,
        "graph": m.cuda_graph_state,
    }


def layers_experts(path: Path) -> tuple[int, int, int]:
    """(n_layer, n_expert, leading dense layers) of a MoE GGUF (qwen3moe, gpt-oss, glm4moe)."""
    from strata.gguf import GGUFFile

    with GGUFFile(path) as g:
        md = g.metadata
        arch = md["general.architecture"]
        dense = int(md.get(f"{arch}.leading_dense_block_count", 0))
        return int(md[f"{arch}.block_count"]), int(md[f"{arch}.expert_count"]), dense


def llama_runs(exe: str, path: Path, a: argparse.Namespace, ncmoe: list[int]) -> list[dict]:
    """llama-bench records: one per (N, test)."""
    cmd = [exe, "-m", str(path), "-ngl", "99", "-ncmoe", ",".join(map(str, ncmoe))]
    if a.llama_ubatch:
        ubs = [int(x) for x in a.llama_ubatch.split(",")]
        cmd += ["-ub", ",".join(map(str, ubs)), "-b", str(max(ubs))]
    cmd += ["-p", str(a.pp), "-n", str(a.gen), "-r", str(a.llama_reps), "-t", str(a.threads)]
    cmd += ["-o", "json"]
    print("running " + " ".join(cmd), file=sys.stderr, flush=True)
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        print(r.stderr[-3000:], file=sys.stderr)
        return []
    return list(json.loads(r.stdout))


def llama_best(recs: list[dict]) -> dict[str, tuple[float, int, int]]:
    """Best tok/s per test ("pp", "tg") and the N and ubatch that gave it."""
    best: dict[str, tuple[float, int, int]] = {}
    for rec in recs:
        name = "pp" if rec["n_gen"] == 0 else "tg"
        ts, n = float(rec["avg_ts"]), int(rec.get("n_cpu_moe", -1))
        ub = int(rec.get("n_ubatch", -1))
        if name not in best or ts > best[name][0]:
            best[name] = (ts, n, ub)
    return best


def decode_bound(path: Path, hit_rate: float, ram_gbps: float, hbm_gbps: float) -> float:
    """tok/s bound: missed expert bytes from RAM by the CPU, the rest from HBM, overlapped."""
    from strata.gguf import GGUFFile

    total, _ = bytes_per_token(path)
    with GGUFFile(path) as g:
        arch = g.metadata["general.architecture"]
        k = int(g.metadata[f"{arch}.expert_used_count"])
        n_exp = int(g.metadata[f"{arch}.expert_count"])
        routed = sum(t.nbytes * k / n_exp for t in g.tensors.values() if "_exps" in t.name)
    ram = routed * (1.0 - hit_rate)
    hbm = total - ram
    return 1.0 / max(ram / (ram_gbps * 1e9), hbm / (hbm_gbps * 1e9))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dir", type=Path, default=Path("/work/bench-models"))
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--type", default="Q4_K_M")
    ap.add_argument("--write-f16", choices=("uniform", "zipf"), help="write one F16 and exit")
    ap.add_argument("--llama-quantize", help="llama-quantize binary used to make the files")
    ap.add_argument("--make-only", action="store_true", help="make the quantized files, exit")
    ap.add_argument("--llama-bench", help="llama-bench binary (CUDA build) to compare with")
    ap.add_argument("--ncmoe", default="", help="N values for -ncmoe (default: equal VRAM ±1)")
    ap.add_argument("--threads", type=int, default=16, help="CPU threads, both engines")
    ap.add_argument(
        "--gpus", default="0", help='the stages\' devices ("0,1": two cards, the layer split)'
    )
    ap.add_argument("--share", type=float, default=0.25, help="share of experts in VRAM")
    ap.add_argument("--adapt-every", type=int, default=16)
    ap.add_argument(
        "--profile-tokens", type=int, default=512, help="tokens routed for the profile (0: none)"
    )
    ap.add_argument("--gen", type=int, default=64, help="decoded tokens per run")
    ap.add_argument("--pp", type=int, default=4096, help="prompt length")
    ap.add_argument("--chunk", type=int, default=512, help="Strata's prefill chunk")
    ap.add_argument(
        "--stream-chunk", type=int, default=4096, help="streamed prefill chunk (0: --chunk)"
    )
    ap.add_argument(
        "--llama-ubatch", default="512,4096", help="llama-bench -ub values (-b: the largest)"
    )
    ap.add_argument(
        "--pool-pipeline",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="the pool's pipelined schedule, or (--no-pool-pipeline) its barrier schedule "
        "(default: the settings' pool_pipeline)",
    )
    ap.add_argument(
        "--pool-unbalanced",
        action="store_true",
        help="pool_balanced off: decode tiles ~3 per thread per expert phase (A/B)",
    )
    ap.add_argument("--reps", type=int, default=3, help="Strata decode runs")
    ap.add_argument("--pp-reps", type=int, default=1, help="Strata prompt runs")
    ap.add_argument("--llama-reps", type=int, default=2)
    ap.add_argument("--models", default="uniform,zipf")
    ap.add_argument("--model", type=Path, help="bench this file instead of the written models")
    ap.add_argument("--text", help="prompt and decoded tokens from this text file")
    ap.add_argument(
        "--eager-ab",
        action="store_true",
        help="also decode at the first pcie_frac without the per-layer graphs",
    )
    ap.add_argument(
        "--defer",
        default="",
        help="also decode at the first pcie_frac with each defer_experts value of this comma "
        "list (not exact: bench/defer_quality.py measures its quality)",
    )
    ap.add_argument(
        "--threads-ab",
        default="",
        help="also decode at the first pcie_frac with each thread count of this comma list",
    )
    ap.add_argument(
        "--dot-prefetch",
        default="",
        help="also decode at the first pcie_frac with the one-token kernels' prefetch distance "
        "(bytes, 0: off) at each value of this comma list (set_dot_prefetch; results bitwise)",
    )
    ap.add_argument(
        "--chain-timing",
        action="store_true",
        help="time each CPU-path layer's GPU part with CUDA events (set_hybrid_chain_timing): "
        "the previous layer's add, then attention to routing, in µs per layer",
    )
    ap.add_argument(
        "--no-fusion",
        action="store_true",
        help="open the models with the decode chain's kernel fusions off (set_gpu_fusion): "
        "the same results, each step in a kernel of its own",
    )
    ap.add_argument(
        "--adapt-ab",
        action="store_true",
        help="also decode at the first pcie_frac with a static VRAM tier (adapt_every 0)",
    )
    ap.add_argument(
        "--control",
        action="store_true",
        help="decode at the first pcie_frac once more after the variants (the run's drift)",
    )
    ap.add_argument(
        "--pcie-frac",
        default="0",
        help="Strata's pcie_frac values, comma-separated (-1: from the link probe); decode "
        "runs for each, the prompt with the first",
    )
    a = ap.parse_args()
    if a.write_f16:
        print(write_f16(a.dir, a.layers, a.write_f16))
        return

    from strata._core import (
        gpu_status,
        pcie_probe_gbps,
        ram_read_gbps,
        set_gpu_fusion,
        set_hybrid_chain_timing,
    )

    set_hybrid_chain_timing(a.chain_timing)
    set_gpu_fusion(not a.no_fusion)
    from strata._core._testing import gpu_copy_gbps

    n_dense = 0
    if a.model:
        paths = {a.model.stem: a.model}
        a.layers, _, n_dense = layers_experts(a.model)
    else:
        kinds = a.models.split(",")
        paths = {k: quantized(a.dir, a.layers, k, a.type, a.llama_quantize) for k in kinds}
        # files just written are flushed before either engine reads them: the first decode
        # after a prep ran 5-12% under the later ones (runs E, G, J), perhaps while their
        # writeback went on
        os.sync()
    if a.make_only:
        print("\n".join(map(str, paths.values())))
        return
    ok, why = gpu_status()
    if not ok:
        sys.exit(f"no usable GPU: {why}")
    print(f"device: {why}", file=sys.stderr)
    hbm = gpu_copy_gbps(1024, 10)
    ram = ram_read_gbps(a.threads)
    link = pcie_probe_gbps(256)
    fracs = [float(x) for x in a.pcie_frac.split(",")]
    # -ncmoe N keeps the experts of layers 0..N-1 on the CPU (leading dense layers have none)
    equal_n = n_dense + round((a.layers - n_dense) * (1.0 - a.share))
    ncmoe = [int(x) for x in a.ncmoe.split(",")] if a.ncmoe else [equal_n - 1, equal_n, equal_n + 1]
    ncmoe = [n for n in ncmoe if 0 <= n <= a.layers]
    rows = []
    for kind, path in paths.items():
        print(f"== {kind}: {path.name}", file=sys.stderr, flush=True)
        runs = [strata_run(path, a, f, a.pp_reps if j == 0 else 0) for j, f in enumerate(fracs)]
        labels = [f"pcie_frac {f}" for f in fracs]
        if a.eager_ab:
            runs.append(strata_run(path, a, fracs[0], 0, graph=False))
            labels.append(f"pcie_frac {fracs[0]}, no graphs")
        for n in [int(x) for x in a.defer.split(",") if x]:
            runs.append(strata_run(path, a, fracs[0], 0, defer=n))
            labels.append(f"pcie_frac {fracs[0]}, defer_experts {n}")
        for n in [int(x) for x in a.threads_ab.split(",") if x]:
            runs.append(strata_run(path, a, fracs[0], 0, threads=n))
            labels.append(f"pcie_frac {fracs[0]}, threads {n}")
        for n in [int(x) for x in a.dot_prefetch.split(",") if x]:
            runs.append(strata_run(path, a, fracs[0], 0, prefetch=n))
            labels.append(f"pcie_frac {fracs[0]}, dot prefetch {n} B")
        if a.adapt_ab:
            runs.append(strata_run(path, a, fracs[0], 0, adapt=0))
            labels.append(f"pcie_frac {fracs[0]}, static tier (adapt_every 0)")
        if a.control:
            runs.append(strata_run(path, a, fracs[0], 0))
            labels.append(f"pcie_frac {fracs[0]} (control, last)")
        recs = llama_runs(a.llama_bench, path, a, ncmoe) if a.llama_bench else []
        best = llama_best(recs)
        s = runs[0]
        bound = decode_bound(path, s["hit_rate"], ram, hbm)
        bound_link = decode_bound(path, s["hit_rate"], ram + link, hbm)
        i = s["info"]
        print(
            f"{kind}: Strata {i['n_slots']} slots of {i['n_experts']} experts "
            f"({100 * i['resident_share']:.0f}%), VRAM plan {i['fixed_bytes'] / 2**20:.0f} MiB "
            f"fixed + {i['n_slots'] * i['slot_bytes'] / 2**20:.0f} MiB slots; decode hit rate "
            f"{s['hit_rate']:.3f}, swaps {s['swaps']}; streamed chunk {i['stream_chunk']} "
            f"({i['stream_areas']} staging areas, {i['stream_threads']} copy threads); "
            f"decode bound {bound:.1f} tok/s, {bound_link:.1f} with the link "
            f"(RAM {ram:.0f} GB/s, link {link:.0f} GB/s, HBM copy {hbm:.0f} GB/s)"
        )
        for label, r in zip(labels, runs, strict=True):
            ph = ", ".join(f"{k} {v:.1f}" for k, v in r["phases"].items())
            if r["chain"]:
                ph += "; GPU µs per layer: " + ", ".join(
                    f"{k} {v:.1f}" for k, v in r["chain"].items()
                )
            ri = r["info"]
            print(
                f"  Strata {label} (used {ri['pcie_frac']:.3f}, {ri['pcie']}; graph "
                f"{r['graph']}): "
                f"tg{a.gen} {r['tg']:.1f} tok/s, hit rate {r['hit_rate']:.3f}, "
                f"PCIe share {r['pcie_share']:.3f}; host µs per layer: {ph}"
            )
        # the table: the first pcie_frac value (the default, -1: the probe's), graphs on
        for rec in recs:
            print(
                f"  llama.cpp -ncmoe {rec.get('n_cpu_moe')} -ub {rec.get('n_ubatch')}: "
                f"{'pp' if rec['n_gen'] == 0 else 'tg'} {float(rec['avg_ts']):.1f} tok/s"
            )
        pp_chunk = i["stream_chunk"] or a.chunk
        for test, ours in (("tg", s["tg"]), ("pp", s["pp"])):
            theirs, n, ub = best.get(test, (float("nan"), -1, -1))
            chunk = f"{pp_chunk} / {ub}" if test == "pp" else f"1 / {ub}"
            bnd = bound_link if s["info"]["pcie_frac"] > 0 else bound
            rows.append((kind, test, ours, theirs, n, chunk, s["hit_rate"], bnd))
    name = {"tg": f"decode tg{a.gen}", "pp": f"prompt pp{a.pp}"}
    print(
        f"\nthreads {a.threads}; Strata: {a.share:.0%} of the experts in VRAM; "
        f"llama.cpp -ncmoe {ncmoe}"
    )
    hdr = ["model", "test", "strata tok/s", "llama.cpp best (N)", "chunk / ubatch", "ratio"]
    hdr += ["hit rate", "bound"]
    print("| " + " | ".join(hdr) + " |")
    print("|" + "---|" * len(hdr))
    for kind, test, ours, theirs, n, chunk, hr, bound in rows:
        ratio = f"{ours / theirs:.2f}" if theirs == theirs and theirs > 0 else "-"
        cells = [
            kind,
            name[test],
            f"{ours:.1f}",
            f"{theirs:.1f} ({n})" if theirs == theirs else "-",
            chunk,
            ratio,
            f"{hr:.3f}",
            f"{bound:.1f}" if test == "tg" else "",
        ]
        print("| " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
