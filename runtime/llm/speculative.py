"""Speculative decoding: draft a few tokens cheaply, verify them with the target model in one batch.

Pure Python and numpy (no llama_cpp import): the pieces every decoder shares, the single-stream
:class:`~runtime.llm.generation.Generation` and the server's per-slot engine alike.

* :class:`Drafter` proposes up to ``n`` next tokens for a context (a point mass per position) and is told how
  many of them the target accepted. :class:`PromptLookup` is llama.cpp's prompt lookup (n-gram) drafter: the
  latest earlier occurrence of the context's last n-gram, and what followed it. A draft model (runtime/llm/draft.py)
  is another.
* :class:`Adaptive` chooses the draft length of each step from the measured acceptance and the measured cost of
  a verify batch against a plain step, and switches speculation off when it does not pay.
* :func:`verify` is sample-and-compare: sample the target's token at each drafted position with the request's
  own sampler chain and accept while it equals the draft. For a deterministic draft (a point mass ``q`` on the
  drafted token x) this *is* the rule of Leviathan et al. 2023 / Chen et al. 2023: accept with probability
  min(1, p(x)/q(x)) = p(x), otherwise sample from norm(max(0, p - q)) = p without x; both together are one draw
  from p. Every emitted token costs exactly one sampler draw, in the order plain decoding draws them, so greedy
  output is token-identical and the sampler's state (penalty history, RNG) follows plain decoding's.
* :func:`leviathan_accept` is the general rule for a stochastic draft (a draft token sampled from a row ``q``).

A step, as a decoder runs it (the token ``t`` was just sampled and is not yet in the KV cache)::

    k = controller.plan(limit)                       # 0: a plain step
    draft = drafter.draft(context + [t], k) if k else []
    decode [t] + draft with logits at every position   # one batch
    for token, drafted in verify(sample_at, draft):  # sample_at(i): the sampler at batch index i
        emit token; stop at EOS / stop string / max_tokens like plain decoding
    remove the KV cells of the rejected draft tokens
    drafter.accepted(context, len(draft), n_accepted)
    controller.observe(len(draft), n_accepted, seconds)
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import numpy as np

log = logging.getLogger(__name__)

K_MAX = 8  # longest draft: beyond it a verify batch costs more than the tokens it can add on a CPU


@runtime_checkable
class Drafter(Protocol):
    """Proposes the next tokens of a context. Deterministic: each drafted token is a point mass.

    ``cheap`` drafters (no model compute, like :class:`PromptLookup`) are also asked while speculation is off,
    so that the controller can see their would-be acceptance for free and switch speculation back on."""

    name: str
    cheap: bool

    def draft(self, context: Sequence[int], n: int) -> list[int]:
        """Up to ``n`` tokens that may follow ``context`` (the whole sequence so far; [] when there is no guess)."""
        ...

    def accepted(self, context: Sequence[int], n_drafted: int, n_accepted: int) -> None:
        """Feedback: of the ``n_drafted`` tokens drafted after ``context``, the target accepted ``n_accepted``."""
        ...


class PromptLookup:
    """Prompt lookup (llama.cpp's n-gram drafting): find the latest earlier occurrence of the context's last
    n-gram, longest first (``max_ngram`` down to ``min_ngram``), and propose the tokens that followed it.

    It pays on what edge users run: summarizing or rewriting a given text, answering from a document, code, and
    chat that quotes earlier turns."""

    name = "prompt-lookup"
    cheap = True

    def __init__(self, min_ngram: int = 1, max_ngram: int = 3) -> None:
        if not 1 <= min_ngram <= max_ngram:
            raise ValueError(f"n-gram sizes must satisfy 1 <= min_ngram <= max_ngram, got {min_ngram}..{max_ngram}")
        self.min_ngram, self.max_ngram = min_ngram, max_ngram

    def draft(self, context: Sequence[int], n: int) -> list[int]:
        size = len(context)
        if n <= 0 or size < self.min_ngram + 1:
            return []
        hay = np.fromiter(context, dtype=np.int64, count=size)
        for g in range(min(self.max_ngram, size - 1), self.min_ngram - 1, -1):
            tail = hay[size - g :]
            starts = size - g  # candidate starts 0..size-g-1: at least one token follows the occurrence
            match = hay[:starts] == tail[0]
            for j in range(1, g):
                match &= hay[j : starts + j] == tail[j]
            hits = np.flatnonzero(match)
            if hits.size:
                begin = int(hits[-1]) + g
                return hay[begin : begin + n].tolist()
        return []

    def accepted(self, context: Sequence[int], n_drafted: int, n_accepted: int) -> None:
        pass


def verify(sample_at: Callable[[int], int], draft: Sequence[int]) -> Iterator[tuple[int, bool]]:
    """Sample-and-compare, lazily: yields ``(token, accepted)`` per emitted token.

    ``sample_at(i)`` samples the target's token from the logits after batch position ``i`` (the batch was the
    last sampled token followed by ``draft``) with the request's own sampler chain, recording it as plain
    decoding does. While the sampled token equals ``draft[i]`` it is yielded with ``accepted`` True (its KV
    cell is already computed); the first mismatch is yielded with False and ends the step; if every drafted
    token is accepted, one more token is sampled after the last one (False: not yet in the cache).

    The caller stops consuming at EOS, a stop string or max_tokens, exactly as in plain decoding: nothing is
    sampled beyond what it consumes."""
    for i, want in enumerate(draft):
        token = sample_at(i)
        if token != want:
            yield token, False
            return
        yield token, True
    yield sample_at(len(draft)), False


def leviathan_accept(p: np.ndarray, q: np.ndarray, draft: Sequence[int], rng: np.random.Generator) -> list[int]:
    """The speculative sampling rule for a stochastic draft (Leviathan et al. 2023, Chen et al. 2023).

    ``p``: the target's probability rows, ``len(draft) + 1`` of them (row i: after the context and
    ``draft[:i]``); ``q``: the draft's rows the drafted tokens were sampled from, ``len(draft)`` of them. Each
    ``draft[i]`` is accepted with probability min(1, p_i(x)/q_i(x)); the first rejection is replaced by a sample
    from norm(max(0, p_i - q_i)) and ends the step; if all are accepted, one more token is sampled from the last
    row of ``p``. Returns the emitted tokens: each is distributed exactly as a sample from the target."""
    p = np.asarray(p, dtype=np.float64)
    q = np.asarray(q, dtype=np.float64)
    if p.ndim != 2 or q.ndim != 2 or len(p) != len(draft) + 1 or len(q) != len(draft) or p.shape[1:] != q.shape[1:]:
        raise ValueError(f"need {len(draft) + 1} target rows and {len(draft)} draft rows of one vocabulary, "
                         f"got p {p.shape} and q {q.shape}")
    out: list[int] = []
    for i, x in enumerate(draft):
        px, qx = p[i, x], q[i, x]
        if qx > 0 and rng.random() < min(1.0, px / qx):
            out.append(int(x))
            continue
        residual = np.maximum(p[i] - q[i], 0.0)
        total = residual.sum()
        row = residual / total if total > 0 else p[i] / p[i].sum()  # p == q: nothing left over, p itself
        out.append(int(rng.choice(len(row), p=row)))
        return out
    last = p[len(draft)]
    out.append(int(rng.choice(len(last), p=last / last.sum())))
    return out


@dataclass
class SpecStats:
    """What speculation did: in a :class:`~runtime.llm.generation.Result` (one generation) and per controller."""

    drafter: str = ""
    enabled: bool = False  # speculation was allowed for this run (the LLM has a drafter and it was not turned off)
    on: bool = False  # the controller's state at the end: speculating (True) or switched off because it did not pay
    steps: int = 0  # verify batches (steps that carried a draft)
    drafted: int = 0  # draft tokens verified
    accepted: int = 0  # of them, accepted by the target
    # the controller's expected speed-up over plain decoding at the end, from its measured acceptance and step
    # costs (1.0 while off: plain decoding)
    expected_speedup: float = 1.0
    # what speculation cost and gave, in seconds: drafting (shadow drafts while off included), and, where steps are
    # timed one by one (the single stream), the time verify steps saved over the plain steps they stood for (each
    # step's tokens at the plain step's measured time, less the step's own time; negative: a loss)
    draft_s: float = 0.0
    saved_s: float = 0.0

    @property
    def acceptance(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0

    @property
    def mean_draft(self) -> float:
        return self.drafted / self.steps if self.steps else 0.0

    def add(self, drafted: int, accepted: int) -> None:
        if drafted:
            self.steps += 1
            self.drafted += drafted
            self.accepted += accepted

    def to_dict(self) -> dict[str, Any]:
        return {"drafter": self.drafter, "enabled": self.enabled, "on": self.on, "steps": self.steps,
                "drafted": self.drafted, "accepted": self.accepted, "acceptance": round(self.acceptance, 4),
                "mean_draft": round(self.mean_draft, 3), "expected_speedup": round(self.expected_speedup, 3),
                "draft_ms": round(1000 * self.draft_s, 2), "saved_ms": round(1000 * self.saved_s, 2)}


def expected_tokens(alpha: float, k: int) -> float:
    """Tokens one step emits on average with a draft of ``k`` and per-token acceptance ``alpha`` (the accepted
    prefix plus the target's own token): 1 + alpha + ... + alpha^k."""
    if alpha >= 1.0:
        return k + 1.0
    return (1.0 - alpha ** (k + 1)) / (1.0 - alpha)


class Adaptive:
    """Chooses each step's draft length from what it measures, and switches speculation off when it does not pay.

    It measures three things, as exponentially weighted averages (recent steps count most):

    * ``alpha``: the per-token acceptance, as the geometric model's estimate (accepted tokens over accepted
      tokens plus rejections), from verified drafts and, while off, from a cheap drafter's unverified ones
      (:meth:`shadow`, :meth:`follow`);
    * ``t_plain``: seconds of a plain step (one token);
    * ``cost(k)``: the time of a step with a draft of k, in plain steps, per draft length (batching is not
      linear: on a CPU a batch of 2 may cost nearly 2 steps where one of 9 costs 4); a length not yet measured
      is assumed to cost ``1 + beta * k``, beta the cheapest per-token cost measured at any length or the prior.

    A step with a draft of k then emits ``expected_tokens(alpha, k)`` tokens in ``cost(k)`` plain steps'
    time. :meth:`plan` picks the k in 1..k_max with the best ratio; speculation goes off when even that ratio is
    below 1 and comes back on above ``1 + ON_ABOVE`` (hysteresis). While on, every ``probe_every``-th step is a
    plain one, so that ``t_plain`` follows the machine's load. While off, a draft is tried now and then so that
    the costs and ``alpha`` stay current, each try that does not turn it back on waiting twice as long as the
    last (``probe_every`` up to ``MAX_BACKOFF`` steps): what an unpaying try costs stays a small fraction.
    """

    OFF_BELOW = 0.0  # off when the best expected speed-up falls below 1x
    ON_ABOVE = 0.05  # back on when it exceeds 1.05x
    WARMUP = 2  # plain steps measured before the first draft
    DECAY = 0.85  # weight of the past per observation
    MAX_EXTRA = 4.0  # a step's measured cost per draft token is capped (a step the OS preempted says little)
    MAX_BACKOFF = 1024  # steps between tries while off, at most

    def __init__(self, k_max: int = K_MAX, *, probe_every: int = 32, alpha: float = 0.5, beta: float = 0.5) -> None:
        """``alpha``, ``beta``: the priors, until measured. With 0.5 and 0.5 a draft is worth it only once the
        acceptance is measured above one half: a text that does not repeat never pays for trying."""
        if k_max < 1:
            raise ValueError(f"k_max must be >= 1, got {k_max}")
        self.k_max = k_max
        self.probe_every = probe_every
        self.on = True
        self.disabled = False  # for good: the backend cannot take drafts (see :meth:`disable`)
        self._acc = (alpha, 1.0)  # (accepted, trials) weighted sums: one pseudo-observation of the prior
        self._t_plain: float | None = None
        self._beta = beta
        self._cost: list[float | None] = [None] * (k_max + 1)  # measured step time / t_plain, per draft length
        self._plain_seen = 0
        self._steps = 0
        self._backoff = probe_every
        self._next_try = 0
        self._shadow: tuple[list[int], int] | None = None  # a draft being followed, and how much of it came true
        self.stats = SpecStats(on=True)

    @property
    def alpha(self) -> float:
        s, n = self._acc
        return s / n if n > 0 else 0.0

    @property
    def beta(self) -> float:
        return self._beta

    def cost(self, k: int) -> float:
        """A step with a draft of ``k`` in plain steps' time: measured, or the prior ``1 + beta * k``."""
        measured = self._cost[k] if 0 < k < len(self._cost) else None
        if measured is not None:
            return measured
        # not measured: per draft token, the cheapest measured at any length (batching costs grow less than
        # linearly, so a longer draft costs at most that), the prior only until a length is measured. Longer drafts
        # get tried once shorter ones have shown that a token is cheap enough; a batch that costs a full step per
        # token (Q4_1 on an x86 CPU) is not tried at every length in turn, each try a loss.
        per_token = [(c - 1.0) / n for n, c in enumerate(self._cost) if c is not None and n > 0]
        return 1.0 + (min(per_token) if per_token else self._beta) * k

    @property
    def t_plain(self) -> float | None:
        return self._t_plain

    def speedup(self, k: int) -> float:
        """Expected tokens per plain step's time with a draft of ``k`` (1.0: as fast as plain)."""
        return expected_tokens(self.alpha, k) / self.cost(k)

    def best_k(self) -> tuple[int, float]:
        """The draft length in 1..k_max with the best expected speed-up, and that speed-up (may be below 1)."""
        return max(((k, self.speedup(k)) for k in range(1, self.k_max + 1)), key=lambda kr: kr[1])

    def plan(self, limit: int | None = None) -> int:
        """The draft length for the next step (0: a plain step); ``limit`` caps it (room left in the context
        or the tokens still to generate)."""
        self._steps += 1
        if self.disabled or (limit is not None and limit <= 0) or self._plain_seen < self.WARMUP:
            return 0
        k, ratio = self.best_k()
        if self.on and ratio < 1.0 + self.OFF_BELOW:
            self._switch(False, ratio)
            self._next_try = self._steps + self._backoff
        elif not self.on and ratio > 1.0 + self.ON_ABOVE:
            self._switch(True, ratio)
            self._backoff = self.probe_every
        if self.on:
            if self._steps % self.probe_every == 0:
                return 0  # a plain step now and then: t_plain follows the load
        elif self._steps >= self._next_try:
            self._backoff = min(2 * self._backoff, self.MAX_BACKOFF)
            self._next_try = self._steps + self._backoff
        else:
            return 0
        return k if limit is None else min(k, limit)

    def expected_speedup(self) -> float:
        """The speed-up over plain decoding that the controller expects now (1.0 while off or disabled)."""
        return self.best_k()[1] if self.on and not self.disabled and self._plain_seen >= self.WARMUP else 1.0

    def _switch(self, on: bool, ratio: float) -> None:
        self.on = on
        self.stats.on = on
        log.info("speculation %s: expected %.2fx (acceptance %.2f, step costs %s)", "on" if on else "off", ratio,
                 self.alpha, {k: round(c, 2) for k, c in enumerate(self._cost) if c is not None})

    def observe(self, drafted: int, accepted: int, seconds: float) -> None:
        """A step finished in ``seconds``: ``drafted`` tokens verified (0: a plain step), ``accepted`` of them
        (the step emitted ``accepted + 1`` tokens)."""
        if drafted <= 0:
            self._plain_seen += 1
            if self._t_plain is None:
                self._t_plain = seconds
            else:  # a step the OS preempted counts as at most MAX_EXTRA times the usual
                seconds = min(seconds, (1.0 + self.MAX_EXTRA) * self._t_plain)
                self._t_plain = self.DECAY * self._t_plain + (1 - self.DECAY) * seconds
            return
        self.stats.add(drafted, accepted)
        self._learn(drafted, accepted)
        if self._t_plain and drafted < len(self._cost):
            ratio = min(max(seconds / self._t_plain, 1.0), 1.0 + self.MAX_EXTRA * drafted)
            old = self._cost[drafted]
            self._cost[drafted] = ratio if old is None else self.DECAY * old + (1 - self.DECAY) * ratio

    def observe_shadow(self, drafted: int, accepted: int) -> None:
        """A draft that was not verified (speculation off) would have had ``accepted`` of ``drafted`` tokens
        accepted: it teaches the acceptance, costs nothing."""
        if drafted > 0:
            self._learn(drafted, accepted)

    def _learn(self, drafted: int, accepted: int) -> None:
        trials = accepted + (1 if accepted < drafted else 0)
        s, n = self._acc
        self._acc = (self.DECAY * s + accepted, self.DECAY * n + trials)

    # -- shadow drafts: while off, a cheap drafter's drafts are checked against the tokens that come, unverified
    def wants_shadow(self) -> bool:
        """Whether to hand :meth:`shadow` a draft now (off, and no shadow draft is being followed)."""
        return not self.on and not self.disabled and self._shadow is None

    def shadow(self, draft: Sequence[int] | None) -> None:
        """Follow ``draft`` (None or []: forget the one being followed) with :meth:`follow`."""
        self._shadow = (list(draft), 0) if draft else None

    def follow(self, token: int) -> None:
        """The next emitted token: once it decides the shadow draft, its would-be acceptance is learnt."""
        if self._shadow is None:
            return
        draft, hit = self._shadow
        if token == draft[hit]:
            hit += 1
            if hit < len(draft):
                self._shadow = (draft, hit)
                return
        self._shadow = None
        self.observe_shadow(len(draft), hit)

    def disable(self, why: str) -> None:
        """Stop speculating for good (the backend refused to drop draft cells)."""
        if not self.disabled:
            log.warning("speculation disabled: %s", why)
        self.disabled = True
        self.on = False
        self.stats.on = False


class Speculator:
    """A drafter and its controller: what a decoder (an LLM, a server slot) speculates with.

    ``LLM.speculator`` holds one (default: :class:`PromptLookup` with an :class:`Adaptive` controller); assign
    another (a draft model's) to change the drafter. Shared by the generations of one LLM, so what the controller
    learned (acceptance, step costs, on/off) carries over from one request to the next."""

    def __init__(self, drafter: Drafter, controller: Adaptive | None = None) -> None:
        self.drafter = drafter
        self.controller = controller or Adaptive()
        self.controller.stats.drafter = drafter.name
        self.controller.stats.enabled = True


__all__ = ["K_MAX", "Adaptive", "Drafter", "PromptLookup", "SpecStats", "Speculator", "expected_tokens", "leviathan_accept",
           "verify"]
