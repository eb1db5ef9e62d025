#!/usr/bin/env python3
"""Import cycles between the Rust modules under a folder (issue #24: no cycle in rust/src/gpu
or rust/src/cuda).

Every path a file names (`use` trees, `super::x`, `crate::a::b` in code) is resolved to the
module file that defines the item: segments descend through the module files, and a name a
`mod.rs` re-exports (`pub use child::Name`) resolves to the child. A file's `mod x;` and
`pub use` lines are declarations, not edges; test code (`#[cfg(test)]` items) is left out.
Prints each cycle (files) and exits 1 when there is one.

    python3 scripts/module_cycles.py rust/src/gpu rust/src/cuda
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

SRC = Path(__file__).resolve().parent.parent / "rust" / "src"


def strip_comments(text: str) -> str:
    text = re.sub(r"/\*.*?\*/", "", text, flags=re.S)
    return re.sub(r"//[^\n]*", "", text)


def strip_test_items(text: str) -> str:
    """Removes each `#[cfg(test)]` item (a `mod x;` line or a braced block)."""
    out, i = [], 0
    for m in re.finditer(r"#\[cfg\(test\)\]", text):
        if m.start() < i:
            continue
        out.append(text[i : m.start()])
        j = m.end()
        semi, brace = text.find(";", j), text.find("{", j)
        if brace < 0 or (0 <= semi < brace):
            i = semi + 1
            continue
        depth, k = 0, brace
        while k < len(text):
            depth += {"{": 1, "}": -1}.get(text[k], 0)
            k += 1
            if depth == 0:
                break
        i = k
    out.append(text[i:])
    return "".join(out)


def expand_use(tree: str) -> list[str]:
    """`a::{b, c::{d, e}}` → [`a::b`, `a::c::d`, `a::c::e`] (aliases and globs kept as is)."""
    tree = re.sub(r"\s+", "", tree)
    brace = tree.find("{")
    if brace < 0:
        return [tree.split("as")[0] if "::" in tree else tree]
    prefix, inner = tree[:brace], tree[brace + 1 : tree.rfind("}")]
    parts, depth, cur = [], 0, ""
    for ch in inner:
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
            continue
        depth += {"{": 1, "}": -1}.get(ch, 0)
        cur += ch
    parts.append(cur)
    out = []
    for p in filter(None, parts):
        for e in expand_use(p):
            out.append(prefix.rstrip(":") if e == "self" else prefix + e)
    return out


class Crate:
    def __init__(self, src: Path) -> None:
        self.src = src
        self.reexports: dict[tuple[str, ...], dict[str, str]] = {}

    def file_of(self, mod: tuple[str, ...]) -> Path | None:
        base = self.src.joinpath(*mod)
        for f in (base.with_suffix(".rs"), base / "mod.rs"):
            if mod and f.exists():
                return f
        return None

    def mod_of(self, f: Path) -> tuple[str, ...]:
        rel = f.relative_to(self.src).with_suffix("")
        parts = rel.parts
        return parts[:-1] if parts[-1] == "mod" else parts

    def reexported(self, mod: tuple[str, ...]) -> dict[str, str]:
        """Names `mod`'s file re-exports from a child module (`pub use child::Name`)."""
        if mod not in self.reexports:
            names: dict[str, str] = {}
            f = self.file_of(mod)
            if f is not None and f.name == "mod.rs":
                text = strip_comments(f.read_text())
                for m in re.finditer(r"pub(?:\([^)]*\))?\s+use\s+([^;]+);", text):
                    for p in expand_use(m.group(1)):
                        segs = p.split("::")
                        if len(segs) == 2 and self.file_of((*mod, segs[0])):
                            names[segs[1]] = segs[0]
            self.reexports[mod] = names
        return self.reexports[mod]

    def resolve(self, here: tuple[str, ...], path: str) -> tuple[str, ...] | None:
        """The module defining the item `path` names, from module `here`."""
        segs = [s for s in path.split("::") if s]
        if not segs:
            return None
        if segs[0] in ("crate", "$crate"):
            mod: tuple[str, ...] = ()
            segs = segs[1:]
        elif segs[0] == "super":
            mod = here
            while segs and segs[0] == "super":
                mod = mod[:-1]
                segs = segs[1:]
        elif segs[0] == "self":
            mod, segs = here, segs[1:]
        else:
            return None
        for s in segs:
            if s in ("*", "self"):
                break
            if self.file_of((*mod, s)):
                mod = (*mod, s)
                continue
            child = self.reexported(mod).get(s)
            if child is not None:
                mod = (*mod, child)
            break
        return mod

    def edges(self, f: Path) -> set[tuple[str, ...]]:
        here = self.mod_of(f)
        text = strip_test_items(strip_comments(f.read_text()))
        paths: list[str] = []
        for m in re.finditer(r"(?<![\w:])(pub(?:\([^)]*\))?\s+)?use\s+([^;]+);", text):
            if m.group(1) and f.name == "mod.rs":
                continue  # a re-export: declaration, not a dependency
            paths += expand_use(m.group(2))
        code = re.sub(r"(?<![\w:])(pub(?:\([^)]*\))?\s+)?use\s+[^;]+;", "", text)
        paths += re.findall(r"(?:\$?crate|super|self)(?:::[A-Za-z_]\w*)+", code)
        out = set()
        for p in paths:
            m = self.resolve(here, p)
            if m is not None and m != here:
                out.add(m)
        return out


def cycles(folder: Path, src: Path = SRC) -> list[list[str]]:
    """Each strongly connected group of more than one module file under `folder`."""
    crate = Crate(src)
    files = sorted(folder.rglob("*.rs"))
    mods = {crate.mod_of(f): f for f in files}
    graph = {m: {e for e in crate.edges(f) if e in mods} for m, f in mods.items()}
    # Tarjan's strongly connected components
    index: dict[tuple[str, ...], int] = {}
    low: dict[tuple[str, ...], int] = {}
    stack: list[tuple[str, ...]] = []
    on: set[tuple[str, ...]] = set()
    found: list[list[str]] = []

    def visit(v: tuple[str, ...]) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(str(mods[c].relative_to(src.parent.parent)) for c in comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def main(argv: list[str]) -> int:
    bad = 0
    for arg in argv or ["rust/src/gpu", "rust/src/cuda"]:
        for c in cycles(Path(arg).resolve()):
            print(f"cycle: {' <-> '.join(c)}")
            bad += 1
    if not bad:
        print("module_cycles: no import cycle")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
