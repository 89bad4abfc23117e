"""llama.cpp with several sequences in one context: the primitives of the continuous-batching engine.

llama-cpp-python's ``Llama`` makes a context for one sequence (it cannot set ``n_seq_max``), so this class
loads the model and makes the context itself through the low-level API: ``n_seq_max`` = the plan's slots,
``kv_unified`` off, so that each sequence (sequence id = slot) has a KV stream of its own of ``slot_ctx``
cells, as runtime/llm/plan.py plans it. One :meth:`decode` evaluates rows of several sequences in one
``llama_decode``; each sequence is sampled from its own row (``llama_sampler_sample(smpl, ctx, idx)``).

Everything here runs on the engine's one thread (runtime/serving/engine.py); nothing is locked.
"""

from __future__ import annotations

import ctypes
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from devices.backends import BackendName
from runtime.backends.base import ContextPlan, Offload, Placed, SpecialToken
from runtime.backends.llamacpp import (
    LlamaCppBackend,
    _layer_devices,
    gpu_offload_supported,
    layer_offload,
    tail_kept,
)
from runtime.errors import BackendError, missing, one_line

try:
    import llama_cpp
    from llama_cpp import _internals, _logger
except ImportError as exc:  # pragma: no cover - runtime.backends.llamacpp (imported above) refuses it first
    raise missing("llama_cpp", "llm") from exc

log = logging.getLogger(__name__)
_backend_ready = False


def _init_backend() -> None:
    global _backend_ready
    if not _backend_ready:
        llama_cpp.llama_backend_init()
        _backend_ready = True


@dataclass(frozen=True)
class Row:
    """Tokens of one sequence for one :meth:`LlamaCppBatch.decode`: ``tokens`` at positions ``start..``.

    ``logits``: keep the last token's logits (to sample from); ``logits_all``: keep every token's (a sampled token
    and the draft after it, verified by sampling at each position: runtime/llm/speculative.py)."""

    seq: int
    tokens: Sequence[int]
    start: int
    logits: bool
    logits_all: bool = False


