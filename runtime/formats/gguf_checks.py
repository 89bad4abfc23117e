"""What llama.cpp's loader assumes of a GGUF's contents, checked before it sees the file.

:func:`runtime.formats.gguf_file.read_gguf` has already bounded every length by the file's
size; here the *values* are held to what the pinned llama.cpp (0.3.36,
src/llama-vocab.cpp and src/llama-model.cpp) and our own memory plan take:

* the vocabulary: the token list is an array of strings, and the scores and
  token types, when present, are arrays of the types llama.cpp reads through a
  raw pointer, exactly one entry per token; every special-token id
  (``tokenizer.ggml.*_token_id``) names a token of the vocabulary; a BPE
  vocabulary has its merges (each merge's form, and each token text's
  uniqueness, is checked while reading, as those arrays are not kept);
* the architecture numbers: the layer count is what the tensors hold (a count
  of 2**31 - 1 would make the plan build lists of that length; llama.cpp aborts
  past 512 layers), the training context fits the ``int32`` that
  ``llama_model_n_ctx_train`` returns, every size that shapes a tensor (heads,
  lengths, experts) is at most the largest tensor dimension present, the
  embedding length and vocabulary match the token embedding, the key and value
  lengths match the layers' K and V projections, and the expert counts satisfy
  llama.cpp's assertions (which abort the process, not raise).

Each refusal is one :class:`~runtime.errors.BadInput` line naming the key, its
value and what would be valid.
"""

from __future__ import annotations

import re
from typing import Any

from gguf.constants import GGUFValueType

from runtime.errors import BadInput
from runtime.formats.gguf_info import ArrayInfo, GGUFInfo

INT32_MAX = 2**31 - 1
LLAMA_MAX_LAYERS = 512  # src/llama-hparams.h; llama-model.cpp GGML_ASSERTs n_layer in 1..512
LLAMA_MAX_EXPERTS = 1024  # src/llama-hparams.h

TOKENS, SCORES, TOKEN_TYPE, MERGES = "tokenizer.ggml.tokens", "tokenizer.ggml.scores", "tokenizer.ggml.token_type", "tokenizer.ggml.merges"
SPECIAL_ID = re.compile(r"tokenizer\.ggml\.\w+_token_id")
BPE_MODELS = ("gpt2", "hybriddna", "whitespace")  # tokenizer.ggml.model values for which llama.cpp requires merges
LAYER_TENSOR = re.compile(r"(?:^|\.)blk\.(\d+)\.")  # blk.N.*, and enc.blk.N.* / dec.blk.N.* of encoder-decoders

# Counts that shape no tensor: bounded by the 32-bit fields llama.cpp keeps them in (n_ctx_train is returned as int32).
COUNT_KEYS = ("context_length", "attention.sliding_window", "nextn_predict_layers", "leading_dense_block_count",
              "decoder_block_count", "expert_used_count", "expert_shared_count", "expert_group_count",
              "expert_group_used_count")
# Sizes that shape at least one tensor, so none exceeds the file's largest tensor dimension.
DIMENSION_KEYS = ("embedding_length", "feed_forward_length", "expert_feed_forward_length",
                  "expert_shared_feed_forward_length", "expert_count", "vocab_size", "rope.dimension_count",
                  "attention.head_count", "attention.head_count_kv", "attention.key_length", "attention.value_length",
                  "attention.key_length_swa", "attention.value_length_swa", "attention.key_length_mla",
                  "attention.value_length_mla", "attention.q_lora_rank", "attention.kv_lora_rank")
# Keys that may hold one value per layer (llama.cpp's get_key_or_arr: an array must have exactly n_layer entries).
PER_LAYER_KEYS = ("attention.head_count", "attention.head_count_kv", "feed_forward_length", "expert_used_count",
                  "attention.sliding_window_pattern")


def _fail(info: GGUFInfo, what: str) -> BadInput:
    return BadInput(f"{info.path}: GGUF {what}")


def _array(info: GGUFInfo, key: str) -> tuple[GGUFValueType, int] | None:
    """(element type, length) of the array ``key``, None when absent; refuses a non-array value."""
    if key not in info.metadata:
        return None
    value = info.metadata[key]
    if not isinstance(value, (list, ArrayInfo)):
        raise _fail(info, f"{key} is a {info.value_types[key].name.lower()}, not an array")
    return info.element_types[key], value.length if isinstance(value, ArrayInfo) else len(value)


