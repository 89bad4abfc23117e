"""One generation's decode, whoever drives it: :class:`Decoding`, and what it reports (:class:`Result`,
:class:`Truncation`).

The single stream (runtime/llm/generation.py, in the caller's thread) and every slot of the serving engine
(runtime/serving/engine_loop.py, on the engine thread) each drive one Decoding. It holds every rule of a
generation that does not depend on how its tokens reach the KV cache: the prompt fitted to the context with room
for the answer (:func:`fit_prompt`), the kept start (``n_keep``) a context shift never drops, the seed (a fresh
one reported when none was asked for), the sampler chain (made once by the backend, kept through preemption),
UTF-8 assembled across tokens, stop strings (text that could still become one is held back), the token limit,
the truncations, what speculation did, the timings and the result. A driver decodes; a Decoding decides.
"""

from __future__ import annotations

import codecs
import logging
import secrets
import time
from collections.abc import Sequence as Seq
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol

from runtime.errors import BadInput
from runtime.llm.sampling import SEED_MAX, SamplingParams
from runtime.llm.speculative import SpecStats, Speculator
from runtime.metrics import peak_rss_bytes

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Truncation:
    """Tokens that left the context, reported to the caller, never silent."""

    kind: str  # "prompt" (did not fit), "turns" (oldest chat turns dropped), "shift" (during generation)
    tokens_dropped: int
    at_token: int  # generated tokens so far when it happened
    messages_dropped: int = 0


@dataclass(frozen=True)
class TokenLogprob:
    """A generated token with its log probability and the most likely tokens at its place (``top``: (token, text,
    logprob), best first): the model's own distribution (runtime.llm.sampling.SamplingParams.top_logprobs)."""

    token: int
    text: str  # the token's bytes as text (a partial UTF-8 character shows as U+FFFD; ``bytes`` has it exactly)
    bytes: tuple[int, ...]
    logprob: float
    top: tuple[tuple[int, str, float], ...] = ()


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
    logprobs: list[TokenLogprob] | None = None  # one per generated token, when asked (top_logprobs not None)

    @property
    def truncated(self) -> bool:
        return bool(self.truncations)

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["truncated"] = self.truncated
        return data


class Vocab(Protocol):
    """What a Decoding reads of its backend: end-of-generation tokens and each token's bytes."""

    def is_eog(self, token: int) -> bool: ...

    def token_bytes(self, token: int) -> bytes: ...


class Reused(Protocol):
    """What the KV cache reused of a prompt (runtime.llm.kv.Reuse)."""

    tokens: int
    source: str


