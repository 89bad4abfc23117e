"""A draft model for speculative decoding: a second, cheaper model that proposes the target's next tokens.

The draft is the target at a lower quantization (self-speculation: the q4_0 of a q8_0 target, made with
``edgerun convert draft``) or a smaller member of its family. It must share the target's vocabulary, token for
token: a draft token id is verified as the target's token of the same id. That is checked before anything is
allocated, twice: the GGUF headers (:func:`check_header_vocab`: vocabulary size, tokenizer, special ids), then
llama.cpp's own vocabularies loaded alone (:func:`check_vocab`: the text of every special token and of an even
sample of the rest). A mismatch is one BadInput line naming both models.

:class:`DraftModel` runs the draft in a llama.cpp context of its own (the target's context size, KV type and
micro-batch, the placement's threads: the two never run at once) and drafts greedily: a point mass per position,
so the target's sample-and-compare verification (runtime/llm/speculative.py) is exact. Its KV cache follows the
target's tokens lazily: each :meth:`DraftModel.draft` keeps the longest common prefix with the context it is given
(dropping its rejected drafts), decodes what the target accepted since, then proposes. Catching up is bounded:
further behind than WINDOW tokens, it restarts on the context's last WINDOW tokens.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from runtime.errors import BackendError, BadInput
from runtime.llm.kv import KVSequence
from runtime.llm.plan import DRAFT_VOCAB_HOW as HOW  # one wording for both checks (the header one is the planner's)
from runtime.llm.plan import DraftTerms, MemoryPlan
from runtime.llm.prefix_cache import PrefixCache, common_prefix
from runtime.llm.sampling import SamplingParams

if TYPE_CHECKING:
    from runtime.bundle.resolve import ResolvedModel

log = logging.getLogger(__name__)
# Tokens a draft decodes at most to catch up with the target (see DraftModel._view): about 60 ms of a q4_0 135M
# draft's batched decoding on one x86 core, against 8 ms per token of the target's decoding.
WINDOW = 64
VOCAB_SAMPLE = 1024  # ordinary tokens whose text is compared, evenly spread over the vocabulary (specials: all)
@contextlib.contextmanager
def vocab_only(path: Path) -> Iterator[Any]:
    """llama.cpp's vocabulary of the GGUF at ``path``, loaded without its tensors (a ``llama_vocab`` pointer)."""
    from runtime.backends.llamacpp import llama_cpp  # imported the one way the backend imports it

    params = llama_cpp.llama_model_default_params()
    params.vocab_only = True
    # llama-cpp-python prints llama.cpp's log to stderr from its logger's level up; its level map is older than this
    # llama.cpp's (a WARN arrives as ERROR), so nothing is printed while the vocabulary loads: a failure raises below
    native = logging.getLogger("llama-cpp-python")
    level = native.level
    native.setLevel(logging.CRITICAL + 1)
    try:
        model = llama_cpp.llama_model_load_from_file(str(path).encode(), params)
    finally:
        native.setLevel(level)
    if not model:
        raise BackendError(f"llama.cpp could not read the vocabulary of {path}")
    try:
        yield llama_cpp.llama_model_get_vocab(model)
    finally:
        llama_cpp.llama_model_free(model)


