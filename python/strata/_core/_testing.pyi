"""Type stubs for `strata._core._testing`: PRIVATE test and benchmark hooks, not the product's
surface and not a stable API. Each runs one GPU kernel (or the runtime's smoke, timing and
fault paths) on host arrays, for the kernel tests (tests/test_gpu_*.py) and the kernel benches
(bench/gpu_*.py), and the CPU multi-token dot path per ISA (tests/test_gemm_isa.py,
bench/bench_gemm_isa.py); the product reaches the kernels only through `strata._core.Model`."""

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

__all__ = [
    "gpu_add_copy",
    "gpu_argmax",
    "gpu_attention",
    "gpu_bad_launch",
    "gpu_bench_attention",
    "gpu_bench_matmul",
    "gpu_bench_matmul_graph",
    "gpu_bench_moe",
    "gpu_bench_norm",
    "gpu_bench_router",
    "gpu_copy_gbps",
    "gpu_get_rows",
    "gpu_kernel_params",
    "gpu_matmul",
    "gpu_moe",
    "gpu_norm_add_rms",
    "gpu_norm_rms",
    "gpu_quant_supports",
    "gpu_rope_neox",
    "gpu_rope_qkv",
    "gpu_roundtrip",
    "gpu_router_topk",
    "gpu_smoke",
    "gpu_smoke_graph",
    "gpu_time_smoke",
    "multi_dot",
    "multi_dot_bench",
    "rows_dot",
]

# the runtime: round trips, a smoke kernel (eager, graph, timed), kernel metadata, a fault
def gpu_roundtrip(data: bytes, offset: int = 0, length: int | None = None) -> bytes: ...
def gpu_smoke(x: npt.NDArray[np.float32], a: float, b: float) -> npt.NDArray[np.float32]: ...
def gpu_smoke_graph(
    x: npt.NDArray[np.float32], a: float, b: float, replays: int
) -> npt.NDArray[np.float32]: ...
def gpu_time_smoke(n: int, reps: int) -> float: ...
def gpu_kernel_params(name: str) -> list[int] | None: ...
def gpu_bad_launch() -> None: ...

# the forward pass's kernels one at a time (rust/src/py/cuda_model.rs)
def gpu_copy_gbps(mib: int, reps: int) -> float: ...
def gpu_norm_rms(
    x: npt.NDArray[np.float32], w: npt.NDArray[np.float32], eps: float
) -> npt.NDArray[np.float32]: ...
def gpu_norm_add_rms(
    x: npt.NDArray[np.float32], y: npt.NDArray[np.float32], w: npt.NDArray[np.float32], eps: float
) -> tuple[npt.NDArray[np.float32], npt.NDArray[np.float32]]: ...
def gpu_rope_neox(
    x: npt.NDArray[np.float32],
    cos: npt.NDArray[np.float32],
    sin: npt.NDArray[np.float32],
    pos0: int,
    n_rot: int,
) -> npt.NDArray[np.float32]: ...
def gpu_rope_qkv(
    kv: str,
    q: npt.NDArray[np.float32],
    k: npt.NDArray[np.float32],
    v: npt.NDArray[np.float32],
    qn: npt.NDArray[np.float32] | None,
    kn: npt.NDArray[np.float32] | None,
    bias: tuple[npt.NDArray[np.float32], npt.NDArray[np.float32], npt.NDArray[np.float32]] | None,
    cos: npt.NDArray[np.float32],
    sin: npt.NDArray[np.float32],
    pos0: int,
    slot: int,
    kc: npt.NDArray[np.uint8],
    vc: npt.NDArray[np.uint8],
    n_rot: int,
    eps: float,
    neox: bool,
) -> tuple[npt.NDArray[np.float32], npt.NDArray[np.uint8], npt.NDArray[np.uint8]]: ...
def gpu_attention(
    kv: str,
    q: npt.NDArray[np.float32],
    kc: npt.NDArray[np.uint8],
    vc: npt.NDArray[np.uint8],
    pos0: int,
    slot: int,
    n_split: int,
    scale: float,
) -> npt.NDArray[np.float32]: ...
def gpu_router_topk(
    logits: npt.NDArray[np.float32], k: int, norm: bool
) -> tuple[npt.NDArray[np.int32], npt.NDArray[np.float32]]: ...
def gpu_argmax(x: npt.NDArray[np.float32]) -> npt.NDArray[np.int32]: ...
def gpu_add_copy(
    x: npt.NDArray[np.float32], y: npt.NDArray[np.float32]
) -> tuple[npt.NDArray[np.float32], npt.NDArray[np.float32]]: ...

# the quantized matrix and routed-expert kernels (rust/src/py/cuda_quant.rs)
def gpu_matmul(
    type_name: str, w: bytes, rows: int, k: int, x: npt.NDArray[np.float32]
) -> npt.NDArray[np.float32]: ...
def gpu_get_rows(
    type_name: str, w: bytes, rows: int, k: int, ids: npt.NDArray[np.int32]
) -> npt.NDArray[np.float32]: ...
def gpu_moe(
    ty_gate: str,
    ty_up: str,
    ty_down: str,
    gate: Sequence[bytes | None],
    up: Sequence[bytes | None],
    down: Sequence[bytes | None],
    ff: int,
    h: int,
    ids: npt.NDArray[np.int32],
    weights: npt.NDArray[np.float32],
    x: npt.NDArray[np.float32],
    y: npt.NDArray[np.float32],
) -> tuple[npt.NDArray[np.float32], npt.NDArray[np.float32]]: ...
def gpu_quant_supports(type_name: str) -> bool: ...

# kernel timings (rust/src/py/cuda_*_bench.rs)
def gpu_bench_matmul(
    type_name: str, rows: int, k: int, n_tok: int, reps: int
) -> tuple[float, int]: ...
def gpu_bench_moe(
    ty_gate_up: str,
    ty_down: str,
    n_expert: int,
    ff: int,
    h: int,
    top_k: int,
    n_tok: int,
    reps: int,
    variant: str = "current",
    graph: bool = False,
) -> tuple[float, float, int, int]: ...
def gpu_bench_norm(n: int, rows: int, fused: bool, reps: int) -> float: ...
def gpu_bench_attention(
    kv: str, n_head: int, n_kv: int, d: int, n_ctx: int, pos: int, n_tok: int, reps: int
) -> float: ...
def gpu_bench_router(n_expert: int, k: int, n_tok: int, reps: int) -> float: ...
def gpu_bench_matmul_graph(
    type_name: str,
    rows: int,
    k: int,
    n_tok: int,
    reps: int,
    row_per_block: bool | None = None,
    staged: bool | None = None,
) -> float: ...

# the CPU multi-token (prefill) dot path: one row against several tokens, per ISA / variant
def multi_dot(
    type_name: str,
    n: int,
    row: bytes,
    acts: Sequence[bytes],
    order: str = "single",
    isa: str = "auto",
    vnni: bool | None = None,
) -> list[float]: ...
def multi_dot_bench(
    type_name: str,
    n: int,
    rows: bytes,
    acts: Sequence[bytes],
    order: str = "single",
    isa: str = "auto",
    vnni: bool | None = None,
    reps: int = 5,
    threads: int = 1,
    group: int | None = None,
    tiles: str | None = None,
) -> float: ...
def rows_dot(
    type_name: str, n: int, rows: bytes, acts: Sequence[bytes], order: str, tiles: str
) -> list[float]: ...