def answer_room(max_tokens: int, n_ctx: int) -> int:
    """The cells a context keeps free for the answer when a prompt is fitted into it (the one rule of the
    single-stream LLM, the batching engine's slots and the server's refusals): ``max_tokens``, at most a quarter."""
    return max(1, min(max_tokens, n_ctx // 4))


def default_keep(tokens: Seq[int]) -> int:
    """The tokens a context shift keeps when the caller names none: the BOS token, when the prompt starts with one
    (a first token not repeated by the second)."""
    return 1 if len(tokens) > 1 and tokens[0] != tokens[1] else 0


def fit_prompt(tokens: list[int], n_ctx: int, max_tokens: int, n_keep: int, *, truncate: bool,
               truncations: list[Truncation]) -> list[int]:
    """``tokens`` as a context of ``n_ctx`` cells holds them with :func:`answer_room` left for the answer. A prompt
    that does not fit is refused (BadInput naming its count and the limit) unless ``truncate``: then its middle
    goes (the first ``n_keep`` tokens and the newest kept) and a "prompt" :class:`Truncation` is appended."""
    n = len(tokens)
    room = answer_room(max_tokens, n_ctx)
    if n + room <= n_ctx:
        return tokens
    if not truncate:
        raise BadInput(f"the prompt has {n} tokens but a slot holds {n_ctx}, {n_ctx - room} of them for the prompt "
                       f"with room for {room} generated; shorten it, or ask for truncation")
    tail = n_ctx - room - n_keep
    dropped = n - n_keep - tail
    truncations.append(Truncation("prompt", dropped, 0))
    log.warning("prompt of %d tokens does not fit a %d-token context: dropped %d after the first %d", n, n_ctx, dropped,
                n_keep)
    return tokens[:n_keep] + tokens[n - tail :]


class Decoding:
    """One generation: ``tokens`` is what its KV cells must hold, then the token sampled and not yet decoded.

    Made with the prompt as asked (its tokens are fitted to ``n_ctx`` here, see :func:`fit_prompt`); a driver then
    makes its sampler (``sampler = backend.new_sampler(seq.params)``), calls :meth:`admitted` with what its KV
    cache reused, feeds each sampled token to :meth:`accept` until it says done, reports context shifts with
    :meth:`shifted` and speculation steps with :meth:`verified`, and ends with :meth:`finish` and :meth:`result`.
    """

    def __init__(self, prompt: Seq[int], params: SamplingParams, n_ctx: int, *, n_keep: int | None = None,
                 truncate: bool = True, truncations: Seq[Truncation] = (), speculator: Speculator | None = None) -> None:
        """``speculator``: draft and verify with it (None: plain decoding, one token per step)."""
        tokens = list(prompt)
        if not tokens:
            raise BadInput("the prompt has no tokens")
        if params.seed is None:  # unseeded: a fresh seed per request, reported so the run can be repeated
            params = params.with_(seed=secrets.randbelow(SEED_MAX + 1))
        self.params = params
        self.n_prompt_in = len(tokens)
        keep = default_keep(tokens) if n_keep is None else n_keep
        self.n_keep = max(0, min(keep, n_ctx // 2))  # a context shift must be able to free cells
        self.truncations = list(truncations)
        self.tokens = fit_prompt(tokens, n_ctx, params.max_tokens, self.n_keep, truncate=truncate,
                                 truncations=self.truncations)
        self.prompt = tuple(self.tokens)  # the prompt as fitted (self.tokens grows with the answer)
        self.n_prompt = len(self.prompt)
        self.speculator = speculator
        self.spec = SpecStats(drafter=speculator.drafter.name if speculator else "", enabled=speculator is not None)
        self.sampler: Any = None  # made by the driver from self.params, kept through preemption
        self.out = 0  # tokens generated (an end-of-generation token is not one)
        self.reason = "length"
        self.computed = 0  # prompt tokens computed at the first admission (the rest came from a cache)
        self.reuse_tokens, self.reuse_source = 0, "none"
        self._text, self._emitted = "", 0
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._hold = max((len(s) for s in params.stop), default=1) - 1
        self.logprobs: list[TokenLogprob] = []
        self._logprobs_taken = 0
        self.t_start = time.perf_counter()
        self.t_admit = self.t_first = 0.0

    def admitted(self, reuse: Reused, since: float | None = None) -> None:
        """Its prompt is going into the KV cache, ``reuse.tokens`` of it from a cache (a resumption is no new
        prefill). ``since``: the ``perf_counter()`` time the admission began (restoring a saved prefix is part of
        the prefill the single stream reports); now when not given."""
        if not self.t_admit:
            self.t_admit = time.perf_counter() if since is None else since
            self.reuse_tokens, self.reuse_source = reuse.tokens, reuse.source
            self.computed = self.n_prompt - reuse.tokens

    def accept(self, token: int, vocab: Vocab) -> tuple[str, bool]:
        """Take a sampled token: (text that can be shown now, whether the generation is done). A token that does
        not end it is appended to :attr:`tokens` (pending: the next step decodes it)."""
        if not self.t_first:
            self.t_first = time.perf_counter()
        if self.params.top_logprobs is not None and self.sampler is not None and self.sampler.logprobs:
            logprob, top = self.sampler.logprobs.popleft()  # the sampler's record of this token: sampled in order
            if not vocab.is_eog(token):
                self.logprobs.append(_token_logprob(vocab, token, logprob, top))
        if vocab.is_eog(token):
            self.reason = "eos"
            return "", True
        self.out += 1
        self._text += self._decoder.decode(vocab.token_bytes(token))
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

    def take_logprobs(self) -> list[TokenLogprob]:
        """The tokens' log probabilities recorded since the last call (a stream sends them with its text)."""
        new = self.logprobs[self._logprobs_taken :]
        self._logprobs_taken = len(self.logprobs)
        return new

    def shifted(self, dropped: int) -> None:
        """A context shift dropped ``dropped`` cells after the first :attr:`n_keep`: reported, never silent."""
        self.truncations.append(Truncation("shift", dropped, self.out))
        log.info("context shift: dropped %d tokens after the first %d", dropped, self.n_keep)

    def verified(self, drafted: int, accepted: int, context: Seq[int]) -> None:
        """A speculation step: ``drafted`` tokens were verified after ``context``, the first ``accepted`` of them
        taken; the drafter learns from it (a draft model keeps its own cache in step)."""
        self.spec.add(drafted, accepted)
        if self.speculator is not None:
            self.speculator.drafter.accepted(context, drafted, accepted)

    def finish(self) -> str:
        """The end: the text not yet shown (held back for a stop string, or an unfinished UTF-8 character)."""
        self._text += self._decoder.decode(b"", final=True)
        if self.reason != "stop":
            cut = find_stop(self._text, self.params.stop, self._emitted)
            if cut is not None:
                self._text, self.reason = self._text[:cut], "stop"
        piece = self._text[self._emitted :]
        self._emitted = len(self._text)
        ctl = self.speculator.controller if self.speculator is not None else None
        if ctl is not None:
            self.spec.on = ctl.on
            self.spec.expected_speedup = ctl.expected_speedup()
        return piece

    def result(self, n_ctx: int, kv_type: str, prefix_cache: dict[str, int], cls: type[Result] = Result,
               **extra: Any) -> Result:
        """What the generation did, after :meth:`finish` (``cls``, ``extra``: a driver's own result type and fields).
        TTFT counts from the Decoding's making (a queue's wait included); prefill from its admission."""
        t_end = time.perf_counter()
        t_first = self.t_first or t_end
        prefill_s = max(t_first - (self.t_admit or self.t_start), 1e-9)
        decode_s = t_end - t_first
        return cls(
            text=self._text,
            tokens_in=self.n_prompt_in,
            tokens_out=self.out,
            stop_reason=self.reason,
            seed=self.params.seed,
            ttft_ms=(t_first - self.t_start) * 1000,
            prefill_tps=self.computed / prefill_s,
            decode_tps=(self.out - 1) / decode_s if self.out > 1 and decode_s > 0 else 0.0,
            n_ctx=n_ctx,
            kv_type=kv_type,
            prefix_cache_hit=self.reuse_tokens > 0,
            reused_tokens=self.reuse_tokens,
            reuse_source=self.reuse_source,
            peak_rss_bytes=peak_rss_bytes(),
            truncations=self.truncations,
            prefix_cache=prefix_cache,
            speculation=self.spec.to_dict(),
            logprobs=self.logprobs if self.params.top_logprobs is not None else None,
            **extra,
        )

    def close(self) -> None:
        """Free the sampler (native memory)."""
        sampler, self.sampler = self.sampler, None
        if sampler is not None and hasattr(sampler, "close"):
            sampler.close()


def _token_logprob(vocab: Vocab, token: int, logprob: float, top: list[tuple[int, float]]) -> TokenLogprob:
    raw = vocab.token_bytes(token)
    alts = tuple((t, vocab.token_bytes(t).decode("utf-8", errors="replace"), lp) for t, lp in top)
    return TokenLogprob(token, raw.decode("utf-8", errors="replace"), tuple(raw), logprob, alts)


def find_stop(text: str, stops: Seq[str], start: int) -> int | None:
    """Where the first of ``stops`` begins in ``text``, looking only where one could have ended after ``start``."""
    found = [i for s in stops if (i := text.find(s, max(0, start - len(s)))) >= 0]
    return min(found) if found else None
