"""A bounded, hostile-input-safe reader of GGUF headers.

llama.cpp must never see a file we have not checked, so every GGUF is read here
first: magic, version, KV and tensor counts against the file size, every string
and array length against the bytes that remain, duplicate keys and tensor names,
tensor types, alignment, and every tensor's data extent against the file end
(a truncated download fails here, not inside native code). The contents are
then checked against what llama.cpp's loader assumes (:mod:`runtime.formats.gguf_checks`:
the vocabulary arrays, special-token ids, architecture numbers); the merges and
the token texts (each unique as llama.cpp keys it) are checked here, element by
element, as they are read past.

Format constants come from the ``gguf`` package (llama.cpp's own Python
module); the parsing is ours because ``gguf.GGUFReader`` materialises every
array (seconds for a 49k-token vocabulary) and trusts the counts it reads.
Large arrays (the vocabulary, merges) are skipped with their length and element type recorded.
All multi-byte values are little-endian (GGUF v2/v3).
"""

from __future__ import annotations

import mmap
import os
import struct
from pathlib import Path
from typing import Any

from gguf.constants import GGML_QUANT_SIZES, GGUF_DEFAULT_ALIGNMENT, GGUF_MAGIC, GGMLQuantizationType, GGUFValueType

from runtime.errors import BadInput
from runtime.files import open_regular
from runtime.formats.gguf_checks import check_architecture, check_vocabulary
from runtime.formats.gguf_info import ArrayInfo, GGUFInfo, TensorInfo

__all__ = ["ArrayInfo", "GGUFInfo", "TensorInfo", "read_gguf"]

SUPPORTED_VERSIONS = (2, 3)
MAX_TENSORS = 1 << 16  # far above any real model (a 70B has ~700 tensors)
MAX_KV = 1 << 16
MAX_KEY_LEN = 1 << 16
MAX_DIMS = 4  # GGML_MAX_DIMS
SMALL_ARRAY = 512  # arrays up to this many elements are kept as values (per-layer arrays: llama.cpp takes <= 512 layers)
MERGES_KEY = "tokenizer.ggml.merges"
TOKENS_KEY = "tokenizer.ggml.tokens"
# Strings worth keeping even when long.
KEEP_LONG_STRINGS = ("tokenizer.chat_template",)

_SCALAR = {
    GGUFValueType.UINT8: "<B",
    GGUFValueType.INT8: "<b",
    GGUFValueType.UINT16: "<H",
    GGUFValueType.INT16: "<h",
    GGUFValueType.UINT32: "<I",
    GGUFValueType.INT32: "<i",
    GGUFValueType.FLOAT32: "<f",
    GGUFValueType.BOOL: "<?",
    GGUFValueType.UINT64: "<Q",
    GGUFValueType.INT64: "<q",
    GGUFValueType.FLOAT64: "<d",
}


class _Cursor:
    """Reads little-endian values from a buffer, failing with the field being read."""

    def __init__(self, buf: mmap.mmap | bytes, path: Path) -> None:
        self.buf = buf
        self.pos = 0
        self.size = len(buf)
        self.path = path

    def fail(self, what: str) -> BadInput:
        return BadInput(f"{self.path}: not a valid GGUF file: {what}")

    def need(self, n: int, what: str) -> None:
        if n < 0 or self.pos + n > self.size:
            raise self.fail(f"truncated while reading {what} at byte {self.pos} ({self.size} bytes in file)")

    def unpack(self, fmt: str, what: str) -> Any:
        n = struct.calcsize(fmt)
        self.need(n, what)
        (value,) = struct.unpack_from(fmt, self.buf, self.pos)
        self.pos += n
        return value

    def raw(self, what: str, limit: int | None = None) -> bytes:
        """The bytes of one length-prefixed string."""
        length = self.unpack("<Q", f"length of {what}")
        if limit is not None and length > limit:
            raise self.fail(f"{what} is {length} bytes long (at most {limit} allowed)")
        self.need(length, what)
        raw = bytes(self.buf[self.pos : self.pos + length])
        self.pos += length
        return raw

    def text(self, raw: bytes, what: str) -> str:
        # Strict UTF-8: it refuses encoded surrogates (b"\xed\xa0\x80"), so no string read here can later fail
        # to encode (no errors="surrogateescape" or "replace" anywhere in this reader).
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            raise self.fail(f"{what} is not valid UTF-8") from None

    def skip(self, what: str) -> None:
        """Step over one length-prefixed string without copying it."""
        length = self.unpack("<Q", f"length of {what}")
        self.need(length, what)
        self.pos += length

    def string(self, what: str, limit: int | None = None) -> str:
        return self.text(self.raw(what, limit), what)


