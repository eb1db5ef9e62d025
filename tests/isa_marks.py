"""The Rust ISA tests' list, read from the source: every `#[ignore = "ISA test: ... lacks
<isa>"]` test function under rust/src with its ISA. Standard library only, so that
tests/test_isa.py and scripts/isa_tests_device (which packs the tests for a machine without
Rust) read the same list."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MARK = re.compile(r'#\[ignore = "ISA test: [^"]*lacks (\w+)"\]\s*(?:#\[[^\]]*\]\s*)*fn (\w+)', re.S)


def isa_tests(root: Path = ROOT) -> list[tuple[str, str]]:
    """(test function name, ISA) of every ISA test under `root`/rust/src."""
    out = []
    for f in sorted((root / "rust" / "src").rglob("*.rs")):
        out += [(m.group(2), m.group(1)) for m in MARK.finditer(f.read_text())]
    return out
