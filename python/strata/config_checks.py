"""The checks of `strata.config.Config`: each setting of its type and range, and no two
settings that contradict each other (one of them would change nothing)."""

from __future__ import annotations

import itertools
import math
import numbers
import os
from collections.abc import Callable
from dataclasses import fields

from strata.config import Config, _kind
from strata.errors import ConfigError
from strata.sampling import SamplingParams
from strata.sampling_chain import parse_chain, with_samplers


def check_config(c: Config) -> None:
    """Each setting of its type and range, and no two that contradict each other."""

    def bad(name: str, why: str) -> ConfigError:
        return ConfigError(f"{name}: {why} (got {getattr(c, name)!r})")

    # each value of its field's type (a Config built directly gets no coercion): a bool
    # for a bool, a whole number for an int, a number for a float, text for text
    for f in fields(c):
        v = getattr(c, f.name)
        if v is None and f.default is None:  # unset: resolved later (its help says how)
            continue
        kind: type = _kind(f)
        if kind is bool:
            ok = isinstance(v, bool)
        elif kind is int:
            ok = isinstance(v, numbers.Integral) and not isinstance(v, bool)
        elif kind is float:
            ok = isinstance(v, numbers.Real) and not isinstance(v, bool)
        else:
            ok = isinstance(v, kind)
        if not ok:
            raise bad(f.name, f"expects {kind.__name__}")

    if c.n_ctx != 0 and c.n_ctx < 16:
        raise bad("n_ctx", "must be at least 16 (or 0: the model's training context)")
    if not 1 <= c.parallel <= 4096:
        raise bad("parallel", "must be in 1..4096")
    if c.n_ctx != 0 and c.n_ctx_seq < 16:
        raise bad(
            "n_ctx",
            f"leaves {c.n_ctx_seq} tokens to each of the {c.parallel} parallel "
            "sequences (n_ctx / parallel); each needs at least 16",
        )
    if c.prefill_chunk < 1:
        raise bad("prefill_chunk", "must be at least 1")
    if not 0 <= c.threads <= 1024:
        raise bad("threads", "must be in 0..1024")
    if not 0 <= c.fill_threads <= 1024:
        raise bad("fill_threads", "must be in 0..1024")
    if not 1 <= c.readahead_threads <= 64:
        raise bad("readahead_threads", "must be in 1..64")
    if c.profile_tokens < 0:
        raise bad("profile_tokens", "must be >= 0")
    if c.vram_budget_mib < -1 or c.vram_budget_mib == 0:
        raise bad("vram_budget_mib", "must be -1 (automatic) or > 0")
    if c.vram_reserve_mib < 0:
        raise bad("vram_reserve_mib", "must be >= 0")
    if c.vram_slots < -1:
        raise bad("vram_slots", "must be -1 (from the budget) or >= 0")
    if not 0 <= c.adapt_every < 1 << 32:
        raise bad("adapt_every", "must be in 0..4294967295")
    if c.stream_min_tokens < 0:
        raise bad("stream_min_tokens", "must be >= 0")
    if c.stream_chunk < 0:
        raise bad("stream_chunk", "must be >= 0")
    if c.stream_threads < 0:
        raise bad("stream_threads", "must be >= 0")
    if c.defer_experts < 0:
        raise bad("defer_experts", "must be >= 0 (0: off)")
    if c.slot_save_path and not os.path.isdir(c.slot_save_path):
        raise bad("slot_save_path", "must be an existing folder (or empty: off)")
    if not 0 <= c.adapt_swaps <= 4096:
        raise bad("adapt_swaps", "must be in 0..4096")
    if not (c.pcie_frac == -1.0 or 0.0 <= c.pcie_frac <= 1.0):
        raise bad("pcie_frac", "must be -1 (auto: measured) or in 0..1")
    stages = c.stage_devices()
    if stages is None:
        raise bad("gpus", 'must be device numbers, comma-separated (e.g. "0" or "0,0")')
    bounds = c.split_bounds()
    if bounds is None:
        raise bad("layer_split", 'must be "auto" or layer numbers, comma-separated')
    if bounds and len(bounds) != len(stages) - 1:
        raise bad(
            "layer_split",
            f"needs {len(stages) - 1} boundaries for {len(stages)} stages (gpus), one fewer "
            "than the stages",
        )
    if bounds and (bounds[0] < 1 or any(a >= b for a, b in itertools.pairwise(bounds))):
        raise bad(
            "layer_split",
            "boundaries must increase strictly from 1 (every stage holds a layer)",
        )
    if c.pipeline_windows not in (1, 2):
        raise bad("pipeline_windows", "must be 1 or 2")
    if c.pipeline_windows == 2 and len(stages) < 2:
        raise bad("pipeline_windows", "2 needs at least two stages (gpus)")
    for f in fields(c):
        choices = f.metadata.get("choices")
        if choices and getattr(c, f.name) not in choices:
            raise bad(f.name, f"must be one of {', '.join(choices)}")
    if not (0 < c.port < 65536):
        raise bad("port", "must be in 1..65535")
    if c.max_queue < 0:
        raise bad("max_queue", "must be >= 0")
    if c.max_batch_tokens < 1:
        raise bad("max_batch_tokens", "must be at least 1")
    if not -1 <= c.reasoning_budget < 1 << 31:
        raise bad("reasoning_budget", "must be -1 (no cap) or in 0..2^31-1")
    if not 1 <= c.spec_max <= 64:
        raise bad("spec_max", "must be in 1..64")
    if not 0 <= c.spec_min <= c.spec_max:  # 0 as 1: llama.cpp's --draft-min default
        raise bad("spec_min", "must be in 0..spec_max")
    if not (math.isfinite(c.spec_p_min) and 0.0 <= c.spec_p_min <= 1.0):
        raise bad("spec_p_min", "must be in [0, 1]")
    if c.cache_reuse < 0:
        raise bad("cache_reuse", "must be 0 (off) or the shortest chunk to move (> 0)")
    if c.prompt_cache_mib < -1:
        raise bad("prompt_cache_mib", "must be -1 (automatic), 0 (off) or > 0")
    for name in (
        "engine_silence_s",
        "request_timeout_s",
        "ram_budget_gib",
        "drain_timeout_s",
        "fake_step_ms",
        "fake_load_s",
    ):
        v = getattr(c, name)
        if not math.isfinite(v) or v < 0:
            raise bad(name, "must be a finite number >= 0")
    if c.max_tokens_limit < 1:
        raise bad("max_tokens_limit", "must be at least 1")
    if c.n_predict < -1 or c.n_predict == 0:
        raise bad("n_predict", "must be -1 (to the context's end) or >= 1")
    try:
        params = SamplingParams(**c.sampling_settings()).validate()
        if c.samplers:
            with_samplers(params, parse_chain(c.samplers))
    except ValueError as e:  # named as the setting, not the sampler's field
        name = getattr(e, "param", "")
        names = {"repetition_penalty": "repeat_penalty"}
        raise ConfigError(f"{names.get(name, name)}: {e}") from None
    if c.max_top_logprobs < 0:
        raise bad("max_top_logprobs", "must be >= 0")
    if c.max_body_bytes < 1024:
        raise bad("max_body_bytes", "must be at least 1024")
    if c.ram_mode == "budget" and c.ram_budget_gib <= 0:
        raise bad("ram_budget_gib", "must be > 0 when ram_mode is budget")
    _check_combinations(c, bad)


