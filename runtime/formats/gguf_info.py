"""What a GGUF header says, as read by :mod:`runtime.formats.gguf_file` and checked by :mod:`runtime.formats.gguf_checks`.

Its own module so that the reader and the checks both import it without importing each other.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gguf.constants import GGUF_DEFAULT_ALIGNMENT, GGMLQuantizationType, GGUFValueType


@dataclass(frozen=True)
class TensorInfo:
    name: str
    shape: tuple[int, ...]  # ggml order: ne[0] is the innermost (row) dimension
    type: GGMLQuantizationType
    offset: int  # bytes from the start of the data section
    nbytes: int


@dataclass(frozen=True)
class ArrayInfo:
    """A large array that was skipped, not loaded."""

    type: GGUFValueType
    length: int


@dataclass
class GGUFInfo:
    path: Path
    version: int
    file_size: int
    metadata: dict[str, Any]
    tensors: list[TensorInfo] = field(default_factory=list)
    data_offset: int = 0
    alignment: int = GGUF_DEFAULT_ALIGNMENT
    value_types: dict[str, GGUFValueType] = field(default_factory=dict)  # per key; ARRAY for arrays
    element_types: dict[str, GGUFValueType] = field(default_factory=dict)  # per array key

    @property
    def architecture(self) -> str:
        return str(self.metadata.get("general.architecture", ""))

    @property
    def tensor_bytes(self) -> int:
        return sum(t.nbytes for t in self.tensors)

    def arch_value(self, key: str, default: Any = None) -> Any:
        """``{arch}.key`` from the metadata, e.g. ``arch_value('block_count')``."""
        return self.metadata.get(f"{self.architecture}.{key}", default)

    @property
    def n_vocab(self) -> int:
        tokens = self.metadata.get("tokenizer.ggml.tokens")
        if isinstance(tokens, ArrayInfo):
            return tokens.length
        if isinstance(tokens, list):
            return len(tokens)
        return int(self.arch_value("vocab_size", 0) or 0)

    @property
    def chat_template(self) -> str | None:
        value = self.metadata.get("tokenizer.chat_template")
        return value if isinstance(value, str) else None

    def summary(self) -> dict[str, Any]:
        """JSON-friendly metadata: small values only, large arrays as their lengths."""
        out: dict[str, Any] = {}
        for key, value in self.metadata.items():
            if isinstance(value, ArrayInfo):
                out[key] = f"<array of {value.length} {value.type.name.lower()}>"
            elif isinstance(value, str) and len(value) > 200:
                out[key] = value[:200] + f"... <{len(value)} chars>"
            else:
                out[key] = value
        return out
