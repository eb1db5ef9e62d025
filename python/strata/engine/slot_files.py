"""A slot's sequence and KV in a file (llama-server's `--slot-save-path` and `/slots/{id}?action=
save|restore`): the tokens the slot holds and the backend's KV export of them, with the model's
fingerprint, so a file is restored only into the model (and KV type: the export's own header)
that wrote it.

Layout: MAGIC, a u32 (little-endian) header length, the header (JSON: `version`, `model`,
`n_tokens`, `n_bytes`), the tokens as i32 [n_tokens] little-endian, then the KV export's
`n_bytes` bytes. Written to a hidden temporary name (never a valid slot file's name) and
renamed, so a reader never sees half a file and a save never touches another slot file.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import struct
import tempfile
from pathlib import Path

import numpy as np

__all__ = ["MAGIC", "SlotFileError", "read_slot", "valid_filename", "write_slot"]

MAGIC = b"STRATA-SLOT\x00"
VERSION = 1
_LEN = struct.Struct("<I")
MAX_HEADER = 1 << 16
# llama-server's fs_validate_filename, in spirit: a plain name within the folder
_NAME = re.compile(r"[A-Za-z0-9._-]{1,255}")


class SlotFileError(ValueError):
    """A slot file that is not one, or not of this model."""


def valid_filename(name: str) -> bool:
    """A plain file name (letters, digits, `.`, `_`, `-`), not `.` or `..` nor hidden."""
    return bool(_NAME.fullmatch(name)) and not name.startswith(".")


def _no_constant(name: str) -> None:
    raise ValueError(f"{name} is not a number here")


def write_slot(path: Path, model: str, tokens: list[int], kv: bytes) -> int:
    """Writes the file; returns its size in bytes."""
    head = json.dumps(
        {"version": VERSION, "model": model, "n_tokens": len(tokens), "n_bytes": len(kv)}
    ).encode()
    toks = np.asarray(tokens, dtype="<i4").tobytes()
    fd, tmp = tempfile.mkstemp(prefix=".slot-", suffix=".part", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            for part in (MAGIC, _LEN.pack(len(head)), head, toks, kv):
                f.write(part)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return len(MAGIC) + _LEN.size + len(head) + len(toks) + len(kv)


def read_slot(path: Path, model: str) -> tuple[list[int], bytes, int]:
    """(tokens, KV export, bytes read) of a file `write_slot` wrote for `model`; SlotFileError
    for anything else (another model, a truncated or foreign file)."""
    data = path.read_bytes()
    if not data.startswith(MAGIC):
        raise SlotFileError(f"{path.name}: not a slot file")
    at = len(MAGIC)
    if len(data) < at + _LEN.size:
        raise SlotFileError(f"{path.name}: truncated header")
    (n_head,) = _LEN.unpack_from(data, at)
    at += _LEN.size
    if n_head > MAX_HEADER or len(data) < at + n_head:
        raise SlotFileError(f"{path.name}: truncated header")
    try:
        head = json.loads(data[at : at + n_head], parse_constant=_no_constant)
        version, owner = head["version"], head["model"]
        n_tok, n_bytes = head["n_tokens"], head["n_bytes"]
        if not all(type(n) is int for n in (n_tok, n_bytes)):
            raise TypeError("n_tokens and n_bytes must be whole numbers")
    except (ValueError, KeyError, TypeError) as e:
        raise SlotFileError(f"{path.name}: bad header ({e})") from None
    if version != VERSION:
        raise SlotFileError(f"{path.name}: slot file version {version}, not {VERSION}")
    if owner != model:
        raise SlotFileError(f"{path.name}: saved by another model ({owner})")
    at += n_head
    if n_tok < 0 or n_bytes < 0 or len(data) != at + 4 * n_tok + n_bytes:
        raise SlotFileError(f"{path.name}: {len(data)} bytes, not what its header says")
    tokens = np.frombuffer(data, dtype="<i4", count=n_tok, offset=at).tolist()
    return tokens, data[at + 4 * n_tok :], len(data)
