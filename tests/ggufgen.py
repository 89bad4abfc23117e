"""Tiny GGUF files for parser tests, written with llama.cpp's own gguf writer,
then damaged byte by byte where a test needs a hostile file."""

from __future__ import annotations

import struct
from collections.abc import Callable
from pathlib import Path

import numpy as np
from gguf import GGUFWriter


def write_tiny(path: Path, *, arch: str = "llama", n_layer: int = 2, n_embd: int = 64, n_head: int = 4,
               n_head_kv: int | list[int] = 2, ctx: int = 2048, vocab: int = 32, extra: dict | None = None,
               swa: int = 0, tokenizer: str = "llama", kv_tensors: bool = False, embd_rows: int | None = None,
               tokens: dict[int, bytes] | None = None, edit: Callable[[GGUFWriter], None] | None = None) -> Path:
    """A header-valid GGUF with a token embedding and per-layer tensors (random f32): every size in the metadata
    shapes one of them, as in a real model (the reader bounds each by the tensors present).

    ``kv_tensors``: each layer also gets its K and V projections (n_embd -> n_head_kv * head_dim);
    ``embd_rows``: the token embedding's row count when it should differ from the vocabulary's size;
    ``tokens``: token texts that replace the default ``t<id>`` at those ids (e.g. ``{1: b"t2"}``, a repeated text);
    ``edit``: adds metadata of its own (any type) before the tensors are written."""
    w = GGUFWriter(str(path), arch)
    w.add_block_count(n_layer)
    w.add_embedding_length(n_embd)
    w.add_head_count(n_head)
    w.add_head_count_kv(n_head_kv)
    w.add_context_length(ctx)
    w.add_feed_forward_length(4 * n_embd)
    if swa:
        w.add_sliding_window(swa)
    w.add_tokenizer_model(tokenizer)
    w.add_token_list([(tokens or {}).get(i, f"t{i}".encode()) for i in range(vocab)])
    for key, value in (extra or {}).items():
        w.add_string(key, value)
    if edit is not None:
        edit(w)
    rng = np.random.default_rng(0)
    w.add_tensor("token_embd.weight", rng.standard_normal((embd_rows or vocab, n_embd), dtype=np.float32))
    for il in range(n_layer):
        w.add_tensor(f"blk.{il}.attn_q.weight", rng.standard_normal((n_embd, n_embd), dtype=np.float32))
        w.add_tensor(f"blk.{il}.ffn_up.weight", rng.standard_normal((4 * n_embd, n_embd), dtype=np.float32))
        if kv_tensors:
            kv = (n_head_kv[il] if isinstance(n_head_kv, list) else n_head_kv) * (n_embd // n_head)
            w.add_tensor(f"blk.{il}.attn_k.weight", rng.standard_normal((kv, n_embd), dtype=np.float32))
            w.add_tensor(f"blk.{il}.attn_v.weight", rng.standard_normal((kv, n_embd), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def header_offsets(path: Path) -> dict[str, int]:
    """Byte offsets of the fixed header fields (little-endian GGUF v3)."""
    return {"magic": 0, "version": 4, "n_tensors": 8, "n_kv": 16, "first_kv": 24}


def patch(path: Path, offset: int, fmt: str, value) -> None:
    data = bytearray(path.read_bytes())
    struct.pack_into(fmt, data, offset, value)
    path.write_bytes(bytes(data))


def kv_value_offset(path: Path, key: str) -> tuple[int, int]:
    """(offset of the value, GGUF value type) of the metadata key ``key``, found by walking the header."""
    data = path.read_bytes()
    needle = struct.pack("<Q", len(key)) + key.encode()
    i = data.index(needle) + len(needle)
    (vtype,) = struct.unpack_from("<I", data, i)
    return i + 4, vtype


_SCALAR_FMT = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}


def set_scalar(path: Path, key: str, value) -> None:
    """Overwrite the scalar value of ``key`` in place, keeping its type (e.g. block_count = 2**32 - 1)."""
    offset, vtype = kv_value_offset(path, key)
    patch(path, offset, _SCALAR_FMT[vtype], value)
