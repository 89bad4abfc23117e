"""The single stream: one :class:`~runtime.llm.decoding.Decoding` decoded in the caller's thread, token by token.

:class:`Generation` is what ``LLM.start``, ``stream``, ``generate`` and ``chat`` return: iterate it for text pieces,
then read :attr:`Generation.result`. Every rule of the generation itself (fitting, seeds, stop strings, UTF-8, the
token limit, truncations, the result) is the Decoding's, shared with every slot of the serving engine; this module
only moves tokens through the one KV cache of the single-sequence backend, and drafts and verifies them.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

from runtime.backends.base import LLMBackend
from runtime.llm.decoding import Decoding, Result, Truncation
from runtime.llm.kv import KVSequence
from runtime.llm.speculative import verify

__all__ = ["Generation"]


class Generation:
    """A generation in progress: iterate for text pieces, then read :attr:`result`."""

    def __init__(self, seq: Decoding, backend: LLMBackend, kv: KVSequence, kv_type: str, max_draft: int) -> None:
        """``seq``: the generation (its speculator drafts, capped at ``max_draft`` tokens; None: plain decoding);
        ``kv``: the backend's one sequence of cells and the prefix cache behind it."""
        self.seq, self.backend, self.kv = seq, backend, kv
        self.kv_type, self.max_draft = kv_type, max_draft
        self.result: Result | None = None
        self._iter = self._run()

    @property
    def params(self):
        return self.seq.params

    @property
    def prompt(self) -> list[int]:
        """The prompt's tokens as fitted into the context (what the model reads, control tokens included)."""
        return list(self.seq.prompt)

    @property
    def truncations(self) -> list[Truncation]:
        return self.seq.truncations

    def __iter__(self) -> Iterator[str]:
        return self._iter

    def finish(self) -> Result:
        for _ in self._iter:
            pass
        assert self.result is not None
        return self.result

    def _run(self) -> Iterator[str]:
        seq, backend, kv = self.seq, self.backend, self.kv
        prompt = list(seq.tokens)
        t0 = time.perf_counter()
        reuse = kv.prepare(prompt)
        seq.admitted(reuse, since=t0)
        kv.append(prompt[reuse.tokens :])
        if seq.computed > 1:
            kv.save_prefix()
        seq.sampler = backend.new_sampler(seq.params)
        sampled = self._sampled(seq.sampler, seq.params.max_tokens)
        try:
            while True:
                piece, done = seq.accept(next(sampled), backend)
                if piece:
                    yield piece
                if done:
                    break
        finally:
            sampled.close()  # drops the cells of draft tokens that were never verified
        piece = seq.finish()
        if piece:
            yield piece
        if len(kv.tokens) > len(prompt):  # the prompt and its answer: a chat's next turn extends them in turn
            kv.save_prefix()  # (it supersedes the prompt's entry: runtime/llm/prefix_cache.py)
        self.result = seq.result(kv.n_ctx, self.kv_type, kv.cache.stats())
        seq.close()

    def _shift_if_full(self) -> None:
        kv, seq = self.kv, self.seq
        if len(kv.tokens) >= kv.n_ctx:
            seq.shifted(kv.shift(seq.n_keep, (len(kv.tokens) - seq.n_keep) // 2))

    def _sampled(self, sampler: Any, max_tokens: int) -> Iterator[int]:
        """The generated tokens, one at a time, each sampled once with ``sampler``, in order. A token goes into the
        KV cache when the next one is asked for, as in plain decoding: ask only to keep going, then close.

        With a speculator, a token goes into the cache together with a draft of the tokens after it, in one
        batch, and the next tokens are sampled at the drafted positions (runtime/llm/speculative.py, verify): accepted
        draft tokens are in the cache already; the cells of rejected ones are removed before the target's own
        token is handed out. The caller sees what plain decoding gives (greedy: token-identical)."""
        backend, kv, seq = self.backend, self.kv, self.seq
        spec = seq.speculator
        ctl = spec.controller if spec is not None else None
        if ctl is not None:
            ctl.shadow(None)  # a draft from another request's text says nothing about this one
        token = backend.sample(sampler)
        out = 0
        step: tuple[int, int, float] | None = None  # the last step: drafted, accepted, perf_counter() at its start
        confirmed = len(kv.tokens)  # cells holding emitted tokens; any after them hold draft tokens not yet verified
        verifying: tuple[int, int] | None = None  # a verify step in progress: drafted, accepted so far
        try:
            while True:
                out += 1
                yield token
                now = time.perf_counter()
                if ctl is not None and step is not None:
                    if step[0] and ctl.t_plain:  # a verify step against the plain steps its tokens stand for
                        seq.spec.saved_s += (step[1] + 1) * ctl.t_plain - (now - step[2])
                    ctl.observe(step[0], step[1], now - step[2])
                self._shift_if_full()
                draft: list[int] = []
                if spec is not None and ctl is not None:
                    drafting = time.perf_counter()
                    k = min(ctl.plan(min(kv.n_ctx - len(kv.tokens) - 1, max_tokens - out - 1)), self.max_draft)
                    if k:
                        draft = spec.drafter.draft([*kv.tokens, token], k)
                    elif ctl.wants_shadow() and spec.drafter.cheap:
                        ctl.shadow(spec.drafter.draft([*kv.tokens, token], ctl.k_max))
                    seq.spec.draft_s += time.perf_counter() - drafting
                if not draft:
                    kv.append([token])
                    confirmed = len(kv.tokens)
                    token = backend.sample(sampler)
                    step = (0, 0, now)
                    if ctl is not None:
                        ctl.follow(token)
                    continue
                assert spec is not None and ctl is not None
                context_len = len(kv.tokens) + 1
                kv.append_draft([token, *draft])
                confirmed = context_len
                verifying = (len(draft), 0)
                for token, in_cache in verify(lambda i: backend.sample(sampler, i), draft):
                    if not in_cache:
                        if not kv.truncate(confirmed):  # the rejected tokens' cells (none if all were accepted)
                            ctl.disable("the KV cache cannot drop draft cells in place")
                        break
                    confirmed += 1
                    verifying = (len(draft), verifying[1] + 1)
                    out += 1
                    yield token
                drafted, accepted = verifying
                verifying = None
                seq.verified(drafted, accepted, kv.tokens[:context_len])
                step = (drafted, accepted, now)
        finally:  # the caller is done (EOS, stop, max_tokens) or failed: drop draft cells that were never verified
            if verifying is not None:
                seq.spec.add(*verifying)
            if len(kv.tokens) > confirmed and not kv.truncate(confirmed) and ctl is not None:
                ctl.disable("the KV cache cannot drop draft cells in place")


