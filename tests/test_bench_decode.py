"""Smoke run of bench/bench_decode.py --quick on the tiny llama.cpp-quantized model: both
engines run, their counters are consistent, and the table has a row per test."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from models import TestModels

ROOT = Path(__file__).resolve().parent.parent


def test_bench_decode_quick(test_models: TestModels) -> None:
    import llama_cpp  # noqa: F401  (the peer: a declared test dependency)

    path = test_models.quantized("Q4_K_M")
    r = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "bench_decode.py"), "--model", str(path), "--quick"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    rows = [ln for ln in r.stdout.splitlines() if ln.startswith(f"| {path.name}")]
    assert [ln.split("|")[2].strip() for ln in rows] == ["pp64", "tg16"]
    for ln in rows:
        cells = [c.strip() for c in ln.split("|")[1:-1]]
        llama, strata, ratio = float(cells[2]), float(cells[3]), float(cells[4])
        assert llama > 0 and strata > 0
        # the cells are rounded (tok/s to 0.1, the ratio to 0.01): the ratio must lie within
        # what the rounded speeds allow (a slow peer on a loaded machine reads e.g. "1.0")
        lo = (strata - 0.05) / (llama + 0.05) - 0.005
        hi = (strata + 0.05) / max(llama - 0.05, 1e-9) + 0.005
        assert lo <= ratio <= hi, (llama, strata, ratio)
    assert float(rows[1].split("|")[8]) > 0  # decode bound
