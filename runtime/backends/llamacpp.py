"""llama.cpp through llama-cpp-python: the LLM backend for GGUF bundles.

Imported only when a GGUF model is loaded. The ``Llama`` object owns the native
model, context and batch (closed through its ExitStack); this class owns the
``Llama`` and a sampler per generation, and exposes the primitives the engine
needs. The engine (runtime/llm/model.py) decides what is in the KV cache; here we only
keep llama-cpp-python's own token bookkeeping (``n_tokens``) in step with it.

Where the layers went is measured, not inferred from what was asked: while the
model loads, llama.cpp logs (at debug level) the device each layer, and the
output layer, was assigned to, from the devices it really found. Its INFO line
"offloaded X/Y layers to GPU" is no measure: it repeats min(n_gpu_layers, Y)
whenever the build supports offload, even when no GPU device is present.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import math
import re
import sys
import threading
from collections import Counter, deque
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from devices.backends import BackendName
from runtime.backends.base import ContextPlan, LLMBackend, Offload, Placed, SpecialToken
from runtime.errors import BackendError, BadInput, missing
from runtime.llm.sampling import SamplingParams

try:
    import llama_cpp
    from llama_cpp import Llama, _internals
except ImportError as exc:  # pragma: no cover - exercised via sys.modules patching in tests
    raise missing("llama_cpp", "llm") from exc

log = logging.getLogger(__name__)
REPEAT_LAST_N = 64  # tokens the repeat penalty looks back over
# llama_token_attr bits: which tokens the tokenizer splits out before anything else, and which of those
# it matches only when asked to parse special tokens (llama-vocab.cpp, tokenizer_st_partition).
ATTR_SPECIAL = llama_cpp.LLAMA_TOKEN_ATTR_CONTROL | llama_cpp.LLAMA_TOKEN_ATTR_USER_DEFINED | llama_cpp.LLAMA_TOKEN_ATTR_UNKNOWN
ATTR_PARSE_ONLY = llama_cpp.LLAMA_TOKEN_ATTR_CONTROL | llama_cpp.LLAMA_TOKEN_ATTR_UNKNOWN
# llama-model.cpp, load_tensors: "layer %3d assigned to device %s, is_swa = %d" (one line per layer, output included)
LAYER_DEVICE = re.compile(rb"layer +(\d+) assigned to device (\S+), is_swa")
CPU_DEVICE = "CPU"  # ggml_backend_dev_name() of the CPU device
_LOG_LOCK = threading.Lock()  # llama.cpp has one process-wide log callback


@contextlib.contextmanager
def _layer_devices(native_log: bool) -> Iterator[dict[int, str]]:
    """Layer index -> device name, from llama.cpp's own log while the block runs (a model load).

    llama-cpp-python's callback is put back afterwards; its log still reaches stderr with ``native_log``."""
    devices: dict[int, str] = {}

    @llama_cpp.llama_log_callback
    def on_log(level: int, text: bytes, user_data: ctypes.c_void_p) -> None:
        found = LAYER_DEVICE.search(text or b"")
        if found:
            devices[int(found[1])] = found[2].decode("utf-8", "replace")
        if native_log:
            sys.stderr.write((text or b"").decode("utf-8", "replace"))

    from llama_cpp import _logger

    with _LOG_LOCK:
        llama_cpp.llama_log_set(on_log, ctypes.c_void_p(0))
        try:
            yield devices
        finally:
            llama_cpp.llama_log_set(_logger.llama_log_callback, ctypes.c_void_p(0))


def tail_kept(mem: Any, seq: int, start: int, n_swa: int) -> bool:
    """Whether the cells left after dropping positions >= ``start`` of ``seq`` can continue at ``start``.

    llama.cpp's sliding-window layers (Gemma 3: 512 positions) free the cells that fell out of the window as a
    sequence grows; ``llama_memory_seq_rm`` still succeeds when a tail is cut back further than that, and the next
    token would then attend to a window with nothing in it: wrong text, no error. The token at ``start`` needs the
    window's cells from ``start - n_swa`` on, so the cut is kept only when the window's oldest cell
    (``llama_memory_seq_pos_min``, the sliding-window cache's for such a model) reaches back that far; otherwise
    the caller starts the sequence over (llama-server's rule, server-context.cpp ``pos_min_thold``)."""
    if n_swa <= 0 or start <= 0:
        return True
    pos_min = int(llama_cpp.llama_memory_seq_pos_min(mem, seq))
    return 0 <= pos_min <= max(0, start - n_swa)


