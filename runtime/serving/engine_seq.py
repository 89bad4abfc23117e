"""One request's progress inside the engine: its tokens, its sampler, its text so far, its timings.

A :class:`SeqState` is the payload of the request's scheduler Job, so it travels with the job when the request is
preempted and requeued: the sampler (its RNG and penalty history), the text and the counters stay as they were,
and the request resumes exactly where it stopped.
"""

from __future__ import annotations

import codecs
import time
from typing import Any

from runtime.llm.generation import Truncation, find_stop
from runtime.llm.kv import Reuse
from runtime.llm.sampling import SamplingParams
from runtime.llm.speculative import SpecStats, Speculator
from runtime.metrics import peak_rss_bytes
from runtime.serving.engine_requests import EngineResult, GenHandle, GenRequest


class SeqState:
    """``tokens``: what the slot's KV cache must hold, then the pending token (sampled, not yet decoded)."""

    def __init__(self, handle: GenHandle, req: GenRequest, tokens: list[int], params: SamplingParams, n_keep: int,
                 truncations: list[Truncation], speculator: Speculator | None = None) -> None:
        """``speculator``: this request's drafter and controller (None: plain decoding, one token per step)."""
        self.handle = handle
        self.speculator = speculator
        self.n_prompt_in = len(req.prompt)
        self.tokens = tokens
        self.params = params
        self.n_keep = n_keep
        self.truncations = truncations
        self.sampler: Any = None  # made on the engine thread at the first admission, kept through preemption
        self.prefilled = False  # the prompt is in the KV cache (logits of its last token seen)
        self.out = 0
        self.reason = "length"
        self.preemptions = 0
        self.computed = 0  # prompt tokens computed at the first admission (the rest came from a cache)
        self.reuse = Reuse(0, "none")
        self._text, self._emitted = "", 0
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._hold = max((len(s) for s in params.stop), default=1) - 1
        self.t_submit = time.perf_counter()
        self.t_admit = self.t_first = 0.0

    def admitted(self, reuse: Reuse) -> None:
        if not self.t_admit:  # the first admission: a resumption is not a new prefill
            self.t_admit = time.perf_counter()
            self.reuse = reuse
            self.computed = len(self.tokens) - reuse.tokens

    def accept(self, token: int, backend: Any) -> tuple[str, bool]:
        """Take a sampled token: (text that can be shown now, whether the request is done)."""
        if not self.t_first:
            self.t_first = time.perf_counter()
        if backend.is_eog(token):
            self.reason = "eos"
            return "", True
        self.out += 1
        self._text += self._decoder.decode(backend.token_bytes(token))
        stops = self.params.stop
        cut = find_stop(self._text, stops, self._emitted)
        if cut is not None:
            self._text, self.reason = self._text[:cut], "stop"
            return "", True
        piece = ""
        safe = len(self._text) - self._hold if stops else len(self._text)
        if safe > self._emitted:
            piece, self._emitted = self._text[self._emitted : safe], safe
        if self.out >= self.params.max_tokens:
            return piece, True
        self.tokens.append(token)
        return piece, False

    def finish(self, n_ctx: int, kv_type: str, prefix_cache: dict[str, int]) -> tuple[str, EngineResult]:
        """The text not yet shown, and the result."""
        self._text += self._decoder.decode(b"", final=True)
        if self.reason != "stop":
            cut = find_stop(self._text, self.params.stop, self._emitted)
            if cut is not None:
                self._text, self.reason = self._text[:cut], "stop"
        piece = self._text[self._emitted :]
        self._emitted = len(self._text)
        t_end = time.perf_counter()
        t_first = self.t_first or t_end
        prefill_s = max(t_first - self.t_admit, 1e-9)
        decode_s = t_end - t_first
        result = EngineResult(
            text=self._text,
            tokens_in=self.n_prompt_in,
            tokens_out=self.out,
            stop_reason=self.reason,
            seed=self.params.seed,
            ttft_ms=(t_first - self.t_submit) * 1000,
            prefill_tps=self.computed / prefill_s,
            decode_tps=(self.out - 1) / decode_s if self.out > 1 and decode_s > 0 else 0.0,
            n_ctx=n_ctx,
            kv_type=kv_type,
            prefix_cache_hit=self.reuse.tokens > 0,
            reused_tokens=self.reuse.tokens,
            reuse_source=self.reuse.source,
            peak_rss_bytes=peak_rss_bytes(),
            truncations=self.truncations,
            prefix_cache=prefix_cache,
            queue_ms=((self.t_admit or t_end) - self.t_submit) * 1000,
            preemptions=self.preemptions,
            speculation=self.spec_stats().to_dict(),
        )
        return piece, result

    def spec_stats(self) -> SpecStats:
        """What speculation did for this request (disabled: an empty record)."""
        spec = self.speculator
        return spec.controller.stats if spec is not None else SpecStats()

    def close(self) -> None:
        sampler, self.sampler = self.sampler, None
        if sampler is not None:
            sampler.close()
