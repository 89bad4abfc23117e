"""Tiny GGUF files for parser tests, written with llama.cpp's own gguf writer,
then damaged byte by byte where a test needs a hostile file."""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np
from gguf import GGUFWriter


def write_tiny(path: Path, *, arch: str = "llama", n_layer: int = 2, n_embd: int = 64, n_head: int = 4,
               n_head_kv: int = 2, ctx: int = 2048, vocab: int = 32, extra: dict | None = None,
               swa: int = 0) -> Path:
    """A header-valid GGUF with a token embedding and per-layer tensors (random f32)."""
    w = GGUFWriter(str(path), arch)
    w.add_block_count(n_layer)
    w.add_embedding_length(n_embd)
    w.add_head_count(n_head)
    w.add_head_count_kv(n_head_kv)
    w.add_context_length(ctx)
    w.add_feed_forward_length(4 * n_embd)
    if swa:
        w.add_sliding_window(swa)
    w.add_tokenizer_model("llama")
    w.add_token_list([f"t{i}".encode() for i in range(vocab)])
    for key, value in (extra or {}).items():
        w.add_string(key, value)
    rng = np.random.default_rng(0)
    w.add_tensor("token_embd.weight", rng.standard_normal((vocab, n_embd), dtype=np.float32))
    for il in range(n_layer):
        w.add_tensor(f"blk.{il}.attn_q.weight", rng.standard_normal((n_embd, n_embd), dtype=np.float32))
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
