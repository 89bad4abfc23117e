"""One request inside the engine: its :class:`~runtime.llm.decoding.Decoding` (the rules of every generation,
shared with the single stream) plus what the engine adds: the caller's handle, preemptions and the queue's wait.

A :class:`SeqState` is the payload of the request's scheduler Job, so it travels with the job when the request is
preempted and requeued: the sampler (its RNG and penalty history), the text and the counters stay as they were,
and the request resumes exactly where it stopped.
"""

from __future__ import annotations

from collections.abc import Sequence

from runtime.llm.decoding import Decoding, Truncation
from runtime.llm.sampling import SamplingParams
from runtime.llm.speculative import Speculator
from runtime.serving.engine_requests import EngineResult, GenHandle


class SeqState(Decoding):
    """``tokens``: what the slot's KV cache must hold, then the pending token (sampled, not yet decoded)."""

    def __init__(self, handle: GenHandle, prompt: Sequence[int], params: SamplingParams, slot_ctx: int, *,
                 n_keep: int | None, truncate: bool, truncations: Sequence[Truncation],
                 speculator: Speculator | None = None) -> None:
        """The prompt is fitted to a slot of ``slot_ctx`` cells here (BadInput when it does not fit, unless
        ``truncate``); ``speculator``: this request's drafter and controller (None: plain decoding)."""
        super().__init__(prompt, params, slot_ctx, n_keep=n_keep, truncate=truncate, truncations=truncations,
                         speculator=speculator)
        self.handle = handle
        self.prefilled = False  # the prompt is in the KV cache (logits of its last token seen)
        self.preemptions = 0

    def engine_result(self, n_ctx: int, kv_type: str, prefix_cache: dict[str, int]) -> tuple[str, EngineResult]:
        """The text not yet shown, and the result (TTFT from submit, the queue's wait included)."""
        piece = self.finish()
        queue_ms = ((self.t_admit or self.t_start) - self.t_start) * 1000
        result = self.result(n_ctx, kv_type, prefix_cache, EngineResult, queue_ms=queue_ms,
                             preemptions=self.preemptions)
        assert isinstance(result, EngineResult)
        return piece, result
