"""The docs live in the repo (issue #24): docs/DESIGN.md's request path names files that exist,
code comments cite repo paths only, the license and .gitignore are in place, and
docs/BENCHMARKS.md has its "figures to quote" with the history apart."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CODE_DIRS = ("rust/src", "python", "cuda", "tests", "bench", "scripts")
CODE_SUFFIXES = {".rs", ".py", ".pyi", ".cu", ".cuh", ".cpp", ".h", ".c", ".sh"}


def code_files() -> list[Path]:
    out = []
    for d in CODE_DIRS:
        out += [p for p in (ROOT / d).rglob("*") if p.suffix in CODE_SUFFIXES and p.is_file()]
    return [p for p in out if p.name != Path(__file__).name]


def test_design_walks_the_request_path_with_existing_files() -> None:
    text = (ROOT / "docs" / "DESIGN.md").read_text()
    for heading in ("## Processes", "## Layers", "## One request, from HTTP to tokens and back"):
        assert heading in text, heading
    cited = set(re.findall(r"`((?:python|rust|cuda|docs|tests|scripts)/[\w./*-]+)`", text))
    assert len(cited) >= 20, cited
    for c in sorted(cited):
        if "*" in c:
            assert list(ROOT.glob(c)), c
        else:
            assert (ROOT / c).exists(), f"docs/DESIGN.md cites {c}, which does not exist"
    # the path runs top-down: HTTP first, the kernels later, the way back last
    path = text.split("## One request", 1)[1]
    hops = ("routes.py", "client.py", "scheduler.py", "llm.py", "forward.rs", "gpu/model.rs")
    order = [path.index(s) for s in hops]
    assert order == sorted(order)


def test_code_cites_repo_paths_only() -> None:
    outside = re.compile(
        r"(?<![\w/])(FORMATS|GPU_SPEC|SYSTEM|BENCH|CPU_PERF|GPU_PERF|STYLE|DESIGN)(\.md|\b §)"
    )
    bad = []
    for p in code_files():
        for i, line in enumerate(p.read_text(errors="replace").splitlines(), 1):
            if outside.search(line):
                bad.append(f"{p.relative_to(ROOT)}:{i}: {line.strip()}")
    assert not bad, "comments citing docs outside the repo:\n" + "\n".join(bad)


def test_cited_repo_docs_exist() -> None:
    missing = set()
    for p in code_files():
        for doc in re.findall(r"\bdocs/([\w-]+\.md)", p.read_text(errors="replace")):
            if not (ROOT / "docs" / doc).is_file():
                missing.add(f"{p.relative_to(ROOT)} → docs/{doc}")
    assert not missing, sorted(missing)


def test_license_and_gitignore() -> None:
    lic = (ROOT / "LICENSE").read_text()
    assert "Apache License" in lic and "Version 2.0, January 2004" in lic
    assert re.search(r"^license\s*=.*Apache-2\.0", (ROOT / "pyproject.toml").read_text(), re.M)
    ignored = (ROOT / ".gitignore").read_text().split()
    assert ".whl/" in ignored and ".devsrc/" in ignored


def test_benchmarks_quote_current_figures_and_keep_history_apart() -> None:
    text = (ROOT / "docs" / "BENCHMARKS.md").read_text()
    assert "## Figures to quote" in text
    quote = text.split("## Figures to quote", 1)[1].split("\n## ", 1)[0]
    # every figure with its command
    for block in quote.split("\n### ")[1:]:
        assert re.search(r"(python3? |bash )(bench|scripts)/", block), block[:200]
    assert (ROOT / "docs" / "benchmarks-history.md").is_file()