def check_vocabulary(info: GGUFInfo) -> None:
    tokens = _array(info, TOKENS)
    if tokens is None:
        return
    if tokens[0] != GGUFValueType.STRING:
        raise _fail(info, f"{TOKENS} is an array of {tokens[0].name.lower()}, not of strings")
    n_vocab = tokens[1]
    if not 1 <= n_vocab <= INT32_MAX:
        raise _fail(info, f"{TOKENS} holds {n_vocab} tokens (1..{INT32_MAX} allowed: token ids are int32)")
    for key, types in ((SCORES, (GGUFValueType.FLOAT32, GGUFValueType.INT32)), (TOKEN_TYPE, (GGUFValueType.INT32,))):
        found = _array(info, key)
        if found is None:
            continue
        etype, length = found
        if etype not in types:
            valid = " or ".join(t.name.lower() for t in types)
            raise _fail(info, f"{key} is an array of {etype.name.lower()}, not of {valid}")
        if length != n_vocab:
            raise _fail(info, f"{key} has {length} entries for {n_vocab} tokens (one per token)")
    merges = _array(info, MERGES)
    if merges is not None and merges[0] != GGUFValueType.STRING:
        raise _fail(info, f"{MERGES} is an array of {merges[0].name.lower()}, not of strings")
    model, pre = info.metadata.get("tokenizer.ggml.model"), info.metadata.get("tokenizer.ggml.pre")
    if merges is None and model in BPE_MODELS and pre != "kimi-k2":
        raise _fail(info, f"has a BPE vocabulary (tokenizer.ggml.model {model!r}) without {MERGES}")
    for key, value in info.metadata.items():
        if SPECIAL_ID.fullmatch(key) and not (_is_int(value) and 0 <= value < n_vocab):
            raise _fail(info, f"{key} is {value!r}, not a token id of the {n_vocab}-token vocabulary (0..{n_vocab - 1})")


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _values(info: GGUFInfo, key: str) -> list[Any] | None:
    """The value(s) of ``{arch}.key``: one, or one per layer; None when absent."""
    value = info.arch_value(key)
    if value is None:
        return None
    if isinstance(value, ArrayInfo):  # longer than any per-layer array llama.cpp takes (the layer check refuses it)
        raise _fail(info, f"{info.architecture}.{key} is an array of {value.length} entries (at most {LLAMA_MAX_LAYERS})")
    return value if isinstance(value, list) else [value]


def _bounded(info: GGUFInfo, key: str, lo: int, hi: int, why: str) -> list[int] | None:
    values = _values(info, key)
    for v in values or ():
        if not _is_int(v) or not lo <= v <= hi:
            raise _fail(info, f"{info.architecture}.{key} is {v!r}; valid: an integer in {lo}..{hi} ({why})")
    return values


def check_architecture(info: GGUFInfo) -> None:
    arch = info.architecture
    n_layer = _layer_count(info)
    for key in PER_LAYER_KEYS:
        value = info.arch_value(key)
        if n_layer and isinstance(value, list) and len(value) != n_layer:
            raise _fail(info, f"{arch}.{key} has {len(value)} entries for {n_layer} layers (one per layer, or one value)")
    for key in COUNT_KEYS:
        _bounded(info, key, 1 if key == "context_length" else 0, INT32_MAX,
                 "llama.cpp keeps it in a 32-bit field, the training context as int32")
    largest = max((max(t.shape) for t in info.tensors), default=INT32_MAX)
    for key in DIMENSION_KEYS:
        _bounded(info, key, 1 if key == "embedding_length" else 0, min(largest, INT32_MAX),
                 f"it sizes a tensor, and the largest tensor dimension in the file is {largest}")
    embd = {t.name: t for t in info.tensors}.get("token_embd.weight")
    n_embd = info.arch_value("embedding_length")
    if embd is not None and n_embd is not None and len(embd.shape) == 2:
        if embd.shape[0] != n_embd:
            raise _fail(info, f"{arch}.embedding_length is {n_embd} but token_embd.weight rows are {embd.shape[0]} wide")
        if TOKENS in info.metadata and embd.shape[1] != info.n_vocab:
            raise _fail(info, f"token_embd.weight has {embd.shape[1]} rows for {info.n_vocab} tokens in {TOKENS}")
    _check_experts(info, n_layer)
    if n_layer:
        _check_kv_projections(info, n_layer)


