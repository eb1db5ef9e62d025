"""llama.cpp's sampler chain by name (llama-server's `samplers`, `--samplers`,
`--sampler-seq`, a GGUF's `general.sampling.sequence`): the names and one-letter codes it takes,
and `SamplingParams` as the chain would sample. Strata runs its samplers in one order
(llama.cpp's default), so a chain is a choice of which are on."""

from __future__ import annotations

from typing import Any

import msgspec

from strata.sampling import SamplingParams

MAX_LIST = 64  # samplers in a chain

# llama.cpp's sampler names (and the aliases it takes) → the canonical name; `samplers` may
# also be a string of their one-letter codes
CANONICAL = (
    "dry", "top_k", "typ_p", "top_p", "top_n_sigma", "min_p", "xtc", "temperature", "infill",
    "penalties", "adaptive_p",
)  # fmt: skip
ALIASES = {
    **{c: c for c in CANONICAL},
    **{c.replace("_", "-"): c for c in CANONICAL if "_" in c},
    **{c.replace("_", ""): c for c in CANONICAL if "_" in c},
    "nucleus": "top_p",
    "temp": "temperature",
    "typ": "typ_p",
    "typical": "typ_p",
    "typical-p": "typ_p",
}
CHARS = dict(zip("dkypsmxtiea", CANONICAL, strict=True))
# the samplers Strata runs, in the one order it runs them (llama.cpp's default order)
ORDER = (
    "penalties", "dry", "top_n_sigma", "top_k", "typ_p", "top_p", "min_p", "xtc", "temperature",
    "infill",
)  # fmt: skip


def _bad(message: str) -> ValueError:
    err = ValueError(message)
    err.param = "samplers"  # type: ignore[attr-defined]
    return err


def parse_chain(text: str) -> list[str] | str:
    """A chain as llama.cpp's flags and metadata write it: names separated by ';'
    (`--samplers`, `general.sampling.sequence`), or one-letter codes (`--sampler-seq`)."""
    if ";" in text or text.strip().lower() in ALIASES:
        return [n.strip() for n in text.split(";") if n.strip()]
    return text.strip()


def sampler_names(value: list[str] | str) -> list[str]:
    """llama-server's `samplers` (names or one-letter codes) as canonical names; a 400 for
    one it does not know (a ValueError naming `samplers`)."""
    if len(value) > MAX_LIST:
        raise _bad(f"samplers: at most {MAX_LIST}")
    names = [value[i] for i in range(len(value))] if isinstance(value, str) else value
    table = CHARS if isinstance(value, str) else ALIASES
    out = []
    for n in names:
        c = table.get(n if isinstance(value, str) else n.lower())
        if c is None:
            raise _bad(f"samplers: unknown sampler {n!r}")
        out.append(c)
    return out


def with_samplers(params: SamplingParams, value: list[str] | str) -> SamplingParams:
    """`params` as llama.cpp's chain of the named samplers would sample: a sampler left out
    is off (temperature left out: the draw is at temperature 1); "infill" adds llama.cpp's
    infill sampler, "adaptive_p" llama.cpp's adaptive-p draw (in place of the plain one, as
    there: wherever it stands). The ones Strata runs must come in its order (a 400
    otherwise)."""
    names = sampler_names(value)
    # the ones that act under these settings: a sampler that is off may stand anywhere
    on = {
        "penalties": params.penalized,
        "dry": params.dry,
        "top_n_sigma": params.top_n_sigma > 0.0,
        "top_k": params.top_k > 0,
        "typ_p": params.typical_p < 1.0,
        "top_p": params.top_p < 1.0,
        "min_p": params.min_p > 0.0,
        "xtc": params.xtc,
    }
    ours = [n for n in names if n in ORDER and on.get(n, True)]
    if ours != sorted(set(ours), key=ORDER.index):
        raise _bad("samplers: Strata runs " + ", ".join(ORDER) + " in this order (each once)")
    off: dict[str, Any] = {}
    if "penalties" not in names:
        off.update(repetition_penalty=1.0, presence_penalty=0.0, frequency_penalty=0.0)
    if "top_k" not in names:
        off["top_k"] = 0
    if "top_p" not in names:
        off["top_p"] = 1.0
    if "min_p" not in names:
        off["min_p"] = 0.0
    if "dry" not in names:
        off["dry_multiplier"] = 0.0
    if "top_n_sigma" not in names:
        off["top_n_sigma"] = -1.0
    if "typ_p" not in names:
        off["typical_p"] = 1.0
    if "xtc" not in names:
        off["xtc_probability"] = 0.0
    if "temperature" not in names:  # no temperature stage, so no dynamic one either
        off.update(temperature=1.0, dynatemp_range=0.0)
    return msgspec.structs.replace(
        params, infill="infill" in names, adaptive_p="adaptive_p" in names, **off
    )


def default_chain(
    metadata: dict[str, Any], configured: str, defaults: SamplingParams
) -> tuple[list[str] | str | None, list[str]]:
    """The chain a request that names none runs: `configured` (the server's `samplers`),
    else the model's `general.sampling.sequence` (left out, and named in the notes, where
    Strata cannot run it over `defaults`), else None (llama.cpp's default chain)."""
    if configured:
        return parse_chain(configured), []
    seq = metadata.get("general.sampling.sequence")
    if seq is None:
        return None, []
    if not isinstance(seq, str):
        return None, [f"general.sampling.sequence: not a string ({seq!r}); left out"]
    chain = [n for n in seq.split(";") if n.strip()]
    try:
        with_samplers(defaults, chain)
    except ValueError as e:
        return None, [f"general.sampling.sequence: {e}; left out"]
    return chain, []
