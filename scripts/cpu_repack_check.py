"""The load-time repacked copies (`cpu_repack`: the Q6_K head, the Q4_K attention projections)
on this CPU, bitwise the original layout: decode steps of one to four one-token rows over four
slots, with the copies and without. For CPUs the CI machine lacks (the device host's AVX-512
VNNI Xeon), where tests/test_cpu_repack.py's model cache does not fit the carry.

    python3 scripts/cpu_repack_check.py MODEL.gguf      # a Q4_K_M file (the test model's)

Prints the CPU's AVX-512 features, the dot ISAs, the copies' bytes; exits 1 unless the logits
are bitwise equal and the projections were repacked.
"""

from __future__ import annotations

import sys

import numpy as np
from strata import _core
from strata._core import Model

PROMPT = [1, 17, 300, 5, 99, 1024, 7, 7, 42, 511, 3, 250]
BATCHES = [[0, 1, 2, 3], [1, 3], [0, 1, 2], [2], [3, 2, 1, 0]]


def steps(path: str, **kw: object) -> tuple[list[np.ndarray], int]:
    m = Model.open(path, n_ctx=64, n_slots=4, **kw)  # type: ignore[arg-type]
    for s in range(4):
        m.forward(s, [p + s for p in PROMPT], logits="none")
    out: list[np.ndarray] = []
    for i, batch in enumerate(BATCHES):
        rows = m.forward_batch([(s, [(37 * s + 11 * i) % 500 + 1], "last") for s in batch])
        out += [np.asarray(r) for r in rows]
    return out, int(m.hparams["repack_proj_bytes"])


def main() -> int:
    path = sys.argv[1]
    feats = [f for f in _core.cpu_features() if f.startswith("avx512")]
    print(f"AVX-512 features {feats}; dot ISAs {_core.dot_isas()}")
    ref, none = steps(path, cpu_repack=False)
    got, used = steps(path, cpu_repack=True)
    pairs = zip(ref, got, strict=True)
    same = all(np.array_equal(a.view(np.uint32), b.view(np.uint32)) for a, b in pairs)
    print(f"projection copies: off {none} B, on {used} B; {len(ref)} logit rows bitwise: {same}")
    return 0 if same and used > 0 and none == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
