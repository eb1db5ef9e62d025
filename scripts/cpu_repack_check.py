"""The load-time repacked copies (`cpu_repack`: the Q6_K head, the Q4_K attention projections)
on this CPU, bitwise the original layout: tests/repack_steps.py's decode steps (one to four
one-token rows over four slots, a window), with the copies and without. For CPUs the CI
machine lacks (the device host's AVX-512 VNNI Xeon), where tests/test_cpu_repack.py's model
cache does not fit the carry.

    python3 scripts/cpu_repack_check.py MODEL.gguf      # a Q4_K_M file (the test model's)

Prints the CPU's AVX-512 features, the dot ISAs, the copies' bytes; exits 1 unless the logits
are bitwise equal and the projections were repacked.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
from strata import _core

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from repack_steps import projection_steps


def main() -> int:
    path = sys.argv[1]
    feats = [f for f in _core.cpu_features() if f.startswith("avx512")]
    print(f"AVX-512 features {feats}; dot ISAs {_core.dot_isas()}")
    ref, none = projection_steps(path, cpu_repack=False)
    got, used = projection_steps(path, cpu_repack=True)
    pairs = zip(ref, got, strict=True)
    same = all(np.array_equal(a.view(np.uint32), b.view(np.uint32)) for a, b in pairs)
    print(f"projection copies: off {none} B, on {used} B; {len(ref)} logit rows bitwise: {same}")
    return 0 if same and used > 0 and none == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