def grammar_sampler(vocab: Any, grammar: Any) -> Any:
    """llama.cpp's grammar sampler for ``grammar`` (a runtime.llm.grammar.Grammar, read structurally: its ``text``
    and ``what``) over ``vocab``; BadInput when llama.cpp cannot compile it (its parser's reason is in llama.cpp's
    log). The caller owns the sampler (llama_sampler_free, or a chain that takes it)."""
    sampler = llama_cpp.llama_sampler_init_grammar(vocab, grammar.text.encode("utf-8"), b"root")
    if not sampler:
        raise BadInput(f"{grammar.what} does not compile as GBNF: it needs a root rule (root ::= ...), defined rules "
                       f"and no left recursion (llama.cpp's grammar format: GBNF)")
    return sampler


def check_grammar(vocab: Any, grammar: Any) -> None:
    """Compile ``grammar`` once and free it: a request's grammar refused before the request is admitted."""
    llama_cpp.llama_sampler_free(grammar_sampler(vocab, grammar))


GREEDY_PROBE = 64  # tokens a greedy grammar sequence checks one by one after a rejection, before a full pass


class PlainChain(_internals.LlamaSampler):
    """llama-cpp-python's sampler chain, with what the sequence asked to be told of each token it samples:
    ``top_logprobs`` (None: nothing) and the (logprob, alternatives) records not yet taken, oldest first."""

    def __init__(self, top_logprobs: int | None = None) -> None:
        super().__init__()
        self.top_logprobs = top_logprobs
        self.logprobs: deque[tuple[float, list[tuple[int, float]]]] = deque()


class GrammarChain:
    """A sequence's sampler chain with a grammar beside it, sampled the way llama.cpp's own common sampler does:
    the chain picks a token from the whole vocabulary, the grammar checks that one token, and only when it rejects
    it is the grammar applied to every candidate and the chain run again. Applying the grammar to all candidates
    at every step cost 0.9x (SmolLM2, 49k tokens) to 7x (Gemma 3, 262k tokens) of an unconstrained step; the check
    of one token costs next to nothing. Greedy picks the same token either way (the best one the grammar admits).
    The token is then accepted by both: the grammar's state and the penalty history follow the answer."""

    def __init__(self, chain: PlainChain, grammar: Any, n_vocab: int, *, greedy: bool = False) -> None:
        self.chain, self.grammar, self.n_vocab, self.greedy = chain, grammar, n_vocab, greedy
        self.top_logprobs, self.logprobs = chain.top_logprobs, chain.logprobs
        # llama_token_data {int32 id; float logit; float p} as numpy rows: the candidates filled at C speed
        self._cells = np.zeros(n_vocab, dtype=np.dtype([("id", "<i4"), ("logit", "<f4"), ("p", "<f4")]))
        self._ids = np.arange(n_vocab, dtype=np.int32)
        self._cells["id"] = self._ids
        self._moved = False
        self._one = (llama_cpp.llama_token_data * 1)()

    def _candidates(self, ctx: Any, index: int) -> Any:
        logits = np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(ctx, index), shape=(self.n_vocab,))
        cells = self._cells
        if self._moved:  # a sampler sorted the rows in place (top-k does): the ids back in order
            cells["id"], self._moved = self._ids, False
        cells["logit"] = logits  # p is the samplers' own: each that reads it computes it (softmax) first
        return llama_cpp.llama_token_data_array(data=cells.ctypes.data_as(llama_cpp.llama_token_data_p),
                                                size=self.n_vocab, selected=-1, sorted=False)

    def _admits(self, token: int) -> bool:
        self._one[0].id, self._one[0].logit, self._one[0].p = token, 1.0, 0.0
        one = llama_cpp.llama_token_data_array(data=ctypes.cast(self._one, llama_cpp.llama_token_data_p), size=1,
                                               selected=-1, sorted=False)
        llama_cpp.llama_sampler_apply(self.grammar, ctypes.byref(one))
        return bool(np.isfinite(one.data[0].logit))

    def _best_admitted(self, cur: Any) -> int | None:
        """Greedy after a rejection: the best token the grammar admits among the :data:`GREEDY_PROBE` most likely,
        checked one by one in the order greedy picks (logit, then the lower id), or None to fall back on the full
        pass. ``cur`` holds the chain's logits (penalties applied; greedy reorders nothing), so the token is the one
        the grammar's pass over the whole vocabulary and greedy would pick, without that pass (262k tokens for
        Gemma 3): most rejections have an admitted token near the top."""
        if cur.size != self.n_vocab or cur.sorted:
            return None
        cells = self._cells
        logits = cells["logit"]
        top = np.argpartition(logits, -GREEDY_PROBE)[-GREEDY_PROBE:]
        order = top[np.lexsort((cells["id"][top], -logits[top]))]
        for i in order:
            token = int(cells["id"][i])
            if self._admits(token):
                return token
        return None

    def _apply(self, sampler: Any, cur: Any) -> None:
        llama_cpp.llama_sampler_apply(sampler, ctypes.byref(cur))
        self._moved = self._moved or bool(cur.sorted) or cur.size != self.n_vocab

    def sample(self, ctx: Any, index: int) -> int:
        cur = self._candidates(ctx, index)
        self._apply(self.chain.sampler, cur)
        token = int(cur.data[cur.selected].id)
        if not self._admits(token):
            best = self._best_admitted(cur) if self.greedy else None
            if best is not None:
                token = best
            else:
                cur = self._candidates(ctx, index)
                self._apply(self.grammar, cur)
                self._apply(self.chain.sampler, cur)
                token = int(cur.data[cur.selected].id)
        llama_cpp.llama_sampler_accept(self.grammar, token)
        llama_cpp.llama_sampler_accept(self.chain.sampler, token)
        return token

    def close(self) -> None:
        grammar, self.grammar = self.grammar, None
        if grammar:
            llama_cpp.llama_sampler_free(grammar)
        self.chain.close()

    def __del__(self) -> None:  # a generation its caller abandons is never closed: freed with it, as LlamaSampler is
        self.close()


