"""The adaptive window: how many tokens each sequence drafts, from what was measured.

Per sequence, the acceptance rate α (the chance that the target keeps a drafted token given it
kept the ones before) is estimated from its own windows (decayed counts with a weak prior). A
window of k drafts then yields E(k) = 1 + α + … + α^k = (1 − α^(k+1)) / (1 − α) tokens
(Leviathan et al. 2023) and costs c(k) = T(b + k) / T(b) target steps plus the drafter's time,
where T(n) is the measured wall time of an engine step that runs n tokens (decodes and windows,
no prompt chunks; `CostModel`) and b the tokens the step runs without this sequence's drafts.
On the hybrid path T grows faster with n (the window's experts are the union of its tokens'),
so the same α buys a shorter window there. The chosen k ∈ [spec_min, spec_max] maximizes E(k) /
c(k); the sequence does not draft when that gain is below 1 (then after `PROBE_EVERY` steps
(`PROBE_FIRST` for a new sequence) it drafts `spec_min` tokens once to refresh α and measure
the window's cost, the gap doubling after each probe that did not bring drafting back, up to
`PROBE_MAX`; `PROBE_MAX` at once while the measured costs leave no gain even if every draft
were kept — until those costs go stale: a measured step size is forgotten STALE steps after it
last ran, so an early slow phase cannot keep drafting off for good). While every drafting
sequence is in that hopeless state the speculator pauses the drafter's per-step upkeep
(`Drafter.pause`: the MTP layer's), so that drafting that cannot pay costs nothing either."""

from __future__ import annotations

import bisect
import statistics
from collections import deque
from dataclasses import dataclass, field

# T(n) of steps with no measurement yet: T(1) × (1 + PRIOR_SLOPE × (n − 1)), i.e. a window
# costs its tokens until a probe measures otherwise; measured values replace it as they come:
# per step size, the median of its last WINDOW step times (robust to the other processes of a
# shared machine). A sample older than STALE steps (of any size) is dropped: a size that is
# no longer run (windows, once the model says no window pays) would otherwise keep the times of
# an early slow phase (a first request's cold kernels and caches) for good, and with them the
# verdict that no window pays — which stops the probes that would measure it again.
PRIOR_SLOPE = 1.0
WINDOW = 31
STALE = 512
REFRESH = 8  # steps between re-reads of the cost curve
# step sizes measured at least this often count as measured when deciding that no window can
# pay (a first window can be slow once: kernels' first use, the pool's threads asleep)
MIN_SAMPLES = 3
ALPHA_PRIOR = (1.0, 1.0)  # pseudo-counts (accepted, rejected): α starts at 0.5
ALPHA_DECAY = 0.9  # per window: older windows weigh less
PROBE_FIRST = 4  # a new sequence's first probe
PROBE_EVERY = 16
PROBE_MAX = 256


class CostModel:
    """Measured step time T(n) in seconds by the step's token count n."""

    def __init__(self) -> None:
        self._times: dict[int, float] = {}  # n → median of the recent step times
        self._recent: dict[int, deque[tuple[int, float]]] = {}  # n → (step, seconds)
        self._dirty: set[int] = set()  # n whose median is out of date
        self._sizes: list[int] = []  # the measured n, sorted
        self._ratios: dict[tuple[int, int], list[float]] = {}  # (base, k_max) → c(0..k_max)
        self._steps = 0
        self._due = False  # the medians of measured sizes are re-read (every REFRESH steps)

    def observe(self, n: int, seconds: float) -> None:
        q = self._recent.setdefault(n, deque(maxlen=WINDOW))
        q.append((self._steps, seconds))
        self._dirty.add(n)
        if len(q) == 1:
            bisect.insort(self._sizes, n)
            self._ratios.clear()
        self._steps += 1
        if self._steps % REFRESH == 0:  # the medians move slowly: re-read them now and then
            self._expire()
            self._ratios.clear()
            self._due = True

    def _expire(self) -> None:
        """Drop the samples older than STALE steps (a size left with none is unmeasured)."""
        oldest = self._steps - STALE
        for n in list(self._sizes):
            q = self._recent[n]
            if q[0][0] >= oldest:
                continue
            while q and q[0][0] < oldest:
                q.popleft()
            self._dirty.add(n)
            if not q:
                del self._recent[n]
                self._times.pop(n, None)
                self._dirty.discard(n)
                self._sizes.remove(n)

    def samples(self, n: int) -> int:
        """Steps of n tokens measured (the last WINDOW of them, none older than STALE steps)."""
        q = self._recent.get(n)
        return len(q) if q is not None else 0

    @property
    def times(self) -> dict[int, float]:
        """n → T(n) measured (the median of its recent steps; a size measured before is
        re-read every REFRESH steps, a new one at once: the step's own bookkeeping stays
        off the sort)."""
        if self._dirty:
            for n in [n for n in self._dirty if self._due or n not in self._times]:
                self._times[n] = statistics.median(t for _, t in self._recent[n])
                self._dirty.discard(n)
            self._due = False
        return self._times

    def ratios(self, base: int, k_max: int) -> list[float]:
        """[c(0), …, c(k_max)] (computed once per measurement)."""
        key = (base, k_max)
        r = self._ratios.get(key)
        if r is None:
            r = self._ratios[key] = [self.ratio(base, k) for k in range(k_max + 1)]
        return r

    def time(self, n: int) -> float | None:
        """T(n): measured, else interpolated linearly between the nearest measured sizes, else
        extrapolated (the last measured slope, or the prior one); None before any step."""
        times = self.times
        if n in times:
            return times[n]
        if not times:
            return None
        ns = self._sizes
        i = bisect.bisect_left(ns, n)
        if 0 < i < len(ns):
            a, b = ns[i - 1], ns[i]
            ta, tb = times[a], times[b]
            return ta + (tb - ta) * (n - a) / (b - a)
        if len(ns) >= 2:
            a, b = (ns[-2], ns[-1]) if i == len(ns) else (ns[0], ns[1])
            slope = max((times[b] - times[a]) / (b - a), 0.0)
        else:
            slope = times[ns[0]] * PRIOR_SLOPE / max(ns[0], 1)
        edge = ns[-1] if i == len(ns) else ns[0]
        return max(times[edge] + slope * (n - edge), 1e-9)

    def ratio(self, base: int, k: int) -> float:
        """c(k) = T(base + k) / T(base) (the prior's when nothing is measured)."""
        tb, tk = self.time(base), self.time(base + k)
        if tb is None or tk is None or tb <= 0:
            return 1.0 + PRIOR_SLOPE * k
        return tk / tb

    def curve(self, base: int = 1, k_max: int = 8) -> list[float]:
        return [round(self.ratio(base, k), 4) for k in range(k_max + 1)]