class LlamaCppBatch:
    """One llama.cpp model and context holding ``plan.n_slots`` sequences. Close it to free native memory."""

    name = BackendName.LLAMACPP.value
    can_speculate = True  # Row.logits_all and sample(sampler, index): drafts verified per sequence
    # The vocabulary side is llama.cpp's own, as the single-sequence backend reads it (they use only
    # ``_vocab``, ``_piece`` and ``_specials``): one implementation of each.
    token_bytes = LlamaCppBackend.token_bytes
    is_eog = LlamaCppBackend.is_eog
    special_tokens = LlamaCppBackend.special_tokens

    def __init__(self, path: Path, plan: ContextPlan, placement: Placed, *, native_log: bool = False) -> None:
        """The GGUF at ``path`` with ``plan``'s slots, context and KV cache, on ``placement``'s threads and layers."""
        threads, gpu_layers = placement.threads, placement.gpu_layers
        self._model: Any = None
        self._ctx: Any = None
        self._batch: Any = None
        _init_backend()
        _logger.set_verbose(native_log)  # llama-cpp-python's log callback prints only when verbose (as Llama sets it)
        mparams = llama_cpp.llama_model_default_params()
        mparams.n_gpu_layers = gpu_layers
        mparams.load_mode = llama_cpp.LLAMA_LOAD_MODE_MMAP
        cparams = llama_cpp.llama_context_default_params()
        cparams.n_ctx = plan.n_ctx
        cparams.n_batch = plan.n_batch
        cparams.n_ubatch = plan.n_ubatch
        cparams.n_seq_max = plan.n_slots
        cparams.kv_unified = False  # a KV stream per sequence: slot_ctx cells each, never taken by another slot
        cparams.n_threads = threads
        cparams.n_threads_batch = threads
        cparams.flash_attn_type = llama_cpp.LLAMA_FLASH_ATTN_TYPE_ENABLED  # as the single-sequence backend
        cparams.swa_full = False
        cparams.type_k = plan.kv_type.ggml_type
        cparams.type_v = plan.kv_type.ggml_type
        cparams.no_perf = True
        try:
            with _layer_devices(native_log) as self._layer_devices:
                self._model = _internals.LlamaModel(path_model=str(path), params=mparams, verbose=native_log)
            self._ctx = _internals.LlamaContext(model=self._model, params=cparams, verbose=native_log)
        except (ValueError, RuntimeError) as exc:
            self.close()
            raise BackendError(f"llama.cpp could not load {path} with {plan.n_slots} slots: {one_line(exc)}") from None
        self._vocab = self._model.vocab
        self._mem = llama_cpp.llama_get_memory(self._ctx.ctx)
        self._n_swa = int(llama_cpp.llama_model_n_swa(self._model.model))
        self.n_slots = int(llama_cpp.llama_n_seq_max(self._ctx.ctx))
        self.slot_ctx = int(llama_cpp.llama_n_ctx_seq(self._ctx.ctx))
        self.n_batch = plan.n_batch
        self.n_vocab = int(llama_cpp.llama_vocab_n_tokens(self._vocab))
        if (self.n_slots, self.slot_ctx) != (plan.n_slots, plan.slot_ctx):
            self.close()
            raise BackendError(f"llama.cpp made {self.n_slots} slots of {self.slot_ctx} cells; "
                               f"the plan has {plan.n_slots} of {plan.slot_ctx}")
        self._batch = llama_cpp.llama_batch_init(self.n_batch, 0, 1)
        self.gpu_offload = gpu_offload_supported()
        self._gpu_layers = gpu_layers
        self._piece = ctypes.create_string_buffer(256)
        self._specials: tuple[SpecialToken, ...] | None = None

    def close(self) -> None:
        batch, self._batch = self._batch, None
        if batch is not None:
            llama_cpp.llama_batch_free(batch)
        ctx, self._ctx = self._ctx, None
        if ctx is not None:
            ctx.close()
        model, self._model = self._model, None
        if model is not None:
            model.close()

    def offload(self) -> Offload:
        """Layers (the output layer counted) per device, from llama.cpp's log while the model loaded."""
        return layer_offload(self._model.model, self._layer_devices, gpu_offload=self.gpu_offload,
                             gpu_layers=self._gpu_layers)

    # -- text ----------------------------------------------------------------------------------------------------
    def tokenize(self, text: str, *, add_bos: bool, special: bool) -> list[int]:
        return self._model.tokenize(text.encode("utf-8"), add_bos, special)

    def special_text(self, which: str) -> str:
        """The text of the BOS or EOS token, for chat templates."""
        vocab = self._vocab
        token = llama_cpp.llama_vocab_bos(vocab) if which == "bos" else llama_cpp.llama_vocab_eos(vocab)
        if token < 0:
            return ""
        n = llama_cpp.llama_token_to_piece(vocab, token, self._piece, len(self._piece), 0, True)
        return self._piece.raw[:n].decode("utf-8", errors="replace") if n > 0 else ""

    # -- the sequences ----------------------------------------------------------------------------------------------
    def decode(self, rows: Sequence[Row]) -> list[int]:
        """Evaluate every row in one ``llama_decode``; for each row, the batch index of its logits (-1: none kept):
        of its last token, or with ``logits_all`` of its first (token i's logits at that index + i).

        The rows together hold at most ``n_batch`` tokens (one micro-batch: llama.cpp then either keeps all of
        them or, on failure, none)."""
        batch, n, where = self._batch, 0, []
        for row in rows:
            seq, pos, first, every = row.seq, row.start, n, row.logits_all
            if n + len(row.tokens) > self.n_batch:
                raise ValueError(f"more than {self.n_batch} tokens in one step, the batch holds {self.n_batch}")  # the engine's bug
            for token in row.tokens:
                batch.token[n] = token
                batch.pos[n] = pos
                batch.n_seq_id[n] = 1
                batch.seq_id[n][0] = seq
                batch.logits[n] = every
                n += 1
                pos += 1
            if every and row.tokens:
                where.append(first)
            elif row.logits and row.tokens:
                batch.logits[n - 1] = True
                where.append(n - 1)
            else:
                where.append(-1)
        if not n:
            return where
        batch.n_tokens = n
        code = llama_cpp.llama_decode(self._ctx.ctx, batch)
        if code != 0:
            raise BackendError(f"llama.cpp decode of {n} tokens in {len(rows)} sequences failed (code {code})")
        return where

    def remove(self, seq: int, start: int, end: int = -1) -> bool:
        """Drop the cells of ``seq`` with positions in [start, end) (end -1: to the end); False when a tail cut left
        a sliding window that cannot continue at ``start`` (see :func:`~runtime.backends.llamacpp.tail_kept`)."""
        ok = bool(llama_cpp.llama_memory_seq_rm(self._mem, seq, start, end))
        return ok and (end >= 0 or tail_kept(self._mem, seq, start, self._n_swa))

    def shift(self, seq: int, start: int, end: int, delta: int) -> None:
        llama_cpp.llama_memory_seq_add(self._mem, seq, start, end, delta)

    def can_shift(self) -> bool:
        return bool(llama_cpp.llama_memory_can_shift(self._mem))

    def state_size(self, seq: int) -> int:
        return int(llama_cpp.llama_state_seq_get_size(self._ctx.ctx, seq))

    def save_state(self, seq: int) -> Any:
        """The KV state of ``seq`` (a ctypes byte array; len() is its size), loadable into any slot."""
        size = self.state_size(seq)
        buf = (ctypes.c_uint8 * size)()
        n = llama_cpp.llama_state_seq_get_data(self._ctx.ctx, buf, size, seq)
        if n != size:
            raise BackendError(f"llama.cpp saved {n} of {size} state bytes of sequence {seq}")
        return buf

    def load_state(self, seq: int, data: Any) -> bool:
        """Replace the cells of ``seq`` with a saved state; False (and ``seq`` empty) if llama.cpp refused it."""
        if llama_cpp.llama_state_seq_set_data(self._ctx.ctx, data, len(data), seq) > 0:
            return True
        self.remove(seq, 0, -1)
        return False

    # -- sampling -----------------------------------------------------------------------------------------------------
    # The sampler chain and sampling are the single-sequence backend's own: one chain for every sequence.
    new_sampler = LlamaCppBackend.new_sampler
    check_grammar = LlamaCppBackend.check_grammar
    sample = LlamaCppBackend.sample