def logprobs_of(ctx: Any, index: int, token: int, top: int, n_vocab: int) -> tuple[float, list[tuple[int, float]]]:
    """(log probability of ``token``, the ``top`` most likely tokens with theirs, best first) at batch row ``index``:
    the log-softmax of the model's logits, before any sampler changed them."""
    logits = np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(ctx, index), shape=(n_vocab,)).astype(np.float64)
    peak = logits.max()
    norm = peak + math.log(float(np.exp(logits - peak).sum()))
    best: list[tuple[int, float]] = []
    if top:
        ids = np.argpartition(logits, -top)[-top:]
        ids = ids[np.argsort(-logits[ids], kind="stable")]
        best = [(int(i), float(logits[i] - norm)) for i in ids]
    return float(logits[token] - norm), best


def sampler_chain(params: SamplingParams, vocab: Any) -> Any:
    """The one sampler chain of every sequence, single stream or engine slot, built once per request from its
    parameters: repeat penalty over the last REPEAT_LAST_N tokens, then greedy, or top-k, typical (off), top-p,
    min-p, temperature and a seeded draw; with a grammar (runtime.llm.grammar) beside it as a :class:`GrammarChain`.
    The chain is llama-cpp-python's own (``Llama._init_sampler``) for these settings, so edgerun samples what raw
    llama-cpp-python samples for the same logits and seed. ``params.seed`` must be set."""
    n_vocab = int(llama_cpp.llama_vocab_n_tokens(vocab))
    sampler = _plain_chain(params, n_vocab)
    if params.grammar is not None:
        return GrammarChain(sampler, grammar_sampler(vocab, params.grammar), n_vocab, greedy=params.temperature == 0.0)
    return sampler


