"""The one settings object. CLI flags, `STRATA_*` environment variables, the config file
(TOML), the keyword defaults of `strata._core.Model.open` and the server's `/v1/status` view are
all derived from the fields of `Config`: a setting and its default are named here only.

Precedence, lowest first: field default < config file (`STRATA_CONFIG` or `--config`) <
environment < CLI flags.

Each field belongs to a group (`Config.names(group)`): "model" (the model's and the engine's
own settings, handed to `strata.llm.LLM`), "server" (the server's and the tools') or "test"
(TEST-ONLY switches of the fake engine: settable, but hidden from `--help` and `/v1/status`).
The "core" fields are keywords of `strata._core.Model.open` too, whose defaults it reads from
here (`Config.default`).
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import numbers
import operator
import os
import sys
import warnings
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from strata.errors import ConfigError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

ENV_PREFIX = "STRATA_"
# Fill threads when `fill_threads` is 0: what measured fastest (bench/bench_fill.py,
# docs/BENCHMARKS.md §Expert tier fill).
DEFAULT_FILL_THREADS = 4


# `STRATA_*` variables that are not settings: the build's, the test harness's and the device
# suite's (an unknown `STRATA_*` variable outside this list gets a warning).
OTHER_ENV = (
    "STRATA_CONFIG",
    "STRATA_REQUIRE_KERNELS",
    "STRATA_SKIP_KERNELS",
    "STRATA_NVCC",
    "STRATA_CUDA_ARCHS",
    "STRATA_MOCK_NOOP_KERNELS",
    "STRATA_TEST_MODELS",
    "STRATA_TEST_LLAMA_CPP_VERSION",
    "STRATA_GPU_MODELS",
    "STRATA_TEST_GPUS",
    "STRATA_SUITE_SITE",
    "STRATA_DEVICE_DEPS",
    "STRATA_TEST_ARTIFACTS",
    "STRATA_README_SHOT",
)
GROUPS = ("model", "server", "test")


class UnknownSettingWarning(UserWarning):
    """A `STRATA_*` environment variable that names no setting (probably a typo)."""


def _kind(f: Any) -> type:
    """A setting's value type: its default's, or `kind` where the default is None (unset)."""
    kind: type = f.metadata.get("kind") or type(f.default)
    return kind


def _f(default: Any, help: str, group: str = "model", core: bool = False, **kw: Any) -> Any:
    """A field of `group`; `core`: a keyword of `strata._core.Model.open` too (which takes
    this default when the keyword is left out)."""
    assert group in GROUPS, group
    return field(default=default, metadata={"help": help, "group": group, "core": core, **kw})


def _gpu(default: Any, help: str, **kw: Any) -> Any:
    """A core setting of the GPU path only: set to other than its default with `device` cpu,
    it is a ConfigError (it would change nothing)."""
    return _f(default, help, core=True, cuda_only=True, **kw)


def _s(default: Any, help: str, **kw: Any) -> Any:
    return _f(default, help, group="server", **kw)


def _t(default: Any, help: str, **kw: Any) -> Any:
    return _f(default, "TEST-ONLY: " + help, group="test", **kw)


@dataclass(slots=True)
class Config:
    # model and engine
    model: str = _s(
        "",
        "GGUF path (any shard of a split model); empty: the embedded default model",
        llama=("-m",),
    )
    n_ctx: int = _f(
        4096,
        "context length in tokens across the `parallel` sequences, as llama.cpp's -c with -np: "
        "each sequence holds n_ctx / parallel (n_ctx_seq); 0: the model's training context, "
        "as llama.cpp's -c 0",
        core=True,
        llama=("-c", "--ctx-size"),
    )
    kv_type: str = _f(
        "f16",
        "KV cache type: f16, q8_0, q4_0 (CPU path) or f32 (CPU path)",
        choices=("f16", "q8_0", "q4_0", "f32"),
        core=True,
    )
    device: str = _f(
        "cpu",
        "where the forward pass runs: cpu, or cuda (the KV cache and every weight in the VRAM "
        "of GPU 0; KV cache f16 or q8_0; when the experts do not fit or vram_budget_mib is "
        "set, the hybrid mode: the hottest experts in VRAM, the others on the CPU pool)",
        choices=("cpu", "cuda"),
        core=True,
    )
    prefill_chunk: int = _f(512, "prompt tokens per prefill chunk", core=True)
    threads: int = _f(
        0,
        "CPU compute threads in all, the calling thread included, as llama.cpp's -t (0: one "
        "per physical core)",
        core=True,
        llama=("-t",),
    )
    host_participates: bool = _f(True, "the calling thread takes pool work too", core=True)
    pool_pipeline: bool = _f(
        True,
        "pipelined pool schedule (per-expert readiness, no phase barrier; off: the barrier "
        "schedule, the same results)",
        core=True,
    )
    pool_balanced: bool = _f(
        True,
        "decode calls of the pool cut their tiles to the thread count (off: about 3 tiles per "
        "thread per expert phase, as multi-token calls)",
        core=True,
    )
    cpu_repack: bool = _f(
        True,
        "CPU: repack a Q6_K output head and the Q4_K attention projections at load into "
        "faster layouts for decode (same logits bitwise; costs a copy of them in RAM, reported "
        "as hparams repack_bytes)",
        core=True,
    )
    isa: str = _f(
        "auto",
        "CPU: instruction set of the dot-product kernels (auto: the best this CPU runs; chosen "
        "once per process)",
        choices=("auto", "scalar", "avx2", "avx512"),
        core=True,
    )
    ram_mode: str = _f(
        "mmap", "RAM tier: mmap, resident, or budget", choices=("mmap", "resident", "budget")
    )
    ram_budget_gib: float = _f(
        0.0,
        "GiB of experts kept resident when ram_mode is budget; with mmap, how much of the hot "
        "set strata-fill warm pre-faults (0: all)",
    )
    profile: str = _f("", "expert hotness profile to apply at start (strata-fill profile)")
    fill_threads: int = _f(
        0, f"threads that fill the RAM tier (0: the measured default, {DEFAULT_FILL_THREADS})"
    )
    readahead: str = _f(
        "auto",
        "read ahead the experts the next layer most likely routes to while a layer runs "
        "(auto: in budget mode)",
        choices=("auto", "on", "off"),
    )
    readahead_threads: int = _f(2, "threads that do the read-ahead")
    profile_tokens: int = _s(64, "tokens strata-fill profile generates per prompt")
    vram_budget_mib: int = _gpu(-1, "VRAM budget in MiB (-1: free memory minus the reserve)")
    vram_reserve_mib: int = _gpu(700, "VRAM left free when the budget is automatic")
    vram_slots: int = _gpu(
        -1,
        "hybrid GPU: at most this many expert slots in VRAM (the hybrid mode even where the "
        "model fits; -1: as many as the budget holds)",
    )
    adapt_every: int = _gpu(
        16,
        "hybrid GPU: steps between adaptive tier choices (0: the VRAM cache never changes)",
    )
    adapt_swaps: int = _gpu(4, "hybrid GPU: most experts swapped into VRAM per choice")
    pcie_frac: float = _gpu(
        -1.0,
        "hybrid GPU: share of missed experts copied over PCIe and run on the GPU instead of "
        "the CPU, 0..1 (-1: the link probe's share or 0, whichever decodes faster, measured)",
    )
    stream_min_tokens: int = _gpu(
        64,
        "hybrid GPU: prefill chunks of at least this many tokens copy each layer's missing "
        "experts over PCIe and run them on the GPU (0: every miss on the CPU)",
    )
    stream_chunk: int = _gpu(
        4096,
        "hybrid GPU: tokens per prefill chunk when chunks stream (each chunk copies every "
        "missing expert once, so longer chunks move fewer bytes per token; the buffers are "
        "sized for it; 0: prefill_chunk)",
    )
    stream_threads: int = _gpu(
        0,
        "hybrid GPU: threads that copy streamed experts through page-locked buffers (0: one "
        "per core, at most 8)",
    )
    defer_experts: int = _gpu(
        0,
        "hybrid GPU: each token's N lowest-weight CPU-computed experts of a layer are added to "
        "the residual one layer later, so the CPU pool (one thread fewer: the GPU loop keeps a "
        "core) overlaps the next layer's GPU work (not exact: docs/BENCHMARKS.md has its top-1 "
        "agreement and perplexity against exact; 0: off)",
    )
    tier_async: bool = _gpu(
        False,
        "hybrid GPU: choose and stage swaps on a helper thread (device calls stay on the step "
        "thread, between steps)",
    )
    gpus: str = _gpu(
        "0",
        "cuda: the devices of the layer split's stages, comma-separated (a device may repeat: "
        '"0,0" runs one GPU as two stages, each with its own layers\' weights, KV cache, '
        "expert slots and streams; docs/PROTOCOL.md)",
    )
    layer_split: str = _gpu(
        "auto",
        "cuda: where the stages' layers start: auto (each stage's share of the layers' bytes "
        "follows its share of its device's free memory) or the first layer of every stage "
        'after the first, comma-separated ("24" for two stages)',
    )
    pipeline_windows: int = _gpu(
        1,
        "cuda: windows in flight through the stages: 1 (each step runs through every stage "
        "before the next), or 2 (pipelined windows; needs at least two stages)",
    )
    # server
    host: str = _s("127.0.0.1", "address to bind")
    port: int = _s(8000, "port to bind")
    api_key: str = _s("", "require `Authorization: Bearer KEY` (empty: no key, loopback only)")
    parallel: int = _f(1, "concurrent sequences (engine slots; they share n_ctx)", llama=("-np",))
    max_queue: int = _s(64, "requests waiting beyond the slots before 429")
    pin_server: str = _s(
        "auto",
        "the server's threads on the last compute core, so its work per streamed token never "
        "takes the core of the thread that starts each engine step (auto: when the engine's "
        "threads take every physical core; off: left to the kernel)",
        choices=("auto", "on", "off"),
    )
    max_batch_tokens: int = _s(
        512,
        "engine: most tokens one forward step runs: every running sequence's next token or "
        "speculative window first (those always run, past the limit too), then prompt chunks "
        "of admitted ones cut to what is left; the oldest prompt moves every step; the hybrid "
        "mode's streamed chunk is never cut (the limit grows to hold it beside every slot's "
        "window)",
        llama=("-b", "--batch-size"),
    )
    cache_prompt: bool = _s(
        True,
        "engine: a new prompt reuses the KV of the longest prefix it shares with a slot's or "
        "the prompt cache's sequence (as llama-server's cache_prompt); off: every prompt runs "
        "from position 0",
    )
    cache_reuse: int = _s(
        0,
        "engine: llama-server's --cache-reuse: after the prefix a prompt shares with a slot's "
        "sequence, chunks of at least this many tokens that the slot holds further on are moved "
        "down to where the prompt has them (their keys rotated by the move: KV shifting) "
        "instead of read again, as editors' sliding prompts need (0: off; not for the families "
        "whose slots keep a recurrent state)",
        llama=("--cache-reuse",),
    )
    slot_save_path: str = _s(
        "",
        "server: the folder llama-server's slot actions save slots' sequences and KV to and "
        "restore them from (`POST /slots/{id}?action=save|restore|erase`, a plain file name "
        "in the body); empty: the actions are refused (501)",
        llama=("--slot-save-path",),
    )
    prompt_cache_mib: int = _s(
        -1,
        "engine: host RAM in MiB that keeps finished sequences' KV (in the KV type) for reuse "
        "by a later prompt that shares their prefix, LRU-evicted (-1: a tenth of the available "
        "RAM at start, at most 8192; 0: off)",
    )
    spec: str = _s(
        "off",
        "engine: speculative decoding: off, ngram (prompt lookup over the prompt and the text so "
        "far), draft (a smaller GGUF of the same vocabulary: spec_draft_model), mtp (the model's "
        "own MTP layer, CPU path) or auto (draft when spec_draft_model is set, else mtp when "
        "the model carries an MTP layer Strata runs, else ngram); each "
        "sequence drafts only while its measured gain is >= 1",
        choices=("off", "ngram", "draft", "mtp", "auto"),
    )
    spec_draft_model: str = _s(
        "",
        "engine: the draft model's GGUF for spec=draft (the same vocabulary as the model; empty "
        "with the embedded default model: its shipped draft); set without spec, it turns "
        "spec draft on, as llama-server's -md does",
        llama=("-md", "--model-draft"),
    )
    spec_max: int = _s(
        8,
        "engine: most tokens one speculative window drafts (llama.cpp's --draft-max)",
        llama=("--draft-max", "--draft", "--draft-n"),
    )
    spec_min: int = _s(
        1,
        "engine: fewest tokens a window drafts when it drafts (llama.cpp's --draft-min; 0 "
        "counts as 1)",
        llama=("--draft-min", "--draft-n-min"),
    )
    spec_adaptive: bool = _s(
        True,
        "engine: choose each sequence's window from its measured acceptance and the measured "
        "verify cost, drafting only when it pays; off: every window drafts spec_max tokens "
        "(as llama.cpp does)",
    )
    spec_p_min: float = _s(
        0.0,
        "engine: the draft model stops drafting at a token it gives less than this probability "
        "(llama.cpp's --draft-p-min)",
        llama=("--draft-p-min",),
    )
    engine_silence_s: float = _s(300.0, "seconds an engine may stay silent on a request (0: off)")
    request_timeout_s: float = _s(600.0, "per-request deadline in seconds (0: none)")
    max_body_bytes: int = _s(4 << 20, "largest request body accepted")
    max_tokens_limit: int = _s(
        32768, "most tokens one choice generates (a larger max_tokens is cut to it)"
    )
    max_top_logprobs: int = _s(20, "largest top_logprobs accepted")
    served_model_name: str = _s(
        "", "model id reported by /v1/models (empty: the file's stem)", llama=("-a", "--alias")
    )
    reasoning_format: str = _s(
        "parsed",
        "a leading <think> block of a chat answer: parsed (into reasoning_content) or none "
        "(left in content); a request's reasoning_format overrides it",
        choices=("parsed", "none"),
    )
    reasoning_budget: int = _s(
        -1,
        "tokens a chat answer's <think> block may take before its close is forced (llama.cpp's "
        "--reasoning-budget; -1: no cap, 0: close at once); a request's reasoning_budget_tokens "
        "(or Anthropic's thinking.budget_tokens) overrides it",
        llama=("--reasoning-budget",),
    )
    reasoning_budget_message: str = _s(
        "",
        "text forced before the close tag when the reasoning budget is spent (llama.cpp's "
        "--reasoning-budget-message)",
        llama=("--reasoning-budget-message",),
    )
    tool_call_format: str = _s(
        "auto",
        "how the model writes tool calls: auto (from the chat template), hermes "
        "(<tool_call>{json}</tool_call>), qwen3_coder (<function=…><parameter=…>) or glm45 "
        "(<tool_call>name<arg_key>…</arg_key><arg_value>…</arg_value>)",
        choices=("auto", "hermes", "qwen3_coder", "glm45"),
    )
    # a request's sampling where it sets none (llama-server's flags; unset ones come from
    # the GGUF's general.sampling.* keys as llama.cpp reads them, else llama.cpp's defaults)
    temperature: float | None = _s(
        None,
        "sampling temperature of a request that sets none (unset: the model's "
        "general.sampling.temp, else 0.8; 0: greedy)",
        kind=float,
        llama=("--temp",),
    )
    top_k: int | None = _s(
        None,
        "top-k of a request that sets none (unset: general.sampling.top_k, else 40; 0: off)",
        kind=int,
        llama=("--top-k",),
    )
    top_p: float | None = _s(
        None,
        "top-p of a request that sets none (unset: general.sampling.top_p, else 0.95; 1: off)",
        kind=float,
        llama=("--top-p",),
    )
    min_p: float | None = _s(
        None,
        "min-p of a request that sets none (unset: general.sampling.min_p, else 0.05; 0: off)",
        kind=float,
        llama=("--min-p",),
    )
    repeat_penalty: float | None = _s(
        None,
        "repetition penalty of a request that sets none (unset: general.sampling."
        "penalty_repeat, else 1.0: off)",
        kind=float,
        llama=("--repeat-penalty",),
    )
    repeat_last_n: int | None = _s(
        None,
        "tokens the penalties look back over, for a request that sets none (unset: general."
        "sampling.penalty_last_n, else 64; -1: all; 0: none)",
        kind=int,
        llama=("--repeat-last-n",),
    )
    typical_p: float = _s(
        1.0, "locally typical sampling of a request that sets none (1: off)", llama=("--typical",)
    )
    top_n_sigma: float = _s(
        -1.0, "top-n-sigma of a request that sets none (<= 0: off)", llama=("--top-nsigma",)
    )
    xtc_probability: float | None = _s(
        None,
        "XTC's chance of a request that sets none (unset: general.sampling.xtc_probability, "
        "else 0: off)",
        kind=float,
        llama=("--xtc-probability",),
    )
    xtc_threshold: float | None = _s(
        None,
        "XTC's threshold of a request that sets none (unset: general.sampling.xtc_threshold, "
        "else 0.1)",
        kind=float,
        llama=("--xtc-threshold",),
    )
    dry_multiplier: float = _s(
        0.0, "DRY's multiplier of a request that sets none (0: off)", llama=("--dry-multiplier",)
    )
    dry_base: float = _s(1.75, "DRY's base of a request that sets none", llama=("--dry-base",))
    dry_allowed_length: int = _s(
        2, "DRY's allowed length of a request that sets none", llama=("--dry-allowed-length",)
    )
    dry_penalty_last_n: int = _s(
        64,
        "tokens DRY looks back over, for a request that sets none (0: off)",
        llama=("--dry-penalty-last-n",),
    )
    dynatemp_range: float = _s(
        0.0,
        "dynamic temperature's range of a request that sets none (0: off)",
        llama=("--dynatemp-range",),
    )
    dynatemp_exponent: float = _s(
        1.0, "dynamic temperature's exponent of a request that sets none", llama=("--dynatemp-exp",)
    )
    mirostat: int = _s(
        0, "mirostat of a request that sets none (1, 2; 0: off)", llama=("--mirostat",)
    )
    mirostat_tau: float = _s(
        5.0, "mirostat's target surprise of a request that sets none", llama=("--mirostat-ent",)
    )
    mirostat_eta: float = _s(
        0.1, "mirostat's learning rate of a request that sets none", llama=("--mirostat-lr",)
    )
    samplers: str = _s(
        "",
        "the sampler chain of a request that names none: llama.cpp's names separated by ';' "
        "(top_k;top_p;min_p;temperature) or its one-letter codes (kpmt); Strata runs them in "
        "llama.cpp's default order, the ones left out off (empty: the model's "
        "general.sampling.sequence, else all of them)",
        llama=("--samplers", "--sampler-seq", "--sampling-seq"),
    )
    adaptive_target: float = _s(
        -1.0,
        "adaptive-p's target probability of a request that sets none (where its samplers name "
        "adaptive_p; < 0: a plain draw)",
        llama=("--adaptive-target",),
    )
    adaptive_decay: float = _s(
        0.9,
        "adaptive-p's decay of a request that sets none (its average spans ~1 / (1 - decay) "
        "tokens; 0 to 0.99)",
        llama=("--adaptive-decay",),
    )
    presence_penalty: float = _s(
        0.0, "presence penalty of a request that sets none", llama=("--presence-penalty",)
    )
    frequency_penalty: float = _s(
        0.0, "frequency penalty of a request that sets none", llama=("--frequency-penalty",)
    )
    seed: int = _s(-1, "sampling seed of a request that sets none (-1: random)", llama=("-s",))
    n_predict: int = _s(
        -1,
        "tokens a request that sets no max_tokens generates at most (-1: up to the context's "
        "end and max_tokens_limit)",
        llama=("-n", "--predict"),
    )
    constrain_tool_calls: bool = _s(
        True,
        "with tool_choice auto, a tool call the model starts (its <tool_call> token, outside "
        "a thinking block) is constrained from there on to the offered tools' names and "
        "argument schemas, as llama.cpp's lazy grammar does; off: calls are the model's own "
        "text",
    )
    chat_template_file: str = _s(
        "",
        "a Jinja chat template file used in place of the GGUF's tokenizer.chat_template "
        "(llama-server's --chat-template-file; the tool-call format and thinking tags are then "
        "read from it)",
        llama=("--chat-template-file",),
    )
    spm_infill: bool = _s(
        False,
        "/infill prompts in suffix-prefix-middle order (llama-server's --spm-infill; some "
        "models were trained on it); off: prefix-suffix-middle",
    )
    drain_timeout_s: float = _s(30.0, "on shutdown, seconds running requests get to finish")
    engine: str = _s(
        "llm",
        "engine backend: llm (the model) or fake (deterministic toy model, for tests)",
        choices=("llm", "fake"),
    )
    # test-only switches (the fake engine reads them; never set them in production)
    fake_step_ms: float = _t(0.0, "milliseconds the fake engine sleeps per step")
    fake_load_s: float = _t(0.0, "seconds the fake engine takes to load")
    test_faults: bool = _t(
        False, "prompts containing #stall# or #crash# make the fake engine hang or die"
    )
    test_pipeline_miss: int = _t(
        0, "with pipelined windows, every n-th window's guess is made wrong (0: none; stress)"
    )

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """A ConfigError naming the first bad setting (`strata.config_checks`)."""
        from strata.config_checks import check_config

        check_config(self)

    def sampling_settings(self) -> dict[str, Any]:
        """The request sampling set here (SamplingParams' names; unset ones left out)."""
        out: dict[str, Any] = {
            "temperature": self.temperature,
            "top_k": self.top_k,
            "top_p": self.top_p,
            "min_p": self.min_p,
            "repetition_penalty": self.repeat_penalty,
            "repeat_last_n": self.repeat_last_n,
            "presence_penalty": self.presence_penalty,
            "frequency_penalty": self.frequency_penalty,
            "typical_p": self.typical_p,
            "top_n_sigma": self.top_n_sigma,
            "xtc_probability": self.xtc_probability,
            "xtc_threshold": self.xtc_threshold,
            "dry_multiplier": self.dry_multiplier,
            "dry_base": self.dry_base,
            "dry_allowed_length": self.dry_allowed_length,
            "dry_penalty_last_n": self.dry_penalty_last_n,
            "dynatemp_range": self.dynatemp_range,
            "dynatemp_exponent": self.dynatemp_exponent,
            "mirostat": self.mirostat,
            "mirostat_tau": self.mirostat_tau,
            "mirostat_eta": self.mirostat_eta,
            "adaptive_target": self.adaptive_target,
            "adaptive_decay": self.adaptive_decay,
            "seed": None if self.seed == -1 else self.seed,
        }
        return {k: v for k, v in out.items() if v is not None}

    @property
    def n_ctx_seq(self) -> int:
        """Positions each sequence (engine slot) holds: `n_ctx` shared out over the `parallel`
        slots, as llama.cpp's `n_ctx_seq` without a unified KV cache (0 while `n_ctx` is 0:
        known once the model is, `with_train_ctx`)."""
        return self.n_ctx // max(1, self.parallel)

    def with_train_ctx(self, n_ctx_train: int) -> Config:
        """These settings with `n_ctx` 0 (llama.cpp's -c 0) resolved to the model's training
        context `n_ctx_train` (0: the file gives none); unchanged when n_ctx is set."""
        if self.n_ctx != 0:
            return self
        if n_ctx_train <= 0:
            raise ConfigError("n_ctx: 0 asks for the model's training context; the file gives none")
        return dataclasses.replace(self, n_ctx=n_ctx_train)

    def stage_devices(self) -> list[int] | None:
        """`gpus` as device numbers, one per stage (None: not a valid list)."""
        try:
            out = [int(p) for p in self.gpus.split(",")]
        except ValueError:
            return None
        return out if out and all(d >= 0 for d in out) else None

    def split_bounds(self) -> list[int] | None:
        """`layer_split`'s boundaries ([] for auto; None: not valid). Whether they fit the
        model's layers is checked at load (the layer count is the file's)."""
        spec = self.layer_split.strip()
        if spec in ("", "auto"):
            return []
        try:
            return [int(p) for p in spec.split(",")]
        except ValueError:
            return None

    # ---- derivations ---------------------------------------------------------------------

    @staticmethod
    def env_name(name: str) -> str:
        return ENV_PREFIX + name.upper()

    @classmethod
    def names(cls, *groups: str) -> tuple[str, ...]:
        """The fields of `groups` ("model", "server", "test"; "core": the settings that
        `strata._core.Model.open` takes), in declaration order."""
        for g in groups:
            if g not in (*GROUPS, "core"):
                raise ValueError(f"no settings group {g!r} (one of {', '.join(GROUPS)}, core)")
        return tuple(
            f.name
            for f in fields(cls)
            if f.metadata["group"] in groups or ("core" in groups and f.metadata["core"])
        )

    @classmethod
    def default(cls, name: str) -> Any:
        """The default of setting `name` (what `strata._core.Model.open` takes when a keyword
        is left out)."""
        f = {f.name: f for f in fields(cls)}.get(name)
        if f is None:
            raise ConfigError(f"unknown setting {name!r}")
        return f.default

    @classmethod
    def unknown_env(cls, env: dict[str, str]) -> list[str]:
        """One message per `STRATA_*` variable in `env` that names no setting, with the closest
        setting's variable when there is one."""
        known = {cls.env_name(f.name) for f in fields(cls)} | set(OTHER_ENV)
        out = []
        for k in sorted(env):
            if not k.startswith(ENV_PREFIX) or k in known:
                continue
            near = difflib.get_close_matches(k, sorted(known), n=1, cutoff=0.75)
            hint = f"; did you mean {near[0]}?" if near else ""
            out.append(f"environment {k} names no Strata setting{hint}")
        return out

    @classmethod
    def _coerce(cls, name: str, raw: Any, source: str) -> Any:
        f = {f.name: f for f in fields(cls)}.get(name)
        if f is None:
            raise ConfigError(f"{source}: unknown setting {name!r}")
        kind: type = _kind(f)
        try:
            if kind is bool:
                if isinstance(raw, bool):
                    return raw
                if not isinstance(raw, str | int):
                    raise TypeError(raw)
                s = str(raw).strip().lower()
                if s in ("1", "true", "yes", "on"):
                    return True
                if s in ("0", "false", "no", "off"):
                    return False
                raise ValueError(raw)
            if kind is int:
                # a whole number (numpy's too): 4096.9 or inf is refused, not cut or overflowed
                if isinstance(raw, bool) or not isinstance(raw, str | numbers.Real):
                    raise TypeError(raw)
                if isinstance(raw, numbers.Integral):
                    return operator.index(raw)
                if isinstance(raw, numbers.Real):
                    if not float(raw).is_integer():
                        raise ValueError(raw)
                    return int(float(raw))
                return int(raw)
            if kind is float:
                if isinstance(raw, bool) or not isinstance(raw, str | numbers.Real):
                    raise TypeError(raw)
                return float(raw)
            # text: a string or a path (a number for the device lists: gpus = 0)
            if isinstance(raw, bool) or not isinstance(raw, str | int | os.PathLike):
                raise TypeError(raw)
            return str(raw) if not isinstance(raw, os.PathLike) else os.fspath(raw)
        except (TypeError, ValueError, OverflowError):
            raise ConfigError(f"{source}: {name} expects {kind.__name__}, got {raw!r}") from None

    @classmethod
    def load(
        cls,
        overrides: dict[str, Any] | None = None,
        env: dict[str, str] | None = None,
        config_file: str | None = None,
    ) -> Config:
        """Defaults < config file < environment < overrides (CLI flags, keyword arguments)."""
        env = dict(os.environ) if env is None else env
        values: dict[str, Any] = {}
        path = config_file or env.get(ENV_PREFIX + "CONFIG")
        if path:
            try:
                data = tomllib.loads(Path(path).read_text())
            except (OSError, tomllib.TOMLDecodeError) as e:
                raise ConfigError(f"config file {path}: {e}") from None
            for k, v in data.items():
                values[k] = cls._coerce(k, v, f"config file {path}")
        names = {f.name for f in fields(cls)}
        for msg in cls.unknown_env(env):
            warnings.warn(msg, UnknownSettingWarning, stacklevel=2)
        for k, v in env.items():
            if k.startswith(ENV_PREFIX) and k != ENV_PREFIX + "CONFIG":
                name = k[len(ENV_PREFIX) :].lower()
                if name in names:
                    values[name] = cls._coerce(name, v, f"environment {k}")
        for k, v in (overrides or {}).items():
            if v is not None:
                values[k] = cls._coerce(k, v, "argument")
        if values.get("spec_draft_model") and "spec" not in values:
            values["spec"] = "draft"  # a draft model alone speculates with it (llama's -md)
        return cls(**values)

    @classmethod
    def add_arguments(
        cls,
        parser: argparse.ArgumentParser,
        only: tuple[str, ...] = (),
        flags: dict[str, str] | None = None,
        llama: bool = False,
    ) -> None:
        """Add `--flag` for each field (or those named in `only`). `flags` renames some
        (field name → flag, e.g. `{"fill_threads": "--threads"}`); the value still lands in
        the field's name. `llama`: llama-server's names too where a setting means the same
        (`-c`/`--ctx-size` for n_ctx, `-np`, `-t`, `-m`, `-b`, `-md`, `--draft-max`, …)."""
        for f in fields(cls):
            if only and f.name not in only:
                continue
            flag = (flags or {}).get(f.name) or "--" + f.name.replace("_", "-")
            aliases = [a for a in f.metadata.get("llama", ()) if a != flag] if llama else []
            h = f"{f.metadata['help']} [env {cls.env_name(f.name)}]"
            if f.metadata["group"] == "test":
                h = argparse.SUPPRESS  # settable, never advertised
            if isinstance(f.default, bool):
                parser.add_argument(
                    flag, dest=f.name, action=argparse.BooleanOptionalAction, default=None, help=h
                )
            else:
                renamed = flags is not None and f.name in flags and not f.metadata.get("choices")
                parser.add_argument(
                    flag,
                    *aliases,
                    dest=f.name,
                    type=_kind(f),
                    default=None,
                    choices=f.metadata.get("choices"),
                    metavar=flag.lstrip("-").replace("-", "_").upper() if renamed else None,
                    help=h,
                )

    @classmethod
    def from_args(cls, ns: argparse.Namespace, config_file: str | None = None) -> Config:
        names = {f.name for f in fields(cls)}
        return cls.load({k: v for k, v in vars(ns).items() if k in names}, config_file=config_file)

    def public_dict(self) -> dict[str, Any]:
        """Settings as shown by `/v1/status` (the API key is never shown, the TEST-ONLY
        switches are left out)."""
        d = dataclasses.asdict(self)
        for name in self.names("test"):
            del d[name]
        d["api_key"] = "set" if self.api_key else ""
        return d
