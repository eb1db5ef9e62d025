"""No import cycle between the Rust modules of rust/src/gpu and rust/src/cuda (issue #24), as
scripts/module_cycles.py finds them; and that script does find a cycle where there is one."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location(
    "module_cycles", ROOT / "scripts" / "module_cycles.py"
)
assert _spec is not None and _spec.loader is not None
mc = importlib.util.module_from_spec(_spec)
sys.modules["module_cycles"] = mc
_spec.loader.exec_module(mc)


def test_gpu_and_cuda_have_no_import_cycle() -> None:
    src = ROOT / "rust" / "src"
    for d in ("gpu", "cuda"):
        assert mc.cycles(src / d, src) == [], d


def _crate(tmp: Path, files: dict[str, str]) -> Path:
    src = tmp / "rust" / "src"
    for name, text in files.items():
        (src / name).parent.mkdir(parents=True, exist_ok=True)
        (src / name).write_text(text)
    return src


def test_a_cycle_through_a_reexport_is_found(tmp_path: Path) -> None:
    src = _crate(
        tmp_path,
        {
            "lib.rs": "pub mod m;\n",
            "m/mod.rs": "mod a;\nmod b;\nmod c;\npub use a::A;\n",
            "m/a.rs": "use super::b::B;\npub struct A(B);\n",
            "m/b.rs": "pub struct B;\nfn f() { let _ = super::c::C; }\n",
            # c reaches a through the parent's re-export
            "m/c.rs": "use crate::m::{A};\npub struct C;\n",
        },
    )
    assert mc.cycles(src / "m", src) == [["rust/src/m/a.rs", "rust/src/m/b.rs", "rust/src/m/c.rs"]]


def test_test_code_and_leaf_imports_are_not_cycles(tmp_path: Path) -> None:
    src = _crate(
        tmp_path,
        {
            "lib.rs": "pub mod m;\n",
            "m/mod.rs": "mod a;\nmod b;\nmod leaf;\npub use a::A;\n",
            "m/leaf.rs": "pub struct L;\n",
            "m/a.rs": "use super::leaf::L;\nuse super::b::B;\npub struct A(L, B);\n",
            "m/b.rs": "use super::leaf::L;\npub struct B(L);\n"
            "#[cfg(test)]\nmod tests {\n    use super::super::a::A;\n}\n",
        },
    )
    assert mc.cycles(src / "m", src) == []
