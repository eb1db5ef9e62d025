"""Experts are never copied: anonymous resident memory after loading and generating stays
below non-expert weights + KV cache + repacked copies + 10% + 1 MiB (measured in a fresh
process; scripts/model_memory.py says why each term)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import qwen3moe_file as qf

SCRIPT = Path(__file__).parent.parent / "scripts" / "model_memory.py"


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="needs Linux /proc")
def test_rss_anon_stays_below_non_expert_plus_kv(tmp_path: Path) -> None:
    s = qf.Shape(n_layer=2, n_expert=32)  # 48 MiB of experts, ~2.7 MiB of the rest
    path = qf.write(tmp_path / "m.gguf", s, qf.random_tensors(s, 5))
    r = subprocess.run(
        [sys.executable, str(SCRIPT), str(path), "--n-ctx", "1024", "--tokens", "16"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    print(r.stdout, r.stderr)
    assert r.returncode == 0, r.stdout + r.stderr
