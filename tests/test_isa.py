"""The Rust tests of one instruction set (issue #24: skips are skips). They are `#[ignore]`d
in `cargo test` (so it lists them as ignored, not passed) and marked there
`#[ignore = "ISA test: ... lacks <isa>"]`; this file runs each one through the same cargo
command as scripts/test (`-- --ignored --exact`), and reports it as skipped, with the reason,
where this CPU lacks its ISA (as `_core.dot_isas()` sees the CPU)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess

import pytest
from isa_marks import ROOT, isa_tests
from strata import _core

# scripts/test's own flags (plus --lib), so the test binary it built is reused, not rebuilt
CARGO = ["cargo", "test", "--workspace", "--no-default-features", "--release", "--lib"]


TESTS = isa_tests()


def test_the_isa_tests_are_found() -> None:
    names = {n for n, _ in TESTS}
    assert {"avx2_equals_scalar", "avx512_equals_scalar"} <= names, TESTS
    known = {"avx2", "avx512", "vbmi", "bitalg", "vnni", "vnni_vbmi", "amx"}
    assert {isa for _, isa in TESTS} <= known
    assert "amx_rows_equal_scalar_bitwise" in names, TESTS


def have_isas() -> set[str]:
    """The ISAs this CPU runs, as the ISA tests name them (`vbmi`, `vnni`: AVX-512 with VBMI,
    with VNNI; `bitalg`: with VBMI and BITALG; `vnni_vbmi`: with VNNI and VBMI; `amx`:
    AMX-INT8 tiles usable)."""
    feats = _core.cpu_features()
    vbmi = "avx512vbmi" in feats and "avx512" in _core.dot_isas()
    return (
        set(_core.dot_isas())
        | ({"vbmi"} if vbmi else set())
        | ({"bitalg"} if vbmi and "avx512bitalg" in feats else set())
        | ({"vnni"} if "avx512vnni" in feats and "avx512" in _core.dot_isas() else set())
        | ({"vnni_vbmi"} if vbmi and "avx512vnni" in feats else set())
        | ({"amx"} if "amx-int8" in feats else set())
    )


_results: dict[str, str] = {}


def _run_available() -> dict[str, str]:
    """Runs every ISA test this CPU can run, once; test path → "ok" | "FAILED" | output."""
    if _results:
        return _results
    have = have_isas()
    names = [n for n, isa in TESTS if isa in have]
    env = dict(os.environ)
    listing = subprocess.run(
        [*CARGO, "--", "--ignored", "--list"], cwd=ROOT, env=env, capture_output=True, text=True
    )
    assert listing.returncode == 0, listing.stdout + listing.stderr
    paths = [
        line.split(": test")[0]
        for line in listing.stdout.splitlines()
        if line.endswith(": test") and line.split(": test")[0].rsplit("::", 1)[-1] in names
    ]
    res = subprocess.run(
        [*CARGO, "--", "--ignored", "--exact", *paths],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
    )
    for p in paths:
        m = re.search(rf"^test {re.escape(p)} \.\.\. (\w+)", res.stdout, re.M)
        _results[p.rsplit("::", 1)[-1]] = m.group(1) if m else res.stdout + res.stderr
    return _results


@pytest.mark.parametrize(("name", "isa"), TESTS, ids=[n for n, _ in TESTS])
def test_rust_isa_test(name: str, isa: str) -> None:
    if isa not in have_isas():
        pytest.skip(f"this CPU lacks {isa}: the Rust test {name} was not run (not a pass)")
    if shutil.which("cargo") is None:
        pytest.skip(f"cargo is not installed: the Rust test {name} was not run (not a pass)")
    got = _run_available().get(name)
    assert got == "ok", f"{name}: {got}"
