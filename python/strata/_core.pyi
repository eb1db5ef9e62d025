"""Type stubs for the Rust extension `strata._core` (checked by mypy.stubtest)."""

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
    "ModelError",
    "QuantError",
    "ShapeError",
    "StrataError",
    "__version__",
    "dequantize_bytes",
    "matmul_reference",
    "moe_reference",
    "pool_supports",
    "ram_read_gbps",
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

def dequantize_bytes(type_name: str, data: bytes, n: int) -> npt.NDArray[np.float32]: ...

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
