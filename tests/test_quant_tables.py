"""rust/src/quant/tables.rs against the grids gguf-py decodes (gguf/quants.py init_grid).

The Rust source is parsed here independently of scripts/gen_quant_tables.py, and every grid
entry is compared element by element with gguf-py's float grid.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from gguf import quants

ROOT = Path(__file__).resolve().parent.parent
TABLES = ROOT / "rust" / "src" / "quant" / "tables.rs"


def rust_array(name: str) -> list[int]:
    text = TABLES.read_text()
    m = re.search(rf"pub (?:static|const) {name}: \[\w+; (\d+)\] = \[(.*?)\];", text, re.S)
    assert m is not None, name
    values = [int(v, 0) for v in re.findall(r"-?(?:0x[0-9a-f]+|\d+)", m.group(2))]
    assert len(values) == int(m.group(1))
    return values


@pytest.mark.parametrize(
    ("name", "cls", "width"),
    [
        ("IQ2XXS_GRID", quants.IQ2_XXS, 8),
        ("IQ2XS_GRID", quants.IQ2_XS, 8),
        ("IQ2S_GRID", quants.IQ2_S, 8),
        ("IQ3XXS_GRID", quants.IQ3_XXS, 4),
        ("IQ3S_GRID", quants.IQ3_S, 4),
        ("IQ1S_GRID", quants.IQ1_S, 8),
    ],
)
def test_grid_matches_gguf_py(name: str, cls: type, width: int) -> None:
    cls.init_grid()  # type: ignore[attr-defined]
    expected = np.asarray(cls.grid).reshape(cls.grid_shape)  # type: ignore[attr-defined]
    entries = np.array(rust_array(name), dtype=np.uint64)
    as_bytes = entries.astype("<u8").view(np.uint8).reshape(-1, 8)[:, :width]
    assert as_bytes.shape == expected.shape
    # IQ1_S holds int8 values in {-1, 0, 1}; the other grids hold unsigned magnitudes.
    values = as_bytes.view(np.int8) if name == "IQ1S_GRID" else as_bytes
    np.testing.assert_array_equal(values.astype(np.float32), expected)


def test_ksigns_and_kvalues() -> None:
    assert bytes(rust_array("KSIGNS_IQ2XS")) == quants.IQ2_XXS.ksigns
    assert tuple(rust_array("KVALUES_IQ4NL")) == quants.IQ4_NL.kvalues
    assert tuple(rust_array("KVALUES_MXFP4")) == quants.MXFP4.kvalues
    assert tuple(rust_array("KVALUES_MXFP4")) == quants.NVFP4.kvalues
    m = re.search(r"pub const IQ1S_DELTA: f32 = ([0-9.]+);", TABLES.read_text())
    assert m is not None and float(m.group(1)) == float(quants.IQ1_S.delta)


def test_generated_file_is_fresh() -> None:
    script = ROOT / "scripts" / "gen_quant_tables.py"
    r = subprocess.run([sys.executable, str(script), "--check"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
