#!/usr/bin/env python3
"""Coverage of the GGUF parser by a fuzz corpus, two ways.

Edges: sums libFuzzer's `-print_coverage=1` report for the source files under one folder:
    fuzz/target/x86_64-unknown-linux-gnu/release/gguf_parse -runs=0 -print_coverage=1 \\
        fuzz/corpus/gguf_parse 2>&1 | python scripts/fuzz_coverage.py edges rust/src/gguf/
prints, per file, the instrumented edges hit out of those in functions under the folder (the
edges include every overflow and bounds-check panic branch, which no input should reach),
the functions never entered, and the lines holding a missed edge.

Refusals: opens every corpus input with strata.gguf.GGUFFile (inputs holding the fuzz
target's shard separator become shard files) and counts the distinct GGUFError messages,
numbers and quoted names folded:
    python scripts/fuzz_coverage.py refusals fuzz/corpus/gguf_parse
"""

from __future__ import annotations

import re
import sys
import tempfile
from collections import Counter, defaultdict
from pathlib import Path

FUNC = re.compile(r"^(COVERED|UNCOVERED)_FUNC: hits: (\d+) edges: (\d+)/(\d+) (.*) (\S+):(\d+)$")
PC = re.compile(r"^\s+UNCOVERED_PC: (\S+):(\d+)$")


def edges(folder: str) -> None:
    hit: dict[str, int] = defaultdict(int)
    total: dict[str, int] = defaultdict(int)
    never: list[str] = []
    missed_lines: set[tuple[str, int]] = set()
    for line in sys.stdin:
        m = FUNC.match(line.rstrip("\n"))
        if m:
            _, _, e_hit, e_all, name, path, lno = m.groups()
            if folder not in path:
                continue
            f = path[path.index(folder) :]
            hit[f] += int(e_hit)
            total[f] += int(e_all)
            if int(e_hit) == 0:
                never.append(f"{f}:{lno} {name}")
            continue
        m = PC.match(line.rstrip("\n"))
        if m and folder in m.group(1) and m.group(2) != "0":
            p = m.group(1)
            missed_lines.add((p[p.index(folder) :], int(m.group(2))))
    all_hit, all_total = sum(hit.values()), sum(total.values())
    for f in sorted(total):
        print(f"{f}: {hit[f]}/{total[f]} edges ({100 * hit[f] / max(total[f], 1):.1f}%)")
    pct = 100 * all_hit / max(all_total, 1)
    print(f"all of {folder}: {all_hit}/{all_total} edges ({pct:.1f}%)")
    print(f"functions never entered ({len(never)}):")
    for n in never:
        print(f"  {n}")
    print(f"lines with a missed edge in entered functions ({len(missed_lines)}):")
    by_file: dict[str, list[int]] = defaultdict(list)
    for f, ln in sorted(missed_lines):
        by_file[f].append(ln)
    for f, lns in by_file.items():
        print(f"  {f}: {', '.join(map(str, lns))}")


SEP = b"#GGUF-SHARD#"  # fuzz/fuzz_targets/gguf_parse.rs


def _fold(msg: str) -> str:
    msg = msg.split(": at byte ", 1)[-1]
    msg = msg.split(": ", 1)[-1] if msg[:1].isdigit() else msg
    msg = re.sub(r'"(?:[^"\\]|\\.)*"', '"…"', msg)
    msg = re.sub(r"\[[^\]]*\]", "[…]", msg)
    return re.sub(r"(0x[0-9a-f]+|-?\d+(\.\d+)?(e[+-]?\d+)?)", "N", msg)


def refusals(corpus: Path) -> None:
    from strata.errors import GGUFError
    from strata.gguf import GGUFFile

    counts: Counter[str] = Counter()
    accepted = 0
    with tempfile.TemporaryDirectory() as d:
        for i, f in enumerate(sorted(corpus.iterdir())):
            parts = f.read_bytes().split(SEP)[:4]
            n = len(parts)
            sub = Path(d) / str(i)
            sub.mkdir()
            paths = [sub / f"fz-{k + 1:05d}-of-{n:05d}.gguf" for k in range(n)]
            if n == 1:
                paths = [sub / "fz.gguf"]
            for p, b in zip(paths, parts, strict=True):
                p.write_bytes(b)
            try:
                GGUFFile(paths[0]).close()
                accepted += 1
            except GGUFError as e:
                counts[_fold(str(e))] += 1
    total = accepted + sum(counts.values())
    print(f"{total} inputs: {accepted} accepted, {len(counts)} distinct refusals")
    for msg, c in counts.most_common():
        print(f"{c:6d}  {msg}")


def main() -> None:
    mode = sys.argv[1] if len(sys.argv) > 1 else "edges"
    if mode == "edges":
        edges(sys.argv[2] if len(sys.argv) > 2 else "rust/src/gguf/")
    elif mode == "refusals":
        refusals(Path(sys.argv[2] if len(sys.argv) > 2 else "fuzz/corpus/gguf_parse"))
    else:
        sys.exit(f"unknown mode {mode!r}: edges or refusals")


if __name__ == "__main__":
    main()