def _layer_count(info: GGUFInfo) -> int:
    """block_count, checked against the layers whose tensors the file holds; 0 when the file has no block_count."""
    arch = info.architecture
    values = _bounded(info, "block_count", 1, LLAMA_MAX_LAYERS, "llama.cpp takes 1..512 layers")
    if values is None:
        return 0
    n_layer = values[0]
    decoder = (_values(info, "decoder_block_count") or [0])[0]  # encoder-decoders: dec.blk.N may outnumber enc.blk.N
    held = 1 + max((int(m.group(1)) for t in info.tensors if (m := LAYER_TENSOR.search(t.name))), default=-1)
    if held != max(n_layer, decoder if _is_int(decoder) else 0):
        layers = f"{held} layers (blk.0..blk.{held - 1})" if held else "no layer (no blk.N tensors)"
        raise _fail(info, f"{arch}.block_count is {n_layer} but the file holds tensors for {layers}")
    return n_layer


def _check_experts(info: GGUFInfo, n_layer: int) -> None:
    """llama-model.cpp's GGML_ASSERTs on the expert counts (a failed one aborts the process)."""
    arch = info.architecture
    n_expert = (_values(info, "expert_count") or [0])[0]
    used = max(_values(info, "expert_used_count") or [0])
    groups = (_values(info, "expert_group_count") or [0])[0]
    group_used = (_values(info, "expert_group_used_count") or [0])[0]
    if n_expert > LLAMA_MAX_EXPERTS:
        raise _fail(info, f"{arch}.expert_count is {n_expert} (llama.cpp takes at most {LLAMA_MAX_EXPERTS})")
    if n_expert == 0:
        if used or groups:
            raise _fail(info, f"has no experts ({arch}.expert_count 0) but uses {used} in {groups} groups")
        return
    if not 0 < used <= n_expert:
        raise _fail(info, f"{arch}.expert_used_count is {used}; valid: 1..{n_expert} ({arch}.expert_count)")
    if groups >= n_expert or (groups > 1 and (n_expert % groups or not 0 < group_used < groups)):
        raise _fail(info, f"{arch}.expert_group_count {groups} and expert_group_used_count {group_used} do not divide"
                          f" {n_expert} experts (groups < experts, dividing them; 0 < groups used < groups)")


def _check_kv_projections(info: GGUFInfo, n_layer: int) -> None:
    """The KV cache is sized from head_count_kv x key/value_length (as in the plan): each layer's K and V
    projection, where the file has them as blk.N.attn_k/attn_v, must have that many outputs."""
    arch = info.architecture
    n_head = _values(info, "attention.head_count")
    if not n_head:
        return
    n_head = n_head * n_layer if len(n_head) == 1 else n_head
    n_head_kv = _values(info, "attention.head_count_kv") or n_head
    n_head_kv = n_head_kv * n_layer if len(n_head_kv) == 1 else n_head_kv
    n_embd = int(info.arch_value("embedding_length", 0) or 0)
    default = n_embd // n_head[0] if n_head[0] else 0  # llama.cpp: n_embd / n_head of layer 0
    tensors = {t.name: t for t in info.tensors}
    for which in ("key", "value"):
        lengths = {info.arch_value(f"attention.{which}_length", default), info.arch_value(f"attention.{which}_length_swa")}
        for il in range(n_layer):
            t = tensors.get(f"blk.{il}.attn_{which[0]}.weight")
            if t is None or len(t.shape) != 2 or t.shape[1] in {n_head_kv[il] * n for n in lengths if n is not None}:
                continue
            raise _fail(info, f"{t.name} has {t.shape[1]} outputs but {arch}.attention.head_count_kv x {which}_length"
                              f" is {n_head_kv[il]} x {info.arch_value(f'attention.{which}_length', default)}")
