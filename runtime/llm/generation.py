"""A generation in progress and what it reports: :class:`Generation`, :class:`Result`, :class:`Truncation`.

Its own module so that runtime/llm/model.py (which starts generations) and runtime/llm/chat.py
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

from runtime.llm.sampling import SEED_MAX, SamplingParams
from runtime.llm.speculative import SpecStats, Speculator, verify
from runtime.metrics import peak_rss_bytes

if TYPE_CHECKING:
    from runtime.llm.model import LLM

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
    # speculative decoding in this generation: drafter, enabled, on (the controller's state at the end), steps
    # (verify batches), drafted, accepted, acceptance (accepted / drafted), mean_draft (drafted / steps)
    speculation: dict[str, Any] = field(default_factory=dict)

    @property
    def truncated(self) -> bool:
        return bool(self.truncations)

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["truncated"] = self.truncated
        return data


class Generation:
    """A generation in progress: iterate for text pieces, then read :attr:`result`."""

    def __init__(self, llm: LLM, prompt: list[int], params: SamplingParams, n_keep: int, truncations: list[Truncation],
                 speculator: Speculator | None = None):
        """``speculator``: draft and verify with it (None: plain decoding, one token per step)."""
        self.llm = llm
        self.params = params
        self.prompt = prompt
        self.n_keep = n_keep
        self.truncations = list(truncations)
        self.speculator = speculator
        self.spec = SpecStats(drafter=speculator.drafter.name if speculator else "", enabled=speculator is not None)
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
        sampled = self._sampled(sampler, params.max_tokens)
        while out < params.max_tokens:
            token = next(sampled)
            if not t_first:
                t_first = t_prefill = time.perf_counter()
            if backend.is_eog(token):
                reason = "eos"
                break
            out += 1
            text += decoder.decode(backend.token_bytes(token))
            cut = find_stop(text, stops, emitted)
            if cut is not None:
                text, reason = text[:cut], "stop"
                break
            safe = len(text) - hold if stops else len(text)
            if safe > emitted:
                yield text[emitted:safe]
                emitted = safe
            if out >= params.max_tokens:
                break
        sampled.close()  # drops the cells of draft tokens that were never verified
        text += decoder.decode(b"", final=True)
        if reason != "stop":
            cut = find_stop(text, stops, emitted)
            if cut is not None:
                text, reason = text[:cut], "stop"
        if len(text) > emitted:
            yield text[emitted:]
        t_end = time.perf_counter()
        if len(kv.tokens) > len(prompt):  # the prompt and its answer: a chat's next turn extends them in turn
            kv.save_prefix()  # (it supersedes the prompt's entry: runtime/llm/prefix_cache.py)
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
            speculation=self.spec.to_dict(),
        )

    def _shift_if_full(self, out: int) -> None:
        kv = self.llm.kv
        if len(kv.tokens) >= kv.n_ctx:
            dropped = kv.shift(self.n_keep, (len(kv.tokens) - self.n_keep) // 2)
            self.truncations.append(Truncation("shift", dropped, out))
            log.info("context shift: dropped %d tokens after the first %d", dropped, self.n_keep)

    def _sampled(self, sampler: Any, max_tokens: int) -> Iterator[int]:
        """The generated tokens, one at a time, each sampled once with ``sampler``, in order. A token goes into the
        KV cache when the next one is asked for, as in plain decoding: ask only to keep going, then close.

        With a speculator, a token goes into the cache together with a draft of the tokens after it, in one
        batch, and the next tokens are sampled at the drafted positions (runtime/llm/speculative.py, verify): accepted
        draft tokens are in the cache already; the cells of rejected ones are removed before the target's own
        token is handed out. The caller sees what plain decoding gives (greedy: token-identical)."""
        backend, kv, spec = self.llm.backend, self.llm.kv, self.speculator
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
                        self.spec.saved_s += (step[1] + 1) * ctl.t_plain - (now - step[2])
                    ctl.observe(step[0], step[1], now - step[2])
                self._shift_if_full(out)
                draft: list[int] = []
                if spec is not None and ctl is not None:
                    drafting = time.perf_counter()
                    k = min(ctl.plan(min(kv.n_ctx - len(kv.tokens) - 1, max_tokens - out - 1)), self.llm.max_draft)
                    if k:
                        draft = spec.drafter.draft([*kv.tokens, token], k)
                    elif ctl.wants_shadow() and spec.drafter.cheap:
                        ctl.shadow(spec.drafter.draft([*kv.tokens, token], ctl.k_max))
                    self.spec.draft_s += time.perf_counter() - drafting
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
                self.spec.add(drafted, accepted)
                spec.drafter.accepted(kv.tokens[:context_len], drafted, accepted)
                step = (drafted, accepted, now)
        finally:  # the caller is done (EOS, stop, max_tokens) or failed: drop draft cells that were never verified
            if verifying is not None:
                self.spec.add(*verifying)
            if len(kv.tokens) > confirmed and not kv.truncate(confirmed) and ctl is not None:
                ctl.disable("the KV cache cannot drop draft cells in place")
            if ctl is not None:
                self.spec.on = ctl.on
                self.spec.expected_speedup = ctl.expected_speedup()


def answer_room(max_tokens: int, n_ctx: int) -> int:
    """The cells a context keeps free for the answer when a prompt is fitted into it (the one rule of the
    single-stream LLM, the batching engine's slots and the server's refusals): ``max_tokens``, at most a quarter."""
    return max(1, min(max_tokens, n_ctx // 4))


def find_stop(text: str, stops: Sequence[str], start: int) -> int | None:
    found = [i for s in stops if (i := text.find(s, max(0, start - len(s)))) >= 0]
    return min(found) if found else None