class SequenceView:
    """One sequence of a :class:`LlamaCppBatch` with the single-sequence KV primitives of
    :class:`~runtime.backends.base.LLMBackend` (n_ctx, decode, remove, shift, state), so that
    :class:`runtime.llm.kv.KVSequence` keeps each slot's cache (reuse, saved prefixes, context shift) as it keeps the
    single stream's. The engine decodes its steps through :meth:`LlamaCppBatch.decode`, several sequences at once;
    :meth:`decode` here (one sequence alone) serves only KVSequence's recompute fallback."""

    def __init__(self, batch: LlamaCppBatch, seq: int) -> None:
        self.batch, self.seq = batch, seq
        self.n_ctx = batch.slot_ctx

    def decode(self, tokens: Sequence[int], start: int) -> None:
        step = self.batch.n_batch
        for i in range(0, len(tokens), step):
            self.batch.decode([Row(self.seq, tokens[i : i + step], start + i, False)])

    def remove(self, start: int, end: int = -1) -> bool:
        return self.batch.remove(self.seq, start, end)

    def shift(self, start: int, end: int, delta: int) -> None:
        self.batch.shift(self.seq, start, end, delta)

    def can_shift(self) -> bool:
        return self.batch.can_shift()

    def clear(self) -> None:
        self.batch.remove(self.seq, 0, -1)

    def state_size(self) -> int:
        return self.batch.state_size(self.seq)

    def save_state(self) -> Any:
        return self.batch.save_state(self.seq)

    def load_state(self, data: Any) -> bool:
        return self.batch.load_state(self.seq, data)
