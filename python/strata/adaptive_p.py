"""adaptive-p (llama.cpp's `llama_sampler_init_adaptive_p`; llama-server runs it where a
request's `samplers` name "adaptive_p", with `adaptive_target` and `adaptive_decay`): the last
stage of the chain, drawing in place of the plain draw. It prefers tokens whose probability is
near a target that adapts: the target less the running average of the probabilities the
drawn tokens had, so that the text's average comes to the target.

Over the candidates the chain leaves (after temperature), with p their probabilities:
  adapted = clamp(2·target − weighted / total, 0, 1)
  d = |p − adapted| / 0.3;  logit = 5 − 10·d² / (1 + d);  the draw is from softmax(logit)
and the token drawn moves the average: weighted ← p(token) + decay·weighted, total ← 1 +
decay·total (from target / (1 − decay) and 1 / (1 − decay)). A negative target draws from p
as it is (the sampler is then a plain draw). The decay is clamped to [0, 0.99].
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

WIDTH = 0.3  # the distance from the target, in probability, of one unit of d
PEAK = 5.0  # the logit at the target
SHARPNESS = 10.0

Probs = npt.NDArray[np.float64]


class AdaptiveP:
    """One sequence's adaptive-p state (the running average of the drawn tokens'
    probabilities, and the token drawn last, whose `accept` moves it)."""

    def __init__(self, target: float, decay: float) -> None:
        self.target = target
        self.decay = min(max(decay, 0.0), 0.99)
        self.weighted = target / (1.0 - self.decay)
        self.total = 1.0 / (1.0 - self.decay)
        self._pending: tuple[int, float] | None = None

    @property
    def on(self) -> bool:
        return self.target >= 0.0

    def transform(self, prob: Probs) -> Probs:
        """The probabilities [n] the draw picks by, from the candidates' `prob` [n]."""
        if not self.on:
            return prob
        t = min(max(self.target, 0.0), 1.0)
        adapted = t if self.total == 0.0 else 2.0 * t - self.weighted / self.total
        adapted = min(max(adapted, 0.0), 1.0)
        d = np.abs(prob - adapted) / WIDTH
        logit = PEAK - SHARPNESS * d * d / (1.0 + d)
        e = np.exp(logit - logit.max())
        out: Probs = e / e.sum()
        return out

    def drew(self, token: int, p: float) -> None:
        """The draw picked `token`, whose probability before the transform was `p`."""
        if self.on:
            self._pending = (token, p)

    def accept(self, token: int) -> None:
        """The sequence took `token`: the average moves when it is the token drawn."""
        if self._pending is not None and self._pending[0] == token:
            self.weighted = self._pending[1] + self.decay * self.weighted
            self.total = 1.0 + self.decay * self.total
        self._pending = None
