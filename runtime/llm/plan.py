"""Memory planning for LLMs: decide before anything is allocated.

Every term comes from the GGUF's own metadata and is in bytes of *resident*
memory (what RSS measures), because that is what runs out on a small device:

* ``weights``: the tensor data, memory-mapped and fully touched while running;
* ``kv``: the KV cache, allocated and cleared by llama.cpp at load (so resident
  at once): per cell and layer ``n_head_kv * (key_length + value_length)``
  elements of the KV type. Sliding-window layers (Gemma 3: 5 of every 6) hold
  only ``pad256(min(n_ctx, window + n_ubatch))`` cells, because edgerun loads with
  ``swa_full=False``; full-attention layers hold ``n_ctx`` cells (padded to 256
  for flash attention);
* ``compute``: activations of one micro-batch (``n_ubatch`` tokens) plus the rows
  of logits read back: per sequence, its next token's and one per drafted token that
  speculative decoding verifies in the same step (``VERIFY_ROWS``). llama.cpp
  *reserves* the worst case (logits for every token of a micro-batch: 512 MiB for
  Gemma's 262k vocabulary) as address space, but only
  the rows we ask for are ever touched; the reservation is reported as
  ``compute_reserved`` and not counted against the budget;
* ``prefix_cache``: the byte bound of saved prefix states;
* ``runtime``: the Python interpreter, numpy and libllama themselves, plus
  llama.cpp's fixed per-context allocations;
* ``vocab``: tokenizer tables, about 128 bytes per vocabulary entry (llama.cpp's
  vocabulary plus llama-cpp-python's candidate array);
* ``draft``: with a draft model for speculative decoding (runtime/llm/draft.py), its
  weights, KV cache, compute and vocabulary tables, each a term of its own. The draft
  runs in a second llama.cpp context with the target's context size, KV type and
  micro-batch (it holds the same tokens); the interpreter and libraries are shared.

A plan fits when its total plus a reserve of 5 % of the budget is within the
budget. The two constants were fitted on x86_64 from SmolLM2 (49k vocabulary) and
Gemma 3 (262k) at 2k and 8k context; bench/llm.py measures the plan's error.

The planner picks the context size, KV type and micro-batch: the desired
context (``--ctx``, else the training context capped at 8192) with an f16 KV
cache if it fits, else q8_0 (about half the bytes), else smaller micro-batches,
else the largest context that fits. If the weights alone do not fit it refuses,
saying by how much.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from runtime.errors import BadInput, DoesNotFit
from runtime.formats.gguf_file import GGUFInfo
from runtime.llm.speculative import K_MAX
from runtime.units import fmt_bytes

RUNTIME_OVERHEAD = 80 << 20  # interpreter + numpy + libllama + jinja2 + fixed context allocations (x86_64, see above)
RESERVE_FRACTION = 0.05  # of the budget, kept free for what the terms do not model (allocator slack, page tables)
VOCAB_ENTRY_BYTES = 128
DEFAULT_MAX_CTX = 8192
MIN_CTX = 256
CTX_PAD = 256  # llama.cpp pads n_ctx to 256 cells when flash attention is on
UBATCH_CHOICES = (512, 256, 128, 64)
MAX_SLOTS = 64  # sequences in one context; every step decodes one token of each, so a micro-batch (>= 64) holds them

DRAFT_VOCAB_HOW = ("a draft must share the target's vocabulary: the same model at another quantization (edgerun convert draft"
                   " TARGET --out DRAFT.gguf) or a smaller member of its family")
# Header keys a draft model must share with its target: they decide how text becomes tokens and which ids are special.
TOKENIZER_KEYS = ("tokenizer.ggml.model", "tokenizer.ggml.pre", "tokenizer.ggml.bos_token_id",
                  "tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id")

# Layers with sliding-window attention, by architecture: llama.cpp's own rules
# (src/llama-model.cpp, set_swa_pattern), used when the GGUF does not carry
# ``{arch}.attention.sliding_window_pattern``. pattern n: every n-th layer is global.
SWA_PATTERNS = {"gemma3": 6, "gemma2": 2, "cohere2": 4, "gemma3n": 5}


class KVType(str, enum.Enum):
    F16 = "f16"
    Q8_0 = "q8_0"

    @property
    def bytes_per_element(self) -> float:
        return {"f16": 2.0, "q8_0": 34 / 32}[self.value]  # q8_0: 32 int8 + one f16 scale

    @property
    def ggml_type(self) -> int:
        return {"f16": 1, "q8_0": 8}[self.value]  # GGML_TYPE_F16, GGML_TYPE_Q8_0


def _pad(n: int, to: int) -> int:
    return (n + to - 1) // to * to


def _per_layer(value: Any, n_layer: int, what: str) -> list[int]:
    if isinstance(value, list):
        if len(value) != n_layer:
            raise BadInput(f"GGUF {what} has {len(value)} entries for {n_layer} layers")
        return [int(v) for v in value]
    return [int(value)] * n_layer


@dataclass(frozen=True)
class LLMShape:
    """The numbers of a transformer that memory depends on, as :func:`runtime.formats.gguf_file.read_gguf` checked them
    (layer count bounded by the tensors present, every size by the file's tensor dimensions)."""

    architecture: str
    n_layer: int
    n_embd: int
    n_head: int
    n_head_kv: tuple[int, ...]  # per layer
    key_length: int
    value_length: int
    n_ff: int
    n_vocab: int
    n_ctx_train: int
    swa_window: int  # 0: no sliding window
    swa_layers: tuple[bool, ...]

    @classmethod
    def from_gguf(cls, info: GGUFInfo) -> LLMShape:
        arch = info.architecture
        n_layer = int(info.arch_value("block_count", 0) or 0)
        n_embd = int(info.arch_value("embedding_length", 0) or 0)
        n_head_raw = info.arch_value("attention.head_count", 0)
        if n_layer <= 0 or n_embd <= 0 or not n_head_raw:
            raise BadInput(f"{info.path}: GGUF lacks {arch}.block_count/embedding_length/attention.head_count; cannot plan memory")
        heads = _per_layer(n_head_raw, n_layer, "head_count")
        n_head = max(heads)
        if n_head <= 0:
            raise BadInput(f"{info.path}: GGUF {arch}.attention.head_count is 0 in every layer; cannot plan memory")
        n_head_kv = _per_layer(info.arch_value("attention.head_count_kv", n_head_raw), n_layer, "head_count_kv")
        head_dim = n_embd // heads[0] if heads[0] else n_embd // n_head  # llama.cpp: n_embd / the first layer's head count
        n_ff_raw = info.arch_value("feed_forward_length", 4 * n_embd)
        window = int(info.arch_value("attention.sliding_window", 0) or 0)
        pattern = info.arch_value("attention.sliding_window_pattern", None)
        if window and isinstance(pattern, list):
            swa = tuple(bool(p) for p in pattern[:n_layer])
        elif window and arch in SWA_PATTERNS:
            every = int(pattern) if isinstance(pattern, int) and pattern > 0 else SWA_PATTERNS[arch]
            swa = tuple(il % every < every - 1 for il in range(n_layer))
        else:
            window, swa = 0, (False,) * n_layer
        return cls(
            architecture=arch,
            n_layer=n_layer,
            n_embd=n_embd,
            n_head=n_head,
            n_head_kv=tuple(n_head_kv),
            key_length=int(info.arch_value("attention.key_length", head_dim)),
            value_length=int(info.arch_value("attention.value_length", head_dim)),
            n_ff=max(_per_layer(n_ff_raw, n_layer, "feed_forward_length")),
            n_vocab=info.n_vocab,
            n_ctx_train=int(info.arch_value("context_length", 0) or 0),
            swa_window=window,
            swa_layers=swa,
        )

    def kv_cell_bytes(self, kv: KVType, swa: bool) -> float:
        """Bytes of one KV cell summed over the full-attention (or sliding-window) layers."""
        return sum(
            h * (self.key_length + self.value_length) * kv.bytes_per_element
            for h, is_swa in zip(self.n_head_kv, self.swa_layers, strict=True)
            if is_swa == swa
        )

    def swa_cells(self, n_ctx: int, n_ubatch: int) -> int:
        return min(n_ctx, _pad(self.swa_window + n_ubatch, CTX_PAD)) if self.swa_window else 0

    def compute_bytes(self, n_ubatch: int, outputs: int = 1) -> int:
        """Resident activations of one micro-batch (f32) plus the rows of logits read back: one per sequence decoded
        together (``outputs``), and one more."""
        q = self.n_head * self.key_length
        kv = max(self.n_head_kv) * (self.key_length + self.value_length)
        per_token = 3 * self.n_embd + q + kv + self.n_head * self.value_length + 3 * self.n_ff
        return int(n_ubatch * per_token * 4 + self.logits_bytes(outputs))

    def logits_bytes(self, outputs: int) -> int:
        """The rows of logits (f32) read back to the host: one per output, and one more."""
        return (1 + outputs) * self.n_vocab * 4

    def compute_reserved_bytes(self, n_ubatch: int, outputs: int = 1) -> int:
        """What llama.cpp reserves as address space: logits for a whole micro-batch."""
        return int(self.compute_bytes(n_ubatch, outputs) + n_ubatch * self.n_vocab * 4)


@dataclass(frozen=True)
class DraftTerms:
    """What a draft model adds to a plan: its own context of the target's ``n_ctx`` cells, KV type and micro-batch."""

    model: str
    weights_bytes: int
    kv_bytes: int
    compute_bytes: int
    compute_reserved_bytes: int
    vocab_bytes: int
    n_ctx: int
    kv_type: KVType
    n_ubatch: int

    @property
    def total_bytes(self) -> int:
        return self.weights_bytes + self.kv_bytes + self.compute_bytes + self.vocab_bytes

    @classmethod
    def build(cls, shape: LLMShape, name: str, weights: int, n_ctx: int, kv: KVType, ub: int) -> DraftTerms:
        swa = int(shape.kv_cell_bytes(kv, swa=True) * shape.swa_cells(n_ctx, ub))
        return cls(model=name, weights_bytes=weights, kv_bytes=int(shape.kv_cell_bytes(kv, swa=False) * n_ctx) + swa,
                   compute_bytes=shape.compute_bytes(ub), compute_reserved_bytes=shape.compute_reserved_bytes(ub),
                   vocab_bytes=shape.n_vocab * VOCAB_ENTRY_BYTES, n_ctx=n_ctx, kv_type=kv, n_ubatch=ub)


@dataclass(frozen=True)
class MemoryPlan:
    model: str
    budget_bytes: int
    weights_bytes: int
    kv_bytes: int
    kv_bytes_per_token: float  # full-attention layers: grows with n_ctx
    kv_swa_bytes: int  # sliding-window layers: fixed size
    compute_bytes: int
    compute_reserved_bytes: int
    prefix_cache_bytes: int
    runtime_bytes: int
    vocab_bytes: int
    n_ctx: int
    kv_type: KVType
    n_ubatch: int
    n_batch: int
    swa: dict[str, int] = field(default_factory=dict)
    n_slots: int = 1  # sequences decoded together (runtime/serving/engine.py), each in its own KV stream of slot_ctx cells
    slot_ctx: int = 0  # cells per slot: n_ctx = n_slots * slot_ctx (0 when built by hand: n_ctx / n_slots)
    draft: DraftTerms | None = None  # a draft model's terms (runtime/llm/draft.py), counted in the total
    device: DeviceSplit | None = None  # host and device terms once the load put layers on a GPU (split_by_device)

    def __post_init__(self) -> None:
        if not self.slot_ctx:
            object.__setattr__(self, "slot_ctx", self.n_ctx // max(1, self.n_slots))

    @property
    def total_bytes(self) -> int:
        return (self.weights_bytes + self.kv_bytes + self.compute_bytes + self.prefix_cache_bytes + self.runtime_bytes
                + self.vocab_bytes + (self.draft.total_bytes if self.draft else 0))

    @property
    def reserve_bytes(self) -> int:
        return int(self.budget_bytes * RESERVE_FRACTION)

    @property
    def fits(self) -> bool:
        return self.total_bytes + self.reserve_bytes <= self.budget_bytes

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["kv_type"] = self.kv_type.value
        if self.draft is not None:
            data["draft"] = {**data["draft"], "kv_type": self.draft.kv_type.value, "total_bytes": self.draft.total_bytes}
        data["device"] = self.device.to_dict() if self.device is not None else None
        data["total_bytes"] = self.total_bytes
        data["reserve_bytes"] = self.reserve_bytes
        data["fits"] = self.fits
        data["headroom_bytes"] = self.budget_bytes - self.total_bytes - self.reserve_bytes
        return data

    def table(self) -> str:
        rows = [
            ("weights (mmap)", self.weights_bytes),
            (f"KV cache ({self.kv_type.value}, {self._ctx_text()})", self.kv_bytes),
            (f"compute ({self.n_ubatch}-token micro-batch)", self.compute_bytes),
            ("prefix cache (bound)", self.prefix_cache_bytes),
            ("runtime (python + libs)", self.runtime_bytes),
            ("vocabulary tables", self.vocab_bytes),
            *self._draft_rows(),
            ("total", self.total_bytes),
            ("reserve (5% of budget)", self.reserve_bytes),
            ("budget", self.budget_bytes),
        ]
        lines = [f"plan for {self.model}"]
        lines += [f"  {name:<38} {fmt_bytes(value):>11}" for name, value in rows]
        if self.n_slots > 1:
            lines.append(f"  slots: {self.n_slots} sequences decoded together, each {self.slot_ctx} tokens of context"
                         f" ({fmt_bytes(self.kv_bytes // self.n_slots)} of KV cache each)")
        if self.draft is not None:
            lines.append(f"  draft model: {self.draft.model} (speculative decoding, a context of its own)")
        if self.swa:
            per = " per slot" if self.n_slots > 1 else ""
            lines.append(f"  sliding window: {self.swa['layers']} layers x {self.swa['cells']} cells{per} (window {self.swa['window']})")
        if self.device is not None:
            lines += self.device.table()
        headroom = self.budget_bytes - self.total_bytes - self.reserve_bytes
        lines.append(f"  fits: {'yes' if self.fits else 'no'} (headroom {fmt_bytes(headroom)});"
                     f" compute address space reserved: {fmt_bytes(self.compute_reserved_bytes)}")
        return "\n".join(lines)

    def with_device(self, split: DeviceSplit) -> MemoryPlan:
        """This plan with where its bytes are once loaded (:func:`runtime.llm.plan_device.split_by_device`)."""
        return dataclasses.replace(self, device=split)

    def _draft_rows(self) -> list[tuple[str, int]]:
        d = self.draft
        if d is None:
            return []
        return [
            ("draft weights (mmap)", d.weights_bytes),
            (f"draft KV cache ({d.kv_type.value}, {d.n_ctx} ctx)", d.kv_bytes),
            (f"draft compute ({d.n_ubatch}-token micro-batch)", d.compute_bytes),
            ("draft vocabulary tables", d.vocab_bytes),
        ]

    def _ctx_text(self) -> str:
        return f"{self.n_ctx} ctx" if self.n_slots == 1 else f"{self.n_slots} x {self.slot_ctx} ctx"


# Rows of logits one sequence reads back in a step: its next token, and each token of a speculative draft
# verified with it (runtime/llm/speculative.py K_MAX). llama.cpp grows its output buffer to the rows asked for,
# so a verify step touches them all (about 1 MiB a row for Gemma 3's 262k vocabulary).
VERIFY_ROWS = 1 + K_MAX


def default_prefix_cache_bytes(budget: int) -> int:
    """1/16 of the budget, at most 256 MiB: small on small devices (a 1 GiB budget keeps 64 MiB), and on a box
    with memory to spare room for the saved turns of about ten alternating conversations of a small model
    (SmolLM2-135M's f16 cells are 23 KB: nine household chats of ~500 tokens need ~108 MB; bench/workload.py)."""
    return min(256 << 20, budget // 16)


def default_budget() -> int:
    """The board profile's fraction of available memory (cgroup limits included)."""
    from devices.machine import detect

    return detect("/").memory_budget_bytes


@dataclass(frozen=True)
class _Draft:
    shape: LLMShape
    name: str
    weights: int


def _build(shape: LLMShape, name: str, weights: int, budget: int, n_ctx: int, kv: KVType, ub: int, prefix: int,
           slots: int = 1, draft: _Draft | None = None) -> MemoryPlan:
    """The plan for ``slots`` sequences of ``n_ctx`` cells each (llama.cpp, kv_unified off: one KV stream per
    sequence, each of n_ctx cells, each with its own sliding-window cells), with ``draft``'s context beside."""
    n_ctx = _pad(n_ctx, CTX_PAD)
    swa_cells = shape.swa_cells(n_ctx, ub)
    full = shape.kv_cell_bytes(kv, swa=False)
    swa_bytes = int(shape.kv_cell_bytes(kv, swa=True) * swa_cells) * slots
    return MemoryPlan(
        model=name,
        budget_bytes=budget,
        weights_bytes=weights,
        kv_bytes=int(full * n_ctx * slots) + swa_bytes,
        kv_bytes_per_token=full,
        kv_swa_bytes=swa_bytes,
        compute_bytes=shape.compute_bytes(ub, slots * VERIFY_ROWS),
        compute_reserved_bytes=shape.compute_reserved_bytes(ub, slots * VERIFY_ROWS),
        prefix_cache_bytes=prefix,
        runtime_bytes=RUNTIME_OVERHEAD,
        vocab_bytes=shape.n_vocab * VOCAB_ENTRY_BYTES,
        n_ctx=n_ctx * slots,
        kv_type=kv,
        n_ubatch=ub,
        n_batch=ub,
        swa={"layers": sum(shape.swa_layers), "window": shape.swa_window, "cells": swa_cells} if shape.swa_window else {},
        n_slots=slots,
        slot_ctx=n_ctx,
        draft=DraftTerms.build(draft.shape, draft.name, draft.weights, n_ctx, kv, ub) if draft else None,
    )


def plan_llm(
    info: GGUFInfo,
    budget: int,
    *,
    name: str = "",
    ctx: int | None = None,
    kv_type: KVType | None = None,
    n_ubatch: int | None = None,
    prefix_cache_bytes: int | None = None,
    slots: int = 1,
    draft: GGUFInfo | None = None,
    draft_name: str = "",
) -> MemoryPlan:
    """The plan for running ``info`` within ``budget`` bytes; DoesNotFit if none exists.

    ``slots`` sequences decoded together (runtime/serving/engine.py) each get ``ctx`` cells of their own (``ctx`` is per
    slot); without ``ctx`` the context one sequence would get is split between them (at least MIN_CTX each).
    ``draft``: a draft model for speculative decoding (runtime/llm/draft.py), planned beside the target with the same
    context, KV type and micro-batch; its vocabulary must be the target's (BadInput otherwise)."""
    shape = LLMShape.from_gguf(info)
    name = name or str(info.path)
    prefix = default_prefix_cache_bytes(budget) if prefix_cache_bytes is None else prefix_cache_bytes
    extra = _draft_of(draft, draft_name, info, name, shape, ctx, slots)
    train = min([t for t in (shape.n_ctx_train, extra.shape.n_ctx_train if extra else 0) if t], default=0)
    if ctx is not None:
        if ctx < MIN_CTX:
            raise BadInput(f"--ctx {ctx} is too small (at least {MIN_CTX})")
        if shape.n_ctx_train and ctx > shape.n_ctx_train:
            raise BadInput(f"--ctx {ctx} exceeds the model's training context {shape.n_ctx_train}")
    if isinstance(slots, bool) or not isinstance(slots, int) or not 1 <= slots <= MAX_SLOTS:
        raise BadInput(f"--slots {slots!r} is not valid: use an integer from 1 to {MAX_SLOTS}")
    if n_ubatch is not None and n_ubatch <= 0:
        raise BadInput(f"--ubatch {n_ubatch} must be positive")
    if n_ubatch is not None and n_ubatch < slots:
        raise BadInput(f"--ubatch {n_ubatch} is smaller than --slots {slots}: one step decodes a token of every slot")
    weights = info.tensor_bytes
    floor = weights + RUNTIME_OVERHEAD + shape.n_vocab * VOCAB_ENTRY_BYTES
    with_draft = ""
    if extra is not None:
        floor += extra.weights + extra.shape.n_vocab * VOCAB_ENTRY_BYTES
        with_draft = f" with the draft model {extra.name} ({fmt_bytes(extra.weights)} of weights)"
    if floor > budget * (1 - RESERVE_FRACTION):
        raise DoesNotFit(
            f"{name}: the weights alone need {fmt_bytes(weights)}{with_draft} (+{fmt_bytes(floor - weights)} runtime"
            f"{' and draft' if extra else ''}) but the budget is {fmt_bytes(budget)} less a {RESERVE_FRACTION:.0%} reserve:"
            f" {fmt_bytes(floor - budget * (1 - RESERVE_FRACTION))} over; give --memory of at least {fmt_bytes(floor * 1.3)}"
            + (" or leave out --draft" if extra else "")
        )

    def build(n_ctx: int, kv: KVType, ub: int) -> MemoryPlan:
        return _build(shape, name, weights, budget, n_ctx, kv, ub, prefix, slots, extra)

    desired = ctx or min(train or DEFAULT_MAX_CTX, DEFAULT_MAX_CTX)
    if ctx is None and slots > 1:
        desired = max(MIN_CTX, desired // slots // CTX_PAD * CTX_PAD)
    kvs = [kv_type] if kv_type else [KVType.F16, KVType.Q8_0]
    ubs = [n_ubatch] if n_ubatch else [ub for ub in UBATCH_CHOICES if ub >= slots]
    for ub in ubs:
        for kv in kvs:
            plan = build(desired, kv, ub)
            if plan.fits:
                return plan
    # The desired context does not fit in any configuration: find the largest one that does.
    smallest = build(MIN_CTX, kvs[-1], ubs[-1])
    if not smallest.fits or ctx is not None:
        best = _largest_ctx(build, kvs[-1], ubs[-1], desired)
        hint = f"the largest context that fits is {best}" if best else f"even {MIN_CTX} tokens do not fit"
        if extra is not None:
            hint += " (leave out --draft to give the target the draft's memory)"
        what = f"{desired} tokens of context" if slots == 1 else f"{slots} slots of {desired} tokens of context"
        need_plan = build(desired, kvs[-1], ubs[-1])
        need = need_plan.total_bytes
        if need_plan.draft is not None:
            with_draft = f" with the draft model {extra.name} ({fmt_bytes(need_plan.draft.total_bytes)} of them)"
        raise DoesNotFit(
            f"{name}: {what} need {fmt_bytes(need)}{with_draft} but the budget is {fmt_bytes(budget)}"
            f" less a {RESERVE_FRACTION:.0%} reserve ({fmt_bytes(need - budget * (1 - RESERVE_FRACTION))} over); {hint}"
        )
    best = _largest_ctx(build, kvs[-1], ubs[0], desired)
    ub = ubs[0]
    if not best:
        ub = ubs[-1]
        best = _largest_ctx(build, kvs[-1], ub, desired)
    return build(best, kvs[-1], ub)


def check_header_vocab(target: GGUFInfo, draft: GGUFInfo, target_name: str, draft_name: str) -> None:
    """BadInput unless the two GGUF headers describe the same vocabulary (size, tokenizer, special token ids): the
    first check of a draft model, before anything is allocated (runtime/llm/draft.py compares llama.cpp's own vocabularies)."""
    if draft.n_vocab != target.n_vocab:
        raise BadInput(f"draft model {draft_name} has a vocabulary of {draft.n_vocab} tokens but the target {target_name}"
                       f" has {target.n_vocab}: {DRAFT_VOCAB_HOW}")
    for key in TOKENIZER_KEYS:
        a, b = target.metadata.get(key), draft.metadata.get(key)
        if a != b:
            raise BadInput(f"draft model {draft_name} has {key} = {b!r:.40} but the target {target_name} has {a!r:.40}: {DRAFT_VOCAB_HOW}")


def _draft_of(draft: GGUFInfo | None, draft_name: str, info: GGUFInfo, name: str, shape: LLMShape, ctx: int | None,
              slots: int) -> _Draft | None:
    """The draft model's numbers, checked against the target's: the same vocabulary, one sequence, its context."""
    if draft is None:
        return None
    draft_name = draft_name or str(draft.path)
    if slots != 1:
        raise BadInput(f"--draft {draft_name} drafts for one sequence (edgerun run, chat); with --slots {slots} each slot"
                       " drafts from its own context (prompt lookup): leave out --draft or use --slots 1")
    check_header_vocab(info, draft, name, draft_name)
    dshape = LLMShape.from_gguf(draft)
    if ctx is not None and dshape.n_ctx_train and ctx > dshape.n_ctx_train:
        raise BadInput(f"--ctx {ctx} exceeds the draft model {draft_name}'s training context {dshape.n_ctx_train}:"
                       f" use --ctx {dshape.n_ctx_train} or less, or another draft")
    return _Draft(dshape, draft_name, draft.tensor_bytes)


def _largest_ctx(build: Callable[[int, KVType, int], MemoryPlan], kv: KVType, ub: int, limit: int) -> int:
    best = 0
    for n in range(MIN_CTX, limit + 1, CTX_PAD):
        if build(n, kv, ub).fits:
            best = n
        else:
            break
    return best


@dataclass(frozen=True)
class DeviceSplit:
    """Where a plan's bytes are once llama.cpp has put ``layers_on_device`` layers (its count: repeating layers plus
    the output layer, as the placement's offload reports it) on a GPU.

    A discrete GPU has memory of its own: ``host`` is what RAM must hold, ``device`` what the GPU must. With unified
    memory (a Jetson: the GPU allocates from the same RAM) both come out of one pool and each weight counts once: an
    offloaded layer's weights move from the file mapping (whose pages are then reclaimable cache) into the GPU's
    allocation, so ``ram_bytes`` is host + device, not the whole file plus the device copy."""

    layers_on_device: int
    n_layer: int
    unified: bool
    host: dict[str, int]
    device: dict[str, int]

    @property
    def host_bytes(self) -> int:
        return sum(self.host.values())

    @property
    def device_bytes(self) -> int:
        return sum(self.device.values())

    @property
    def ram_bytes(self) -> int:
        """What the machine's RAM holds: the host terms, plus the device's on unified memory."""
        return self.host_bytes + (self.device_bytes if self.unified else 0)

    def to_dict(self) -> dict[str, Any]:
        return {"layers_on_device": self.layers_on_device, "n_layer": self.n_layer, "unified_memory": self.unified,
                "host": dict(self.host), "device": dict(self.device), "host_bytes": self.host_bytes,
                "device_bytes": self.device_bytes, "ram_bytes": self.ram_bytes}

    def table(self) -> list[str]:
        memory = "unified memory: one pool" if self.unified else "device memory apart from RAM"
        lines = [f"  on the GPU: {self.layers_on_device}/{self.n_layer + 1} layers (output included); {memory}"]
        for side, terms in (("device", self.device), ("host", self.host)):
            lines += [f"    {side:<6} {name:<31} {fmt_bytes(value):>11}" for name, value in terms.items() if value]
        lines.append(f"    device total {fmt_bytes(self.device_bytes)}, host total {fmt_bytes(self.host_bytes)}"
                     + (f", RAM {fmt_bytes(self.ram_bytes)} (offloaded weights counted once)" if self.unified else ""))
        return lines
