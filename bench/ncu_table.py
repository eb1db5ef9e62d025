"""Sums an Nsight Compute CSV (`ncu --metrics gpu__time_duration.sum --csv`) by kernel name and
prints one table per file: launches, total and mean microseconds, most expensive first.

    python bench/ncu_table.py strata.csv llama.csv
"""

from __future__ import annotations

import csv
import sys

UNIT_US = {"ns": 1e-3, "nsecond": 1e-3, "us": 1.0, "usecond": 1.0, "ms": 1e3, "msecond": 1e3}


def table(path: str, top: int = 24) -> None:
    with open(path, newline="") as f:
        rows = [r for r in csv.reader(f) if len(r) > 10]
    head, rows = rows[0], rows[1:]
    name_i, val_i = head.index("Kernel Name"), head.index("Metric Value")
    unit_i = head.index("Metric Unit")
    agg: dict[str, list[float]] = {}
    for r in rows:
        us = float(r[val_i].replace(",", "")) * UNIT_US[r[unit_i]]
        a = agg.setdefault(r[name_i][:72], [0.0, 0.0])
        a[0] += 1
        a[1] += us
    total = sum(t for _, t in agg.values())
    print(f"{path}: {len(rows)} kernels, {total:.0f} us")
    print(f"  {'kernel':72s} {'n':>5s} {'total us':>10s} {'mean us':>8s}")
    for name, (n, t) in sorted(agg.items(), key=lambda kv: -kv[1][1])[:top]:
        print(f"  {name:72s} {n:5.0f} {t:10.1f} {t / n:8.2f}")


if __name__ == "__main__":
    for p in sys.argv[1:]:
        table(p)