@dataclass(slots=True)
class SeqSpec:
    """One sequence's speculation state and counters."""

    accepted_w: float = ALPHA_PRIOR[0]  # decayed accepted drafts (+ prior)
    rejected_w: float = ALPHA_PRIOR[1]  # decayed rejections (+ prior)
    k: int = 0  # the window chosen last
    idle: int = 0  # steps since it last drafted
    probe_gap: int = PROBE_FIRST  # idle steps before the next probe
    offered: int = 0  # drafted tokens the target verified
    accepted: int = 0  # of them, kept
    windows: list[int] = field(default_factory=list)  # accepted count per window
    hopeless: bool = False  # its last choice: measured costs leave no gain even at α = 1

    @property
    def alpha(self) -> float:
        return self.accepted_w / (self.accepted_w + self.rejected_w)

    def record(self, offered: int, accepted: int) -> None:
        self.offered += offered
        self.accepted += accepted
        self.accepted_w = self.accepted_w * ALPHA_DECAY + accepted
        self.rejected_w = self.rejected_w * ALPHA_DECAY + (1.0 if accepted < offered else 0.0)
        self.windows.append(accepted)


def expected_tokens(alpha: float, k: int) -> float:
    """E(k) = 1 + α + … + α^k."""
    if alpha >= 1.0:
        return float(k + 1)
    return (1.0 - alpha ** (k + 1)) / (1.0 - alpha)


def choose_k(
    st: SeqSpec,
    cost: CostModel,
    base: int,
    k_min: int,
    k_max: int,
    draft_cost: float = 0.0,
) -> int:
    """The window for the next step (0: no drafting); `draft_cost` is the drafter's time per
    drafted token in target steps T(base). A `k_max` below `k_min` (the room left near the
    context's end, or max_tokens) gives no window: a window may never pass the room."""
    if k_max < max(k_min, 1):
        st.hopeless = False  # nothing was weighed: no verdict on whether drafting pays
        return 0
    best_k, best = 0, 1.0
    c = cost.ratios(base, k_max)
    # a window's cost measured, not only the prior's
    measured = cost.samples(base + max(k_min, 1)) >= MIN_SAMPLES
    alpha = st.alpha
    hopeless = True  # not even every draft kept would pay
    for k in range(max(k_min, 1), k_max + 1):
        dear = c[k] + draft_cost * k
        g = expected_tokens(alpha, k) / dear
        hopeless = hopeless and k + 1 <= dear and measured
        if g > best:
            best_k, best = k, g
    st.hopeless = best_k == 0 and hopeless
    if best_k == 0:
        st.idle += 1
        if st.idle >= (PROBE_MAX if hopeless else st.probe_gap):  # a probe; the next waits longer
            best_k = max(k_min, 1)
            st.probe_gap = min(max(2 * st.probe_gap, PROBE_EVERY), PROBE_MAX)
    else:
        st.probe_gap = PROBE_EVERY  # drafting pays again
    if best_k:
        st.idle = 0
    st.k = best_k
    return best_k
