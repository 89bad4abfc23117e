"""A bounded reader of safetensors files that hands out one tensor at a time.

Format: 8-byte little-endian header length N, N bytes of UTF-8 JSON mapping
each tensor name to ``{"dtype", "shape", "data_offsets": [begin, end]}``
(offsets relative to the end of the header), then the raw little-endian data.
Everything is checked before any tensor is touched: header length against the
file size, dtypes, byte extents against shape x itemsize and the file end.
Tensors are read through ``mmap`` and converted to float32 one at a time, so a
conversion never holds the model twice (BF16 is widened with a bit shift: no torch).
"""

from __future__ import annotations

import json
import mmap
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from runtime.errors import BadInput

MAX_HEADER = 100 << 20  # real headers are < 1 MiB; this bounds a hostile length
DTYPES = {"F32": np.dtype("<f4"), "F16": np.dtype("<f2"), "BF16": np.dtype("<u2"), "F64": np.dtype("<f8")}


@dataclass(frozen=True)
class TensorRef:
    name: str
    dtype: str  # safetensors dtype name, one of DTYPES
    shape: tuple[int, ...]  # row-major, as in PyTorch
    begin: int  # absolute byte offset in the file
    end: int


class SafetensorsFile:
    """An open safetensors file; ``close()`` or use as a context manager."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fh = open(path, "rb")
        try:
            self.tensors = self._read_header()
            self._map = mmap.mmap(self._fh.fileno(), 0, access=mmap.ACCESS_READ) if self.tensors else None
        except BaseException:
            self._fh.close()
            raise

    def _read_header(self) -> dict[str, TensorRef]:
        size = self.path.stat().st_size
        raw = self._fh.read(8)
        if len(raw) < 8:
            raise BadInput(f"{self.path}: not a safetensors file ({size} bytes, no header)")
        (n,) = struct.unpack("<Q", raw)
        if n > MAX_HEADER or 8 + n > size:
            raise BadInput(f"{self.path}: safetensors header length {n} exceeds the file ({size} bytes) or {MAX_HEADER}")
        try:
            header = json.loads(self._fh.read(n).decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise BadInput(f"{self.path}: safetensors header is not valid JSON ({exc})") from None
        if not isinstance(header, dict):
            raise BadInput(f"{self.path}: safetensors header is not a JSON object")
        base = 8 + n
        out = {}
        for name, spec in header.items():
            if name == "__metadata__":
                continue
            try:
                dtype, shape, (b, e) = spec["dtype"], tuple(int(d) for d in spec["shape"]), spec["data_offsets"]
            except (KeyError, TypeError, ValueError):
                raise BadInput(f"{self.path}: tensor {name!r} has a malformed header entry") from None
            if dtype not in DTYPES:
                raise BadInput(f"{self.path}: tensor {name!r} has dtype {dtype}; supported: {', '.join(DTYPES)}")
            want = int(np.prod(shape, dtype=np.int64)) * DTYPES[dtype].itemsize
            if any(d < 0 for d in shape) or not (0 <= b <= e) or e - b != want or base + e > size:
                raise BadInput(f"{self.path}: tensor {name!r} extent [{b}, {e}) does not match shape {shape} x {dtype}"
                               f" within the file ({size} bytes); the file is truncated or damaged")
            out[name] = TensorRef(name, dtype, shape, base + b, base + e)
        return out

    def read(self, name: str) -> np.ndarray:
        """The tensor as a new float32 array."""
        ref = self.tensors[name]
        if ref.end == ref.begin:
            return np.zeros(ref.shape, np.float32)
        assert self._map is not None
        raw = np.frombuffer(self._map, DTYPES[ref.dtype], count=(ref.end - ref.begin) // DTYPES[ref.dtype].itemsize,
                            offset=ref.begin).reshape(ref.shape)
        if ref.dtype == "BF16":
            return (raw.astype(np.uint32) << 16).view(np.float32)
        return raw.astype(np.float32)

    def close(self) -> None:
        if getattr(self, "_map", None) is not None:
            self._map.close()
            self._map = None
        self._fh.close()

    def __enter__(self) -> SafetensorsFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
