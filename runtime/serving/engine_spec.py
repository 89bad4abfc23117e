"""Speculative decoding in the engine: what a drafted token costs when several slots share one batch.

Each request drafts with its own :class:`~runtime.llm.speculative.Speculator` (prompt lookup and an
:class:`~runtime.llm.speculative.Adaptive` controller): the acceptance is the request's own. The cost is not: a draft
token of one slot lengthens the step of every slot in the batch. :class:`StepCost` fits the engine's step time
as ``a + b * n`` (n: tokens in the step) over recent decode steps, and :meth:`StepCost.relative` says what a
slot's draft of ``k`` costs relative to a plain step, scaled so that a slot's controller decides for the whole
batch: with ``n_dec`` slots decoding, a step makes ``n_dec`` tokens in ``T = a + b * n_dec``; one slot's draft
adds ``b * k`` for all of them and pays (more tokens per second for the engine) only when its expected extra
tokens exceed ``n_dec * b * k / T``. The controller is fed that as its step cost, ``1 + n_dec * b * k / T``
plain steps, so its own rule (runtime/llm/speculative.py) makes the engine-wide decision.
"""

from __future__ import annotations


class StepCost:
    """Exponentially weighted least squares of step seconds against tokens per step (decode steps only: a
    prompt chunk's tokens cost differently)."""

    DECAY = 0.97  # weight of the past per observed step
    PRIOR_BETA = 0.3  # draft token cost relative to a plain step before the fit has seen enough spread in n

    def __init__(self) -> None:
        self._w = self._n = self._t = self._nn = self._nt = 0.0

    def observe(self, n_tokens: int, seconds: float) -> None:
        d = self.DECAY
        self._w = d * self._w + 1.0
        self._n = d * self._n + n_tokens
        self._t = d * self._t + seconds
        self._nn = d * self._nn + n_tokens * n_tokens
        self._nt = d * self._nt + n_tokens * seconds

    def fit(self) -> tuple[float, float] | None:
        """(a, b) of ``seconds = a + b * n``; None until the steps seen differ enough in size to tell b."""
        w = self._w
        if w < 4:
            return None
        mean_n, mean_t = self._n / w, self._t / w
        var = self._nn / w - mean_n * mean_n
        if var < 0.25:
            return None
        b = max((self._nt / w - mean_n * mean_t) / var, 0.0)
        return mean_t - b * mean_n, b

    def relative(self, n_dec: int, k: int) -> float:
        """A step with a draft of ``k`` (in a batch of ``n_dec`` decoding slots) in plain steps (1.0 for k = 0)."""
        if k <= 0:
            return 1.0
        ab = self.fit()
        if ab is None:
            return 1.0 + self.PRIOR_BETA * k
        a, b = ab
        step = a + b * n_dec
        if step <= 0:
            return 1.0 + self.PRIOR_BETA * k
        return 1.0 + n_dec * b * k / step