def _value_type(cur: _Cursor, what: str) -> GGUFValueType:
    raw = cur.unpack("<I", f"type of {what}")
    try:
        return GGUFValueType(raw)
    except ValueError:
        raise cur.fail(f"{what} has unknown value type {raw} (valid: 0-12)") from None


def _check_merge(cur: _Cursor, raw: bytes, i: int) -> None:
    """llama.cpp (llama-vocab.cpp) splits a merge at its first space after the first byte and ranks the pair; a
    merge without exactly one such space, or with an empty half, is a pair no token can ever match."""
    pos = raw.find(b" ", 1)
    if pos < 0 or pos == len(raw) - 1 or raw.count(b" ") != 1:
        raise cur.fail(f"{MERGES_KEY}[{i}] is {raw[:40]!r}, not two non-empty parts separated by one space ('a b')")


def _token_text(raw: bytes, i: int) -> bytes:
    """The text llama.cpp (llama-vocab.cpp, llama_vocab::impl::load) keys token ``i`` by: it reads each token
    through gguf_get_arr_str, a C string, so the text ends at its first NUL byte; an empty text becomes
    ``[EMPTY_<i>]``."""
    text = raw.split(b"\0", 1)[0]
    return text or b"[EMPTY_%d]" % i


def _read_tokens(cur: _Cursor, count: int, keep: bool) -> list[str] | ArrayInfo:
    """The vocabulary, each token text checked to be unique as llama.cpp keys it: llama.cpp maps text -> id in a
    hash map and GGML_ASSERTs that it has one entry per token, so a repeated text aborts the process (SIGABRT)."""
    seen: dict[bytes, int] = {}
    values: list[str] = []
    for i in range(count):
        raw = cur.raw(f"{TOKENS_KEY}[{i}]")
        text = _token_text(raw, i)
        first = seen.setdefault(text, i)
        if first != i:
            raise cur.fail(f"{TOKENS_KEY}[{first}] and [{i}] are both {text[:40]!r} as llama.cpp reads them (each"
                           " token text must be unique; a text ends at its first NUL byte, an empty one is [EMPTY_<id>])")
        if keep:
            values.append(cur.text(raw, f"{TOKENS_KEY}[{i}]"))
    return values if keep else ArrayInfo(GGUFValueType.STRING, count)


def _read_value(cur: _Cursor, vtype: GGUFValueType, key: str, element_types: dict[str, GGUFValueType]) -> Any:
    if vtype in _SCALAR:
        return cur.unpack(_SCALAR[vtype], f"value of {key!r}")
    if vtype == GGUFValueType.STRING:
        return cur.string(f"value of {key!r}")
    # Array: element type, count, elements. Nested arrays are not used by llama.cpp.
    etype = _value_type(cur, f"elements of {key!r}")
    if etype == GGUFValueType.ARRAY:
        raise cur.fail(f"{key!r} is an array of arrays, which GGUF readers do not support")
    element_types[key] = etype
    count = cur.unpack("<Q", f"length of {key!r}")
    min_elem = 8 if etype == GGUFValueType.STRING else struct.calcsize(_SCALAR[etype])
    if count * min_elem > cur.size - cur.pos:
        raise cur.fail(f"{key!r} claims {count} elements, more than the {cur.size - cur.pos} bytes left in the file")
    keep = count <= SMALL_ARRAY
    if key == MERGES_KEY and etype == GGUFValueType.STRING:
        for i in range(count):
            _check_merge(cur, cur.raw(f"{key}[{i}]"), i)
        return ArrayInfo(etype, count)
    if key == TOKENS_KEY and etype == GGUFValueType.STRING:
        return _read_tokens(cur, count, keep)
    if etype == GGUFValueType.STRING:
        if not keep:
            for _ in range(count):
                cur.skip(f"element of {key!r}")
            return ArrayInfo(etype, count)
        return [cur.string(f"element of {key!r}") for _ in range(count)]
    size = struct.calcsize(_SCALAR[etype])
    if keep:
        fmt = "<" + _SCALAR[etype][1] * count
        values = list(struct.unpack_from(fmt, cur.buf, cur.pos))
        cur.pos += size * count
        return values
    cur.pos += size * count
    return ArrayInfo(etype, count)


