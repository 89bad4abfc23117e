"""A generation in progress and what it reports: :class:`Generation`, :class:`Result`, :class:`Truncation`.

Its own module so that runtime/llm.py (which starts generations) and runtime/chat.py
(which starts them for a conversation) both import it without importing each other.
"""

from __future__ import annotations

import codecs
import logging
import secrets
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from runtime.metrics import peak_rss_bytes
from runtime.sampling import SEED_MAX, SamplingParams

if TYPE_CHECKING:
    from runtime.llm import LLM

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Truncation:
    """Tokens that left the context, reported to the caller, never silent."""

    kind: str  # "prompt" (did not fit), "turns" (oldest chat turns dropped), "shift" (during generation)
    tokens_dropped: int
    at_token: int  # generated tokens so far when it happened
    messages_dropped: int = 0


@dataclass
class Result:
    text: str
    tokens_in: int
    tokens_out: int
    stop_reason: str  # "eos", "stop" or "length"
    seed: int  # the sampler's seed: the one asked for, or the fresh one drawn for this request
    ttft_ms: float
    prefill_tps: float  # prompt tokens actually computed per second
    decode_tps: float
    n_ctx: int
    kv_type: str
    prefix_cache_hit: bool
    reused_tokens: int
    reuse_source: str
    peak_rss_bytes: int
    truncations: list[Truncation] = field(default_factory=list)
    prefix_cache: dict[str, int] = field(default_factory=dict)

    @property
    def truncated(self) -> bool:
        return bool(self.truncations)

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["truncated"] = self.truncated
        return data


class Generation:
    """A generation in progress: iterate for text pieces, then read :attr:`result`."""

    def __init__(self, llm: LLM, prompt: list[int], params: SamplingParams, n_keep: int, truncations: list[Truncation]):
        self.llm = llm
        self.params = params
        self.prompt = prompt
        self.n_keep = n_keep
        self.truncations = list(truncations)
        self.result: Result | None = None
        self._iter = self._run()

    def __iter__(self) -> Iterator[str]:
        return self._iter

    def finish(self) -> Result:
        for _ in self._iter:
            pass
        assert self.result is not None
        return self.result

    def _fit_prompt(self) -> list[int]:
        n_ctx = self.llm.n_ctx
        room = answer_room(self.params.max_tokens, n_ctx)
        prompt = self.prompt
        if len(prompt) + room <= n_ctx:
            return prompt
        keep = min(self.n_keep, n_ctx // 2)
        tail = n_ctx - room - keep
        dropped = len(prompt) - keep - tail
        self.truncations.append(Truncation("prompt", dropped, 0))
        log.warning("prompt of %d tokens does not fit %d-token context: dropped %d after the first %d", len(prompt), n_ctx, dropped, keep)
        self.n_keep = keep
        return prompt[:keep] + prompt[len(prompt) - tail :]

    def _run(self) -> Iterator[str]:
        llm, params, backend, kv = self.llm, self.params, self.llm.backend, self.llm.kv
        if params.seed is None:  # unseeded: a fresh seed per request, reported so the run can be repeated
            params = params.with_(seed=secrets.randbelow(SEED_MAX + 1))
        prompt = self._fit_prompt()
        t0 = time.perf_counter()
        reuse = kv.prepare(prompt)
        computed = len(prompt) - reuse.tokens
        kv.append(prompt[reuse.tokens :])
        if computed > 1:
            kv.save_prefix()
        sampler = backend.new_sampler(params)
        decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        stops = params.stop
        hold = max((len(s) for s in stops), default=1) - 1
        text, emitted, out, reason = "", 0, 0, "length"
        t_first = t_prefill = 0.0  # perf_counter() when the first token was sampled
        while out < params.max_tokens:
            token = backend.sample(sampler)
            if not t_first:
                t_first = t_prefill = time.perf_counter()
            if backend.is_eog(token):
                reason = "eos"
                break
            out += 1
            text += decoder.decode(backend.token_bytes(token))
            cut = _find_stop(text, stops, emitted)
            if cut is not None:
                text, reason = text[:cut], "stop"
                break
            safe = len(text) - hold if stops else len(text)
            if safe > emitted:
                yield text[emitted:safe]
                emitted = safe
            if out >= params.max_tokens:
                break
            if len(kv.tokens) >= kv.n_ctx:
                dropped = kv.shift(self.n_keep, (len(kv.tokens) - self.n_keep) // 2)
                self.truncations.append(Truncation("shift", dropped, out))
                log.info("context shift: dropped %d tokens after the first %d", dropped, self.n_keep)
            kv.append([token])
        text += decoder.decode(b"", final=True)
        if reason != "stop":
            cut = _find_stop(text, stops, emitted)
            if cut is not None:
                text, reason = text[:cut], "stop"
        if len(text) > emitted:
            yield text[emitted:]
        t_end = time.perf_counter()
        t_first = t_first or t_end
        t_prefill = t_prefill or t_end
        prefill_s = max(t_prefill - t0, 1e-9)
        decode_s = t_end - t_first
        self.result = Result(
            text=text,
            tokens_in=len(self.prompt),
            tokens_out=out,
            stop_reason=reason,
            seed=params.seed,
            ttft_ms=(t_first - t0) * 1000,
            prefill_tps=computed / prefill_s,
            decode_tps=(out - 1) / decode_s if out > 1 and decode_s > 0 else 0.0,
            n_ctx=llm.n_ctx,
            kv_type=llm.plan.kv_type.value,
            prefix_cache_hit=reuse.tokens > 0,
            reused_tokens=reuse.tokens,
            reuse_source=reuse.source,
            peak_rss_bytes=peak_rss_bytes(),
            truncations=self.truncations,
            prefix_cache=llm.prefix_cache.stats(),
        )


def answer_room(max_tokens: int, n_ctx: int) -> int:
    """The cells a context keeps free for the answer when a prompt is fitted into it (the one rule of the
    single-stream LLM, the batching engine's slots and the server's refusals): ``max_tokens``, at most a quarter."""
    return max(1, min(max_tokens, n_ctx // 4))


def _find_stop(text: str, stops: Sequence[str], start: int) -> int | None:
    found = [i for s in stops if (i := text.find(s, max(0, start - len(s)))) >= 0]
    return min(found) if found else None