def check_vocab(target: Any, draft: Any, target_name: str, draft_name: str) -> None:
    """BadInput unless llama.cpp's vocabularies ``target`` and ``draft`` (``llama_vocab`` pointers) agree: the size,
    the special ids, the text and attributes of every special token and the text of an even sample of the others."""
    from runtime.backends.llamacpp import llama_cpp

    n = llama_cpp.llama_vocab_n_tokens(target)
    n_draft = llama_cpp.llama_vocab_n_tokens(draft)
    if n != n_draft:
        raise BadInput(f"draft model {draft_name} has a vocabulary of {n_draft} tokens but the target {target_name}"
                       f" has {n}: {HOW}")
    attr, text = llama_cpp.llama_vocab_get_attr, llama_cpp.llama_vocab_get_text
    step = max(1, n // VOCAB_SAMPLE)
    normal = llama_cpp.LLAMA_TOKEN_ATTR_NORMAL
    for token in range(n):
        flags = attr(target, token)
        if token % step and token != n - 1 and flags == normal:
            continue
        if flags != attr(draft, token) or text(target, token) != text(draft, token):
            mine, theirs = (text(v, token).decode("utf-8", "replace") for v in (draft, target))
            raise BadInput(f"draft model {draft_name}'s token {token} is {mine!r:.40} but the target {target_name}'s is"
                           f" {theirs!r:.40}: {HOW}")
    for which in ("bos", "eos", "eot", "sep", "nl", "pad"):
        get = getattr(llama_cpp, f"llama_vocab_{which}")
        if get(target) != get(draft):
            raise BadInput(f"draft model {draft_name}'s {which} token is {get(draft)} but the target {target_name}'s is"
                           f" {get(target)}: {HOW}")


def check_same_vocab(target: Path, draft: Path, target_name: str, draft_name: str) -> None:
    """:func:`check_vocab` on the two GGUF files, each vocabulary loaded alone (no weights, no context)."""
    with vocab_only(target) as tv, vocab_only(draft) as dv:
        check_vocab(tv, dv, target_name, draft_name)


def resolve_draft(draft: str | ResolvedModel) -> ResolvedModel:
    """The draft model, resolved as any model is (bundle, .gguf, name); it must be a llama.cpp LLM too."""
    from devices.backends import BackendName
    from runtime.bundle.manifest import ModelKind
    from runtime.bundle.resolve import resolve

    found = resolve(draft) if isinstance(draft, str) else draft
    if found.manifest.kind != ModelKind.LLM or found.manifest.backend != BackendName.LLAMACPP:
        raise BadInput(f"--draft {found.manifest.ref} is a {found.manifest.kind.value} model for"
                       f" {found.manifest.backend.value}; a draft model is a GGUF language model sharing the target's vocabulary")
    return found


def draft_plan(plan: MemoryPlan) -> MemoryPlan:
    """The plan the draft's own llama.cpp context is opened with: ``plan.draft``'s terms, the target's budget."""
    d: DraftTerms | None = plan.draft
    if d is None:
        raise ValueError("the plan has no draft model")  # a bug, not input
    return replace(plan, model=d.model, weights_bytes=d.weights_bytes, kv_bytes=d.kv_bytes, kv_swa_bytes=0,
                   compute_bytes=d.compute_bytes, compute_reserved_bytes=d.compute_reserved_bytes, prefix_cache_bytes=0,
                   runtime_bytes=0, vocab_bytes=d.vocab_bytes, n_ctx=d.n_ctx, kv_type=d.kv_type, n_ubatch=d.n_ubatch,
                   n_batch=d.n_ubatch, n_slots=1, slot_ctx=d.n_ctx, draft=None)


class DraftModel:
    """A :class:`~runtime.llm.speculative.Drafter` backed by a second model: greedy drafts, its KV cache in step with
    the target's tokens. Owns its backend: close it (or use ``with``)."""

    name = "draft-model"
    cheap = False  # a model runs per draft: asked only when the controller plans a draft

    def __init__(self, backend: Any, ref: str) -> None:
        """Takes ownership of ``backend`` (an LLMBackend on the draft GGUF); closed here if setup fails."""
        self.backend = backend
        self.ref = ref
        try:
            self.kv = KVSequence(backend, PrefixCache(0))
            # temperature 0: llama.cpp's greedy sampler (argmax); repeat penalty 1: its penalties stage does nothing
            self._greedy = backend.new_sampler(SamplingParams(temperature=0.0, repeat_penalty=1.0, seed=0))
        except BaseException:
            backend.close()
            raise
        self.drafted = 0
        self.accepted_tokens = 0
        self._offset = 0  # context tokens before the draft's own first one (see _view)

    @classmethod
    def open(cls, path: Path, plan: MemoryPlan, placement: Any) -> DraftModel:
        """The draft GGUF at ``path`` in a context sized by ``plan.draft`` (see :func:`draft_plan`) on ``placement``."""
        from runtime.backends.llamacpp import LlamaCppBackend

        dplan = draft_plan(plan)
        return cls(LlamaCppBackend(path, dplan, placement), dplan.model)

    @property
    def n_ctx(self) -> int:
        return self.kv.n_ctx

    def draft(self, context: Sequence[int], n: int) -> list[int]:
        """Up to ``n`` greedy tokens that follow ``context`` (every token so far, the last one not yet verified).

        Fewer when the draft proposes an end of generation (it is the last) or its context has no room left."""
        if n <= 0 or not context:
            return []
        view = self._view(context, n)
        n = min(n, self.kv.n_ctx - len(view) + 1)  # view + n - 1 drafts are decoded
        if n <= 0:
            return []
        reuse = self.kv.prepare(view)
        self.kv.append(view[reuse.tokens :])
        out: list[int] = []
        while True:
            token = self.backend.sample(self._greedy)
            out.append(token)
            if len(out) >= n or self.backend.is_eog(token):
                break
            self.kv.append([token])
        self.drafted += len(out)
        return out

    def _view(self, context: Sequence[int], n: int) -> Sequence[int]:
        """What of ``context`` the draft holds: the tokens from ``_offset`` on. While it drafts every step, that is
        the whole context and each step decodes only what the target emitted since. When it would have more than
        WINDOW tokens to decode (a new prompt, a context shift, or steps taken while speculation was off), it
        restarts on the last WINDOW tokens instead: a draft costs at most WINDOW tokens of catching up, so a drafter
        the controller switched off costs little when it is tried again, however long it was off."""
        view = context[self._offset :] if self._offset < len(context) else ()
        behind = len(view) - common_prefix(self.kv.tokens, view)
        if not view or behind > WINDOW or len(view) + n - 1 > self.kv.n_ctx:
            self._offset = max(0, len(context) - WINDOW)
            view = context[self._offset :]
        return view

    def accepted(self, context: Sequence[int], n_drafted: int, n_accepted: int) -> None:
        """Nothing to do now: the next :meth:`draft` drops the rejected cells and decodes what the target emitted."""
        self.accepted_tokens += n_accepted

    def close(self) -> None:
        self.backend.close()

    def __enter__(self) -> DraftModel:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