def _check_combinations(c: Config, bad: Callable[[str, str], ConfigError]) -> None:
    """Settings that contradict each other: one of them would change nothing."""
    if c.device != "cuda":
        for f in fields(c):
            if f.metadata.get("cuda_only") and getattr(c, f.name) != f.default:
                raise bad(f.name, f"applies to device cuda only (device is {c.device})")
    if c.device == "cuda" and c.kv_type in ("f32", "q4_0"):
        raise bad("kv_type", "runs on the CPU path only; the GPU's KV cache is f16 or q8_0")
    if c.readahead == "on" and c.ram_mode == "resident":
        raise bad("readahead", "on has nothing to read ahead when ram_mode is resident")
    if c.device == "cuda" and (c.ram_mode != "mmap" or c.readahead == "on"):
        name = "ram_mode" if c.ram_mode != "mmap" else "readahead"
        raise bad(name, "is the CPU path's RAM tier; the GPU path reads experts in place (mmap)")
    if c.ram_budget_gib and c.ram_mode == "resident":
        raise bad("ram_budget_gib", "is read by ram_mode budget or mmap, not resident")
    if c.spec == "mtp" and c.device == "cuda":
        raise bad("spec", "mtp runs the model's MTP layer on the CPU path only")
    if c.spec == "off":
        for f in fields(c):
            if f.name.startswith("spec_") and getattr(c, f.name) != f.default:
                raise bad(f.name, "is read while spec is on only (spec is off)")
    if c.spec_draft_model and c.spec not in ("draft", "auto"):
        raise bad("spec_draft_model", f"is read by spec draft or auto only (spec is {c.spec})")