def _plain_chain(params: SamplingParams, n_vocab: int) -> PlainChain:
    sampler = PlainChain(params.top_logprobs)
    if params.logit_bias:  # first, as llama.cpp's common sampler adds it: every sampler after sees the biased logits
        sampler.add_logit_bias(n_vocab, dict(params.logit_bias))
    sampler.add_penalties(n_vocab=n_vocab, penalty_last_n=REPEAT_LAST_N, penalty_repeat=params.repeat_penalty,
                          penalty_freq=0.0, penalty_present=0.0)
    if params.temperature == 0.0:
        sampler.add_greedy()
    else:
        sampler.add_top_k(params.top_k)
        sampler.add_typical(1.0, 1)
        sampler.add_top_p(params.top_p, 1)
        sampler.add_min_p(params.min_p, 1)
        sampler.add_temp(params.temperature)
        sampler.add_dist(params.seed)
    return sampler


def gpu_offload_supported() -> bool:
    return bool(llama_cpp.llama_supports_gpu_offload())


def layer_offload(model: Any, layer_devices: dict[int, str], *, gpu_offload: bool, gpu_layers: int) -> Offload:
    """:class:`~runtime.backends.base.Offload` of the llama.cpp ``model`` (a ``llama_model`` pointer): layers (the
    output layer counted) on a device other than the CPU, from ``layer_devices`` (:func:`_layer_devices` while it
    loaded); unmeasured (``on_accelerator`` None) when llama.cpp did not log every layer's device. Every llama.cpp
    backend (single sequence, batched) reports its offload through this one function."""
    total = llama_cpp.llama_model_n_layer(model) + llama_cpp.llama_model_n_layer_nextn(model) + 1
    if len(layer_devices) != total:
        # This llama.cpp did not log its layer assignment: without GPU offload in the build nothing
        # can have left the CPU; with it, the count is unknown and reported as unmeasured, beside what was asked.
        if not gpu_offload:
            return Offload("layers", 0, total, by_device=((CPU_DEVICE, total),))
        why = f"llama.cpp logged the device of {len(layer_devices)} of its {total} layers"
        log.warning("%s", why)
        return Offload("layers", None, total, why=why, asked=min(gpu_layers, total))
    on = sum(1 for device in layer_devices.values() if device != CPU_DEVICE)
    return Offload("layers", on, total, by_device=tuple(sorted(Counter(layer_devices.values()).items())))


# A short plain text whose tokens are the probe of LlamaCppBackend.exact_batch (its last ``limit`` tokens are decoded
# singly and in batches after the rest).
EXACT_PROBE = ("The keeper of the lighthouse wrote down the wind, the swell and the ships that passed, and lit the lamp "
               "at dusk every evening of the year.")


