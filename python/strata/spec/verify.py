"""Verification of a speculative window: which drafted tokens the target keeps.

The target ran the window `[t0, d1 .. dk]` (t0: the sequence's last sampled token, d: the
draft) as one entry with every row's logits: row i [V] is the target's next-token logits after
`d_i` (row 0 after t0). Tokens are taken row by row through the sequence's own `Sampler`, so
the processor (grammar), the penalties and the reported log-probabilities see exactly the
tokens of the sequence, as without speculation:

- greedy: row i's pick (the sampler's argmax) is emitted; the window goes on while it equals
  d_{i+1}. The output is the output without speculation whenever the rows' logits are the
  one-token steps' (bitwise on the CPU path: `tests/test_batch.py`).
- sampling: standard speculative sampling (Leviathan et al. 2023, Chen et al. 2023): with p the
  target's distribution after top-k/top-p/min-p/temperature (`strata.sampling.distribution`)
  and q the draft's, d_{i+1} is kept with probability min(1, p(d)/q(d)); on a rejection the
  token is drawn from the residual max(0, p − q) renormalized, and the window ends. When every
  draft is kept, the last row gives one more token. The emitted tokens are distributed as
  without speculation (`tests/test_spec_sampling.py` checks it with a chi-square test).
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from strata.sampling import Sampler, SampleResult, draw
from strata.spec.drafters import Draft


def verify(
    sampler: Sampler,
    rows: npt.NDArray[np.float32],
    draft: Draft,
    stops: frozenset[int] = frozenset(),
) -> tuple[list[SampleResult], int]:
    """(tokens emitted, drafts accepted) for a window whose logits are `rows` [k+1, V]; the
    sampler records every emitted token. At least one token is emitted; an end-of-generation
    id (`stops`) is the last (what follows it is never the sequence's, nor counted)."""
    k = len(draft.tokens)
    assert rows.shape[0] == k + 1, (rows.shape, k)
    out: list[SampleResult] = []
    for i, d in enumerate(draft.tokens):
        if sampler.params.greedy:
            res = sampler.sample(rows[i])
            out.append(res)
            if res.token != d:
                return out, i
            if d in stops:
                return out, i + 1
            continue
        raw, x = sampler.processed(rows[i])
        ids, p = sampler.distribution(x)
        p_d = float(p[ids == d].sum())
        q_d = draft.q_of(i, d)
        if q_d > 0.0 and sampler.rng.random() < min(1.0, p_d / q_d):
            sampler.accept(d)
            out.append(sampler.result(raw, d))
            if d in stops:
                return out, i + 1
            continue
        tok = _residual(ids, p, draft, i, sampler)
        sampler.accept(tok)
        out.append(sampler.result(raw, tok))
        return out, i
    out.append(sampler.sample(rows[k]))
    return out, k


def _residual(
    ids: npt.NDArray[np.int64],
    p: npt.NDArray[np.float64],
    draft: Draft,
    i: int,
    sampler: Sampler,
) -> int:
    """A token drawn from max(0, p − q) renormalized (p where the residual is empty)."""
    res = p.copy()
    if draft.q is None:  # q one-hot on the drafted token
        res[ids == draft.tokens[i]] = 0.0
    else:
        q_ids, q = draft.q[i]
        q_full = dict(zip(q_ids.tolist(), q.tolist(), strict=True))
        res = np.maximum(0.0, res - np.array([q_full.get(int(t), 0.0) for t in ids]))
    total = float(res.sum())
    if total <= 0.0:  # p ≤ q everywhere means p = q: a rejection cannot happen, but be safe
        return draw(ids, p, sampler.rng)
    return draw(ids, res / total, sampler.rng)
