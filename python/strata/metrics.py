"""Prometheus registry (`strata_` prefix, base units, `_total` counters) and the JSON view.

The server records each finished sequence (`record`) and each token's timing (`first_token`,
`inter_token`); live gauges (running, waiting, engine state, restarts) and the engine's own
counters (expert pool, tiers: whatever the backend reports in `Stats`) are read at scrape time.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from typing import Any

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Histogram,
    disable_created_metrics,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from strata.engine.client import EngineClient

RECENT = 32
TTFT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)
ITL_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5)


@dataclass(slots=True)
class RequestRecord:
    id: str
    endpoint: str
    finish_reason: str
    prompt_tokens: int
    output_tokens: int
    ttft_ms: float | None
    prompt_ms: float
    decode_ms: float
    tokens_per_s: float | None
    drafts_offered: int | None
    drafts_accepted: int | None
    hit_rate: float | None
    pcie_share: float | None
    cached_tokens: int = 0  # prompt tokens whose KV was reused, not run


class Metrics:
    def __init__(self, client: Callable[[], EngineClient | None]) -> None:
        self._client = client
        self.started = time.time()
        disable_created_metrics()  # type: ignore[no-untyped-call]  # no *_created series: they double every counter's output
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.requests = Counter(
            "strata_requests", "Finished requests", ["endpoint", "outcome"], registry=r
        )
        self.prompt_tokens = Counter("strata_prompt_tokens", "Prompt tokens read", registry=r)
        self.prompt_tokens_cached = Counter(
            "strata_prompt_tokens_cached",
            "Prompt tokens whose KV was reused from a slot or the prompt cache, not run",
            registry=r,
        )
        self.generation_tokens = Counter("strata_generation_tokens", "Tokens generated", registry=r)
        self.ttft = Histogram(
            "strata_time_to_first_token_seconds",
            "From request arrival to its first token",
            buckets=TTFT_BUCKETS,
            registry=r,
        )
        self.itl = Histogram(
            "strata_inter_token_latency_seconds",
            "Between consecutive tokens of one sequence",
            buckets=ITL_BUCKETS,
            registry=r,
        )
        self.duration = Histogram(
            "strata_request_duration_seconds",
            "From request arrival to its last byte",
            buckets=TTFT_BUCKETS,
            registry=r,
        )
        r.register(_Live(self))
        self.recent: deque[RequestRecord] = deque(maxlen=RECENT)
        self.totals: dict[str, float] = {
            "requests": 0,
            "errors": 0,
            "prompt_tokens": 0,
            "prompt_tokens_cached": 0,
            "output_tokens": 0,
            "prompt_ms": 0.0,
            "decode_ms": 0.0,
            "drafts_offered": 0,
            "drafts_accepted": 0,
        }

    # -- recording ---------------------------------------------------------------------------

    def request_done(self, endpoint: str, outcome: str, t_arrival: float | None = None) -> None:
        self.requests.labels(endpoint, outcome).inc()
        if t_arrival is not None:
            self.duration.observe(time.monotonic() - t_arrival)
        self.totals["requests"] += 1
        if outcome != "ok":
            self.totals["errors"] += 1

    def record(self, rec: RequestRecord) -> None:
        """A finished sequence (`strata_prompt_tokens` and `strata_generation_tokens` are
        counted as its tokens come: `SeqRun.run`)."""
        self.prompt_tokens_cached.inc(rec.cached_tokens)
        t = self.totals
        t["prompt_tokens"] += rec.prompt_tokens
        t["prompt_tokens_cached"] += rec.cached_tokens
        t["output_tokens"] += rec.output_tokens
        t["prompt_ms"] += rec.prompt_ms
        t["decode_ms"] += rec.decode_ms
        t["drafts_offered"] += rec.drafts_offered or 0
        t["drafts_accepted"] += rec.drafts_accepted or 0
        self.recent.append(rec)

    # -- views -------------------------------------------------------------------------------

    def text(self) -> bytes:
        return bytes(generate_latest(self.registry))

    def engine_stats(self) -> dict[str, float]:
        c = self._client()
        if c is None or c.stats is None:
            return {}
        return {
            s.name + "".join(f"{{{k}={v}}}" for k, v in sorted(s.labels.items())): s.value
            for s in c.stats.stats
        }

    def hit_rate(self) -> float | None:
        c = self._client()
        if c is None or c.stats is None:
            return None
        hits = sum(s.value for s in c.stats.stats if s.name == "expert_hits_total")
        misses = sum(s.value for s in c.stats.stats if s.name == "expert_misses_total")
        return hits / (hits + misses) if hits + misses > 0 else None

    def json_view(self) -> dict[str, Any]:
        c = self._client()
        live: dict[str, Any] = {
            "uptime_s": round(time.time() - self.started, 3),
            "engine": c.describe() if c else {"state": "stopped"},
            "requests_running": len(c.running) if c else 0,
            "requests_waiting": len(c.waiting) if c else 0,
        }
        totals: dict[str, Any] = dict(self.totals)
        for k in (
            "requests",
            "errors",
            "prompt_tokens",
            "prompt_tokens_cached",
            "output_tokens",
            "drafts_offered",
            "drafts_accepted",
        ):
            totals[k] = int(totals[k])
        totals["engine_restarts"] = c.restarts if c else 0
        dec_s = totals["decode_ms"] / 1000
        totals["tokens_per_s"] = round(totals["output_tokens"] / dec_s, 3) if dec_s > 0 else None
        return {
            "live": live,
            "totals": totals,
            "hit_rate": self.hit_rate(),
            "engine": self.engine_stats(),
            "requests": [asdict(r) for r in self.recent],
        }


class _Live:
    """Gauges and engine counters read at scrape time."""

    def __init__(self, m: Metrics) -> None:
        self.m = m

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        c = self.m._client()
        g = GaugeMetricFamily("strata_requests_running", "Sequences in engine slots")
        g.add_metric([], len(c.running) if c else 0)
        yield g
        g = GaugeMetricFamily("strata_requests_waiting", "Sequences queued for a slot")
        g.add_metric([], len(c.waiting) if c else 0)
        yield g
        g = GaugeMetricFamily("strata_engine_up", "1 when the engine is loaded and ready")
        g.add_metric([], 1 if c and c.state == "ready" else 0)
        yield g
        g = GaugeMetricFamily("strata_slots", "Engine slots (parallel sequences)")
        g.add_metric([], c.slots if c else 0)
        yield g
        r = CounterMetricFamily("strata_engine_restarts", "Engine processes killed and restarted")
        r.add_metric([], c.restarts if c else 0)
        yield r
        if c is None or c.stats is None:
            return
        families: dict[str, CounterMetricFamily | GaugeMetricFamily] = {}
        for s in c.stats.stats:
            name = "strata_" + s.name
            labels = sorted(s.labels)
            if s.kind == "counter":
                base = name[: -len("_total")] if name.endswith("_total") else name
                fam = families.get(base)
                if fam is None:
                    fam = families[base] = CounterMetricFamily(
                        base, engine_help(s.name, "counter"), labels=labels
                    )
            else:
                fam = families.get(name)
                if fam is None:
                    fam = families[name] = GaugeMetricFamily(
                        name, engine_help(s.name, "gauge"), labels=labels
                    )
            fam.add_metric([s.labels[k] for k in labels], s.value)
        yield from families.values()


def engine_help(name: str, kind: str) -> str:
    """The help line of an engine series: its kind and the unit its name ends in."""
    base = name.removesuffix("_total")
    for suffix, unit in (("_seconds", "seconds"), ("_bytes", "bytes"), ("_ratio", "a ratio")):
        if base.endswith(suffix):
            return f"engine {kind}, in {unit}"
    return f"engine {kind}, a count" if kind == "counter" else f"engine {kind}"