class LlamaCppBackend(LLMBackend):
    name = BackendName.LLAMACPP.value
    can_speculate = True

    def __init__(self, path: Path, plan: ContextPlan, placement: Placed, *, native_log: bool = False) -> None:
        """The GGUF at ``path`` with ``plan``'s context and KV cache, on ``placement``'s threads and GPU layers."""
        threads, gpu_layers = placement.threads, placement.gpu_layers
        try:
            with _layer_devices(native_log) as self._layer_devices:
                self._llm = Llama(
                    str(path),
                    n_ctx=plan.n_ctx,
                    n_batch=plan.n_batch,
                    n_ubatch=plan.n_ubatch,
                    n_threads=threads,
                    n_threads_batch=threads,
                    n_gpu_layers=gpu_layers,
                    use_mmap=True,
                    flash_attn=True,  # required for a quantized V cache; smaller compute buffers
                    swa_full=False,  # sliding-window layers keep window + ubatch cells (see runtime/llm/plan.py)
                    type_k=plan.kv_type.ggml_type,
                    type_v=plan.kv_type.ggml_type,
                    last_n_tokens_size=REPEAT_LAST_N,
                    verbose=native_log,  # llama.cpp's own log (buffer sizes) on stderr
                )
        except (ValueError, RuntimeError) as exc:
            raise BackendError(f"llama.cpp could not load {path}: {exc}") from None
        self._ctx = self._llm._ctx
        self._vocab = self._llm._model.vocab
        self._mem = llama_cpp.llama_get_memory(self._ctx.ctx)
        self._n_swa = int(llama_cpp.llama_model_n_swa(self._llm._model.model))
        self.n_ctx = self._llm.n_ctx()
        self.n_vocab = int(llama_cpp.llama_vocab_n_tokens(self._vocab))
        self.gpu_offload = gpu_offload_supported()
        self._gpu_layers = gpu_layers
        self._piece = ctypes.create_string_buffer(256)
        self._specials: tuple[SpecialToken, ...] | None = None

    def offload(self) -> Offload:
        return layer_offload(self._llm._model.model, self._layer_devices, gpu_offload=self.gpu_offload,
                             gpu_layers=self._gpu_layers)

    def close(self) -> None:
        llm, self._llm = getattr(self, "_llm", None), None
        if llm is not None:
            llm.close()

    # -- text ------------------------------------------------------------------
    def tokenize(self, text: str, *, add_bos: bool, special: bool) -> list[int]:
        return self._llm.tokenize(text.encode("utf-8"), add_bos=add_bos, special=special)

    def token_bytes(self, token: int) -> bytes:
        n = llama_cpp.llama_token_to_piece(self._vocab, token, self._piece, len(self._piece), 0, False)
        return self._piece.raw[:n] if n > 0 else b""

    def is_eog(self, token: int) -> bool:
        return bool(llama_cpp.llama_vocab_is_eog(self._vocab, token))

    # -- KV cache ----------------------------------------------------------------
    def decode(self, tokens: Sequence[int], start: int, *, logits_all: bool = False) -> None:
        if logits_all:
            self._decode_all(tokens, start)
            return
        self._llm.n_tokens = start  # Llama.eval removes cells >= n_tokens, then decodes in n_batch chunks
        try:
            self._llm.eval(list(tokens))
        except RuntimeError as exc:
            raise BackendError(f"llama.cpp decode failed at position {start}: {exc}") from None

    def _decode_all(self, tokens: Sequence[int], start: int) -> None:
        """One llama_decode of ``tokens`` with the logits of every one kept (Llama.eval keeps only the last one's
        unless the whole Llama was made with logits_all); Llama's own bookkeeping (n_tokens, input_ids) kept in step."""
        llm, n = self._llm, len(tokens)
        if not 0 < n <= llm.n_batch:
            raise ValueError(f"{n} tokens in one verify batch, the batch holds {llm.n_batch}")  # the caller's bug
        llama_cpp.llama_memory_seq_rm(self._mem, -1, start, -1)  # as Llama.eval does: nothing stale after start
        batch = llm._batch.batch
        for i, token in enumerate(tokens):
            batch.token[i] = token
            batch.pos[i] = start + i
            batch.n_seq_id[i] = 1
            batch.seq_id[i][0] = 0
            batch.logits[i] = True
        batch.n_tokens = n
        code = llama_cpp.llama_decode(self._ctx.ctx, batch)
        if code != 0:
            llm.n_tokens = start
            raise BackendError(f"llama.cpp decode of {n} tokens failed at position {start} (code {code})")
        llm.input_ids[start : start + n] = tokens
        llm.n_tokens = start + n

    def exact_batch(self, limit: int) -> int:
        """The largest verify batch, up to ``limit`` tokens, whose every row's logits are bit-identical to those of
        the same tokens decoded one at a time (1: not even 2), measured on this model, build and thread count
        after a short context. llama.cpp computes a batch's matrix products with other kernels than a single
        token's for some weight types (Gemma 3's Q4_K_M differs from 4 rows on, on this x86 CPU), and greedy
        output with speculation is plain decoding's only where the rows agree. Clears the KV cache."""
        import numpy as np

        probe = self.tokenize(EXACT_PROBE, add_bos=True, special=False)
        while len(probe) < limit + 8:  # a vocabulary of short pieces: the text again, until the probe is long enough
            probe += self.tokenize(EXACT_PROBE, add_bos=False, special=False)
        context, tokens = probe[: len(probe) - limit], probe[len(probe) - limit :]
        n_vocab = int(llama_cpp.llama_vocab_n_tokens(self._vocab))

        def row(i: int) -> Any:
            return np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(self._ctx.ctx, i), shape=(n_vocab,)).copy()

        try:
            self.clear()
            self.decode(context, 0)
            single = []
            for j, token in enumerate(tokens):
                self.decode([token], len(context) + j)
                single.append(row(-1))
            exact = 1
            for size in range(2, limit + 1):
                self._decode_all(tokens[:size], len(context))  # drops the cells after the context first
                if not all(np.array_equal(row(i), single[i]) for i in range(size)):
                    break
                exact = size
            return exact
        finally:
            self.clear()

    def remove(self, start: int, end: int = -1) -> bool:
        ok = bool(llama_cpp.llama_memory_seq_rm(self._mem, 0, start, end))
        if ok and end < 0:
            self._llm.n_tokens = min(self._llm.n_tokens, start)
            ok = tail_kept(self._mem, 0, start, self._n_swa)
        return ok

    def shift(self, start: int, end: int, delta: int) -> None:
        llama_cpp.llama_memory_seq_add(self._mem, 0, start, end, delta)

    def can_shift(self) -> bool:
        return bool(llama_cpp.llama_memory_can_shift(self._mem))

    def clear(self) -> None:
        llama_cpp.llama_memory_clear(self._mem, True)
        self._llm.n_tokens = 0

    def state_size(self) -> int:
        return int(llama_cpp.llama_state_seq_get_size(self._ctx.ctx, 0))

    def save_state(self) -> Any:
        # The ctypes array itself is kept (no second copy); len() of it is its size in bytes.
        size = self.state_size()
        buf = (ctypes.c_uint8 * size)()
        n = llama_cpp.llama_state_seq_get_data(self._ctx.ctx, buf, size, 0)
        if n != size:
            raise BackendError(f"llama.cpp saved {n} of {size} state bytes")
        return buf

    def load_state(self, data: Any) -> bool:
        self.clear()
        return llama_cpp.llama_state_seq_set_data(self._ctx.ctx, data, len(data), 0) > 0

    # -- sampling -----------------------------------------------------------------
    def new_sampler(self, params: SamplingParams) -> Any:
        """A sequence's sampler chain for ``params`` (:func:`sampler_chain`; ``params.seed`` must be set)."""
        return sampler_chain(params, self._vocab)

    def check_grammar(self, grammar: Any) -> None:
        """BadInput when ``grammar`` (runtime.llm.grammar.Grammar) does not compile for this model."""
        check_grammar(self._vocab, grammar)

    def sample(self, sampler: Any, index: int = -1) -> int:
        """Sample from the logits of batch row ``index`` of the last decode (and record it for penalties); when the
        sequence asked for log probabilities, record the token's and its alternatives' (:func:`logprobs_of`)."""
        if isinstance(sampler, GrammarChain):
            token = sampler.sample(self._ctx.ctx, index)
        else:
            token = int(llama_cpp.llama_sampler_sample(sampler.sampler, self._ctx.ctx, index))
        if sampler.top_logprobs is not None:
            sampler.logprobs.append(logprobs_of(self._ctx.ctx, index, token, sampler.top_logprobs, self.n_vocab))
        return token

    def special_text(self, which: str) -> str:
        """The text of the BOS or EOS token, for chat templates."""
        token = self._llm.token_bos() if which == "bos" else self._llm.token_eos()
        if token < 0:
            return ""
        n = llama_cpp.llama_token_to_piece(self._vocab, token, self._piece, len(self._piece), 0, True)
        return self._piece.raw[:n].decode("utf-8", errors="replace") if n > 0 else ""

    def special_tokens(self) -> Sequence[SpecialToken]:
        """The tokens llama.cpp's tokenizer splits out first (its ``cache_special_tokens``), longest first."""
        if self._specials is None:
            attr = llama_cpp.llama_vocab_get_attr
            found = []
            for token in range(llama_cpp.llama_vocab_n_tokens(self._vocab)):
                flags = attr(self._vocab, token)
                if not flags & ATTR_SPECIAL:
                    continue
                try:
                    text = llama_cpp.llama_vocab_get_text(self._vocab, token).decode("utf-8")
                except UnicodeDecodeError:  # not text: llama.cpp could match it only inside a character's bytes
                    continue
                if text:
                    found.append(SpecialToken(token, text, bool(flags & ATTR_PARSE_ONLY),
                                              bool(flags & llama_cpp.LLAMA_TOKEN_ATTR_LSTRIP),
                                              bool(flags & llama_cpp.LLAMA_TOKEN_ATTR_RSTRIP)))
            found.sort(key=lambda t: -len(t.text.encode("utf-8")))
            self._specials = tuple(found)
        return self._specials