def read_gguf(path: str | os.PathLike[str]) -> GGUFInfo:
    """Check and read a GGUF header. Raises :class:`BadInput` naming the first problem."""
    path = Path(path)
    # open_regular refuses a FIFO or device without blocking, even one swapped in after its stat(); the size is
    # that of the file opened, not of whatever the path named before.
    with open_regular(path) as fh:
        size = os.fstat(fh.fileno()).st_size
        if size < 24:
            raise BadInput(f"{path}: not a GGUF file: {size} bytes is shorter than a GGUF header (24 bytes)")
        with mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as buf:
            return _parse(_Cursor(buf, path), path, size)


def _parse(cur: _Cursor, path: Path, size: int) -> GGUFInfo:
    magic = cur.unpack("<I", "magic")
    if magic != GGUF_MAGIC:
        raw = struct.pack("<I", magic)
        raise BadInput(f"{path}: not a GGUF file: magic is {raw!r}, expected b'GGUF'")
    version = cur.unpack("<I", "version")
    if version not in SUPPORTED_VERSIONS:
        raise BadInput(f"{path}: unsupported GGUF version {version} (supported: {', '.join(map(str, SUPPORTED_VERSIONS))})")
    n_tensors = cur.unpack("<Q", "tensor count")
    n_kv = cur.unpack("<Q", "metadata count")
    if n_tensors > MAX_TENSORS:
        raise cur.fail(f"tensor count {n_tensors} is absurd (at most {MAX_TENSORS})")
    if n_kv > MAX_KV:
        raise cur.fail(f"metadata count {n_kv} is absurd (at most {MAX_KV})")
    # Each KV takes >= 13 bytes (key length, one-byte key, type), each tensor info >= 29.
    if 24 + n_kv * 13 + n_tensors * 29 > size:
        raise cur.fail(f"{n_kv} metadata entries and {n_tensors} tensors cannot fit in {size} bytes")

    metadata: dict[str, Any] = {}
    value_types: dict[str, GGUFValueType] = {}
    element_types: dict[str, GGUFValueType] = {}
    for i in range(n_kv):
        key = cur.string(f"key #{i}", limit=MAX_KEY_LEN)
        if key in metadata:
            raise cur.fail(f"duplicate metadata key {key!r}")
        vtype = value_types[key] = _value_type(cur, repr(key))
        metadata[key] = _read_value(cur, vtype, key, element_types)

    alignment = metadata.get("general.alignment", GGUF_DEFAULT_ALIGNMENT)
    if not isinstance(alignment, int) or alignment <= 0 or alignment & (alignment - 1):
        raise cur.fail(f"general.alignment {alignment!r} is not a power of two")

    tensors: list[TensorInfo] = []
    names: set[str] = set()
    for i in range(n_tensors):
        name = cur.string(f"name of tensor #{i}", limit=MAX_KEY_LEN)
        if name in names:
            raise cur.fail(f"duplicate tensor {name!r}")
        names.add(name)
        n_dims = cur.unpack("<I", f"dimension count of {name!r}")
        if not 1 <= n_dims <= MAX_DIMS:
            raise cur.fail(f"tensor {name!r} has {n_dims} dimensions (1-{MAX_DIMS} allowed)")
        shape = tuple(cur.unpack("<Q", f"shape of {name!r}") for _ in range(n_dims))
        raw_type = cur.unpack("<I", f"type of {name!r}")
        try:
            ttype = GGMLQuantizationType(raw_type)
            block, type_size = GGML_QUANT_SIZES[ttype]
        except (ValueError, KeyError):
            raise cur.fail(f"tensor {name!r} has unknown type {raw_type}") from None
        offset = cur.unpack("<Q", f"offset of {name!r}")
        n_elems = 1
        for dim in shape:
            if dim == 0 or dim > 1 << 40:
                raise cur.fail(f"tensor {name!r} has an impossible shape {shape}")
            n_elems *= dim
        if shape[0] % block:
            raise cur.fail(f"tensor {name!r}: row length {shape[0]} is not a multiple of the {ttype.name} block size {block}")
        if offset % alignment:
            raise cur.fail(f"tensor {name!r} offset {offset} is not aligned to {alignment}")
        tensors.append(TensorInfo(name, shape, ttype, offset, n_elems // block * type_size))

    data_offset = (cur.pos + alignment - 1) // alignment * alignment
    for t in tensors:
        end = data_offset + t.offset + t.nbytes
        if end > size:
            raise BadInput(
                f"{path}: truncated GGUF: tensor {t.name!r} ends at byte {end} but the file has {size} bytes"
                " (an incomplete download or copy?)"
            )
    info = GGUFInfo(path, version, size, metadata, tensors, data_offset, alignment, value_types, element_types)
    if not info.architecture:
        raise cur.fail("general.architecture is missing")
    check_vocabulary(info)
    check_architecture(info)
    return info
