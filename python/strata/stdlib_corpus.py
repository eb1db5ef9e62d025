"""The training corpus of the embedded default model: the Python standard library's own `.py`
sources (code, comments and docstrings), which ship with every CPython, so anyone can rebuild
it offline.

The file list is pinned by a rule (`select_files`): every `*.py` under the interpreter's
stdlib folder (`sysconfig.get_paths()["stdlib"]`) outside `site-packages`, `__pycache__` and
the folders in `SKIP_DIRS`, of at most `MAX_FILE_BYTES` and valid UTF-8, in sorted relative
path order. A file is held out (for perplexity and agreement measurements, never trained on)
when its relative path is one of `HELDOUT` or lies under one of them: named modules together
with their tests, so no near-copy of held-out text leaks into training.

Different CPython versions ship different stdlib files, so the corpus is named by the
interpreter's version (`corpus_id`): the shipped model was built from CPython 3.11's
(docs/MODELS.md gives the version and the SHA-256 of the token stream).

Besides the plain files, `chat_examples` turns documented functions of the training files
into ChatML turns (user: "Write a Python function `name`: <first docstring line>",
assistant: the function's source), so the chat template's turns are not foreign to the model.
"""

from __future__ import annotations

import ast
import hashlib
import json
import sys
import sysconfig
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from strata.vocabgen import CHATML_SPECIALS, GGUFVocab, chatml_vocab, train_bpe

MAX_FILE_BYTES = 256 * 1024
# Folders left out whole: vendored data, not the library's own code.
SKIP_DIRS = ("site-packages", "__pycache__", "idlelib/idle_test", "lib2to3/tests/data")
# Held-out modules (and their tests): about 5% of the text.
HELDOUT = (
    "json",
    "test/test_json",
    "textwrap.py",
    "test/test_textwrap.py",
    "csv.py",
    "test/test_csv.py",
    "fractions.py",
    "test/test_fractions.py",
    "heapq.py",
    "test/test_heapq.py",
    "statistics.py",
    "test/test_statistics.py",
    "shlex.py",
    "test/test_shlex.py",
    "graphlib.py",
    "test/test_graphlib.py",
    "calendar.py",
    "test/test_calendar.py",
    "ipaddress.py",
    "test/test_ipaddress.py",
)
EOT = "<|endoftext|>"
CHAT_EVERY = 1  # one chat example per documented top-level function


@dataclass(frozen=True)
class Source:
    rel: str  # path relative to the stdlib folder, "/"-separated
    text: str


def stdlib_dir() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def corpus_id() -> str:
    v = sys.version_info
    return f"cpython-{v.major}.{v.minor}-stdlib"


def is_heldout(rel: str) -> bool:
    return any(rel == h or rel.startswith(h.rstrip("/") + "/") for h in HELDOUT)


def select_files(root: Path | None = None) -> list[Source]:
    """The pinned file list (module docstring), with each file's text, sorted by path."""
    root = root or stdlib_dir()
    out: list[Source] = []
    for p in sorted(root.rglob("*.py"), key=lambda q: q.relative_to(root).as_posix()):
        rel = p.relative_to(root).as_posix()
        if any(rel == d or rel.startswith(d + "/") or f"/{d}/" in f"/{rel}" for d in SKIP_DIRS):
            continue
        if not p.is_file() or p.stat().st_size > MAX_FILE_BYTES:
            continue
        try:
            text = p.read_bytes().decode("utf-8")
        except UnicodeDecodeError:
            continue
        out.append(Source(rel, text.replace("\r\n", "\n")))
    return out


def split(files: Sequence[Source]) -> tuple[list[Source], list[Source]]:
    """(training files, held-out files)."""
    return [f for f in files if not is_heldout(f.rel)], [f for f in files if is_heldout(f.rel)]


def chat_examples(files: Iterable[Source]) -> Iterator[str]:
    """ChatML turns from documented top-level functions (module docstring)."""
    for f in files:
        try:
            tree = ast.parse(f.text)
        except (SyntaxError, ValueError):
            continue
        lines = f.text.splitlines(keepends=True)
        for node in tree.body:
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            doc = ast.get_docstring(node)
            # whole lines (a top-level def starts at column 0); ast.get_source_segment
            # rescans the file per call, character by character
            src = "".join(lines[node.lineno - 1 : node.end_lineno]).rstrip("\n")
            if not doc or not doc.strip() or not src or node.name.startswith("_"):
                continue
            if len(src) > 3000:
                continue
            ask = doc.strip().splitlines()[0]
            yield (
                f"<|im_start|>user\nWrite a Python function `{node.name}`: {ask}<|im_end|>\n"
                f"<|im_start|>assistant\n{src}<|im_end|>\n"
            )


def train_tokenizer(texts: Iterable[str], n_vocab: int) -> tuple[Any, GGUFVocab]:
    """A byte-level BPE (HF `tokenizers`, qwen2 pre-tokenizer) of exactly `n_vocab` entries:
    trained tokens, then the ChatML specials (`<|endoftext|>` = bos/pad, `<|im_end|>` = eos),
    then `[PAD{id}]` entries if the corpus runs out of merges. Returns (the HF Tokenizer with
    the specials added, its GGUF form)."""
    from tokenizers import AddedToken

    n_special = len(CHATML_SPECIALS)
    tok, tokens, merges = train_bpe(texts, n_vocab - n_special)
    vocab = chatml_vocab(tokens, merges, n_vocab)
    tok.add_special_tokens(
        [AddedToken(t, special=True, normalized=False) for t, _ in CHATML_SPECIALS]
    )
    if tok.token_to_id("<|im_start|>") != vocab.bos_id + 1:
        raise RuntimeError("special token ids do not follow the trained vocabulary")
    return tok, vocab


def documents(train: Sequence[Source], chat: bool = True) -> list[str]:
    """Training documents: every file as `# <path>\\n<text>`, then the chat examples."""
    docs = [f"# {f.rel}\n{f.text}" for f in train]
    if chat:
        docs += list(chat_examples(train))
    return docs


def encode(tok: Any, docs: Sequence[str], eot_id: int) -> list[int]:
    """The token stream: each document's ids followed by `<|endoftext|>`."""
    out: list[int] = []
    for enc in tok.encode_batch(list(docs), add_special_tokens=False):
        out.extend(enc.ids)
        out.append(eot_id)
    return out


def stream_digest(ids: Sequence[int] | np.ndarray[Any, Any]) -> str:
    """SHA-256 of a token stream (little-endian u32s), to name a corpus build."""
    return hashlib.sha256(np.asarray(ids, dtype="<u4").tobytes()).hexdigest()


def manifest(train: Sequence[Source], held: Sequence[Source]) -> dict[str, Any]:
    return {
        "corpus": corpus_id(),
        "python": sys.version.split()[0],
        "train_files": len(train),
        "heldout_files": [f.rel for f in held],
        "train_bytes": sum(len(f.text.encode()) for f in train),
        "heldout_bytes": sum(len(f.text.encode()) for f in held),
    }


def dump_manifest(m: dict[str, Any]) -> str:
    return json.dumps(m, indent=1, sort_keys=True)
