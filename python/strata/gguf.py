"""GGUFFile: the Python face of the Rust GGUF reader (mmap, zero-copy views)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from os import PathLike
from pathlib import Path
from types import TracebackType
from typing import Any

import numpy as np
import numpy.typing as npt

from strata._core import GGUFReader

__all__ = ["GGUFFile", "TensorInfo"]


@dataclass(frozen=True, slots=True)
class TensorInfo:
    name: str
    type: str  # ggml type name, e.g. "Q4_K"
    shape: tuple[int, ...]  # numpy order (ggml ne reversed)
    nbytes: int
    shard: int
    offset: int  # absolute byte offset inside its shard


class GGUFFile:
    """A GGUF model, one file or split shards (open any shard's path).

    Raises `strata.errors.GGUFError` naming the file, the byte offset and what is wrong.
    """

    def __init__(self, path: str | PathLike[str]) -> None:
        self.path = Path(path)
        self._r: GGUFReader | None = GGUFReader(self.path)
        self.metadata: dict[str, Any] = self._r.metadata()
        self.tensors: Mapping[str, TensorInfo] = {
            name: TensorInfo(name, ty, tuple(shape), nbytes, shard, off)
            for name, ty, shape, nbytes, shard, off in self._r.tensor_infos()
        }
        self.shard_paths: list[Path] = [Path(p) for p in self._r.shard_paths()]

    @property
    def architecture(self) -> str | None:
        arch = self.metadata.get("general.architecture")
        return arch if isinstance(arch, str) else None

    def _reader(self) -> GGUFReader:
        if self._r is None:
            raise ValueError(f"{self.path}: the GGUF file is closed")
        return self._r

    def raw(self, name: str) -> npt.NDArray[np.uint8]:
        """Zero-copy, read-only view of the tensor's bytes."""
        return self._reader().raw(name)

    def dequantize(self, name: str) -> npt.NDArray[np.float32]:
        """The tensor as float32, in its numpy shape."""
        flat = self._reader().dequantize(name)
        return flat.reshape(self.tensors[name].shape)

    def close(self) -> None:
        if self._r is not None:
            self._r.close()
            self._r = None

    def __enter__(self) -> GGUFFile:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        return (
            f"GGUFFile({str(self.path)!r}, arch={self.architecture!r}, tensors={len(self.tensors)})"
        )
