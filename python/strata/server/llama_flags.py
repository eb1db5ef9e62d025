"""llama-server flags without a Strata setting of their own, so that its command lines move
over: the ones that ask for what Strata always does are accepted; `-ctk`/`-ctv` become
`kv_type` where they agree; the placement flags are refused with Strata's way to say it.
(The flags that mean the same as a setting are that setting's aliases: `Config`'s `llama`.)"""

from __future__ import annotations

import argparse
from typing import Any

from strata.errors import ConfigError

# flags → why they are accepted without effect (Strata always does what they ask)
_ALWAYS: dict[tuple[str, ...], str] = {
    ("--jinja",): "chat templates are always rendered with Jinja",
    ("-cb", "--cont-batching"): "batching is always continuous",
    ("--metrics",): "/metrics is always served",
    ("-fa", "--flash-attn"): "Strata's attention kernels are its own, with no switch",
    ("-ub", "--ubatch-size"): "Strata sizes the device's batches itself (--prefill-chunk)",
    ("-dt", "--defrag-thold"): "Strata's KV cache needs no defragmenting",
}
_PLACEMENT = (
    "Strata places the model itself: with --device cuda every layer's dense weights are on "
    "the GPU and the experts that fit --vram-budget-mib (or --vram-slots) are cached there, "
    "the rest computed by the CPU pool where they lie in RAM"
)
_REFUSED: dict[tuple[str, ...], str] = {
    ("-ngl", "--n-gpu-layers", "--gpu-layers"): _PLACEMENT,
    ("-ncmoe", "--n-cpu-moe"): _PLACEMENT,
    ("-ot", "--override-tensor"): _PLACEMENT,
    ("--mlock",): "--ram-mode resident reads the experts into RAM (mmap maps them)",
    ("--no-mmap",): "--ram-mode resident reads the experts into RAM (mmap maps them)",
}
_NO_VALUE = {"--jinja", "-cb", "--metrics", "--mlock", "--no-mmap"}


def _name(flags: tuple[str, ...]) -> str:
    """The flag's long name, as llama-server's help writes it first."""
    return next(f for f in flags if f.startswith("--"))


def _dest(flags: tuple[str, ...]) -> str:
    return "llama_" + _name(flags).lstrip("-").replace("-", "_")


def add_llama_flags(p: argparse.ArgumentParser) -> None:
    """The flags above, and llama-server's K and V cache types (one `kv_type` here)."""
    g = p.add_argument_group("llama-server flags without a setting of their own")
    notes = {**{f: f"accepted: {w}" for f, w in _ALWAYS.items()}, **_REFUSED}
    for flags, note in notes.items():
        dest = _dest(flags)
        help = note if flags in _ALWAYS else f"refused: {note}"
        if flags[0] in _NO_VALUE:
            g.add_argument(*flags, dest=dest, action="store_true", help=help)
        elif flags[0] == "-fa":  # a value (on, off, auto), or none in older command lines
            g.add_argument(*flags, dest=dest, nargs="?", const="on", default=None, help=help)
        else:
            g.add_argument(*flags, dest=dest, default=None, help=help)
    for flags, dest in (
        (("-ctk", "--cache-type-k"), "llama_cache_k"),
        (("-ctv", "--cache-type-v"), "llama_cache_v"),
    ):
        g.add_argument(*flags, dest=dest, default=None, help="with the other, --kv-type")


def apply_llama_flags(ns: argparse.Namespace) -> None:
    """Refuse the placement flags (ConfigError naming Strata's way); `-ctk`/`-ctv` into
    `kv_type` (both, and equal: Strata's cache holds K and V in one type)."""
    for flags, why in _REFUSED.items():
        v: Any = getattr(ns, _dest(flags))
        if v:
            raise ConfigError(f"{_name(flags)}: not a Strata setting; {why}")
    k, v = ns.llama_cache_k, ns.llama_cache_v
    if k is None and v is None:
        return
    if k != v:
        raise ConfigError(
            f"--cache-type-k {k} / --cache-type-v {v}: Strata's KV cache has one type for K "
            "and V (--kv-type): give both the same"
        )
    if ns.kv_type is not None and ns.kv_type != k:
        raise ConfigError(f"--cache-type-k {k} and --kv-type {ns.kv_type} disagree")
    ns.kv_type = k
