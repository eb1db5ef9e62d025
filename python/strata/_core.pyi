"""Type stubs for the Rust extension `strata._core` (checked by mypy.stubtest)."""

from collections.abc import Sequence
from os import PathLike
from typing import Any, final

import numpy as np
import numpy.typing as npt

__all__ = [
    "ConfigError",
    "ExpertPool",
    "GGUFError",
    "GGUFReader",
    "MapOwner",
    "MoELayer",
    "Model",
    "ModelError",
    "QuantError",
    "ShapeError",
    "StrataError",
    "__version__",
    "cpu_features",
    "dequantize_bytes",
    "dot_isa",
    "dot_isas",
    "matmul_reference",
    "moe_reference",
    "pool_supports",
    "quantize_act",
    "ram_read_gbps",
    "runnable_types",
    "set_dot_isa",
    "vec_dot",
]
__version__: str

class StrataError(Exception): ...
class GGUFError(StrataError): ...
class QuantError(StrataError): ...
class ConfigError(StrataError): ...
class ShapeError(StrataError): ...
class ModelError(StrataError): ...

@final
class MapOwner: ...

@final
class GGUFReader:
    def __new__(cls, path: str | PathLike[str]) -> GGUFReader: ...
    def metadata(self) -> dict[str, Any]: ...
    def tensor_infos(self) -> list[tuple[str, str, list[int], int, int, int]]: ...
    def shard_paths(self) -> list[str]: ...
    def raw(self, name: str) -> npt.NDArray[np.uint8]: ...
    def dequantize(self, name: str) -> npt.NDArray[np.float32]: ...
    def close(self) -> None: ...

def dequantize_bytes(
    type_name: str, data: bytes | npt.NDArray[np.uint8], n: int
) -> npt.NDArray[np.float32]: ...
def quantize_act(type_name: str, x: npt.NDArray[np.float32]) -> bytes: ...
def vec_dot(type_name: str, n: int, row: bytes, act: bytes, isa: str = "auto") -> float: ...
def cpu_features() -> list[str]: ...
def dot_isa() -> str: ...
def dot_isas() -> list[str]: ...

@final
class Model:
    @staticmethod
    def open(
        path: str | PathLike[str],
        n_ctx: int = 4096,
        n_slots: int = 1,
        kv_type: str = "f16",
        prefill_chunk: int = 512,
    ) -> Model: ...
    @property
    def hparams(self) -> dict[str, Any]: ...
    @property
    def n_vocab(self) -> int: ...
    @property
    def n_ctx(self) -> int: ...
    @property
    def n_slots(self) -> int: ...
    def forward(
        self, slot: int, token_ids: Sequence[int], logits: str = "last"
    ) -> npt.NDArray[np.float32]: ...
    def slot_len(self, slot: int) -> int: ...
    def truncate(self, slot: int, n: int) -> None: ...
    def free(self, slot: int) -> None: ...

def runnable_types() -> list[str]: ...
def set_dot_isa(isa: str) -> None: ...

@final
class MoELayer:
    def __new__(
        cls,
        gate_type: str,
        gate: npt.NDArray[np.uint8],
        up_type: str,
        up: npt.NDArray[np.uint8],
        down_type: str,
        down: npt.NDArray[np.uint8],
        n_expert: int,
        hidden: int,
        inter: int,
    ) -> MoELayer: ...
    @property
    def n_expert(self) -> int: ...
    @property
    def hidden(self) -> int: ...
    @property
    def inter(self) -> int: ...
    @property
    def types(self) -> tuple[str, str, str]: ...

@final
class ExpertPool:
    def __new__(
        cls,
        workers: int | None = None,
        host_participates: bool = True,
        pipelined: bool = False,
        pin: bool = True,
        spin_us: int = 2000,
    ) -> ExpertPool: ...
    @property
    def workers(self) -> int: ...
    @property
    def host_participates(self) -> bool: ...
    @property
    def pipelined(self) -> bool: ...
    def moe(
        self,
        layer: MoELayer,
        x: npt.NDArray[np.float32],
        ids: npt.NDArray[np.uint32],
        weights: npt.NDArray[np.float32],
    ) -> npt.NDArray[np.float32]: ...
    def matmul(
        self,
        type_name: str,
        w: npt.NDArray[np.uint8],
        rows: int,
        cols: int,
        x: npt.NDArray[np.float32],
    ) -> npt.NDArray[np.float32]: ...

def moe_reference(
    layer: MoELayer,
    x: npt.NDArray[np.float32],
    ids: npt.NDArray[np.uint32],
    weights: npt.NDArray[np.float32],
) -> npt.NDArray[np.float32]: ...
def matmul_reference(
    type_name: str, w: npt.NDArray[np.uint8], rows: int, cols: int, x: npt.NDArray[np.float32]
) -> npt.NDArray[np.float32]: ...
def pool_supports(type_name: str) -> bool: ...
def ram_read_gbps(threads: int, mib: int = 1024, reps: int = 5) -> float: ...
