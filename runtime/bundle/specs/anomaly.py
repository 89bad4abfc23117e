"""The manifest's ``anomaly`` section: a PatchCore-style detector's memory bank, grid, threshold and head.

An ``anomaly`` bundle carries two sections: ``vision`` says how an image becomes the feature backbone's input
(size, layout, mean/std, input and output quantization: :mod:`runtime.bundle.specs.vision`), and this one says what
the backbone's output is (a ``grid`` x ``grid`` patch grid of ``channels`` features), which bundle file holds
the memory bank of good-part patch features (``bank_rows`` x ``channels``, .npy of ``bank_dtype``), the image
score above which a part is anomalous (``threshold``, patch distance units; ``border`` rings of
patches at the grid's edge do not count), the false-reject rate that
threshold was calibrated for, and optionally a logistic-regression head on pooled features (the supervised
route, ``head``: a .npy of 2 * channels weights and a bias). :mod:`runtime.classify.anomaly` runs it.
"""

from __future__ import annotations

import enum
import re
from dataclasses import asdict, dataclass
from typing import Any

from runtime.bundle.fields import FILE_RE, enum_field, is_finite, required_field
from runtime.errors import BadInput


class BankDtype(str, enum.Enum):
    FLOAT16 = "float16"
    FLOAT32 = "float32"


MAX_GRID = 256  # patches per side: a 2048 px input at stride 8
MAX_CHANNELS = 4096
MAX_BANK_ROWS = 4_000_000  # 4 M patches x 152 float16 channels is 1.2 GB: more than any teach set makes
BACKBONE_RE = re.compile(r"[a-z0-9][a-z0-9._-]{0,63}")


def _number(data: dict[str, Any], key: str, where: str, low: float, high: float, *, low_open: bool = False,
            default: Any = None) -> float:
    value = data.get(key, default) if default is not None else required_field(data, key, (int, float), where)
    if not is_finite(value) or value > high or value < low or (low_open and value == low):
        raise BadInput(f"{where}: {key} {value!r:.80} must be a number in {'(' if low_open else '['}{low}, {high}]")
    return float(value)


def _count(data: dict[str, Any], key: str, where: str, low: int, high: int) -> int:
    value = required_field(data, key, int, where)
    if not low <= value <= high:
        raise BadInput(f"{where}: {key} {value} must be an integer in [{low}, {high}]")
    return value


def _border(data: dict[str, Any], where: str) -> int:
    value, grid = data.get("border", 0), data["grid"]  # grid: checked before this is read
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= 2 * value < grid:
        raise BadInput(f"{where}: border {value!r:.80} must be an integer >= 0 that leaves patches inside the {grid}x{grid} grid")
    return value


@dataclass(frozen=True)
class AnomalySpec:
    backbone: str  # the feature extractor it was cut from (converters.anomaly.backbone)
    grid: int  # patches per side of the backbone's output (N, grid, grid, channels)
    channels: int
    bank: str  # bundle file (role "bank"): float (bank_rows, channels)
    bank_rows: int
    bank_dtype: str
    threshold: float  # image score (max patch distance) at and above which a part is anomalous
    false_reject: float  # the false-reject rate on held-out good images the threshold was chosen for
    coreset: float  # fraction of the good patches kept in the bank
    head: str | None = None  # bundle file (role "head"): float32 (2 * channels + 1,) logistic regression, or None
    head_threshold: float = 0.5  # the head's probability at and above which a part is defective
    border: int = 0  # rings of patches at the grid's edge left out of the score (they see the convolutions' padding)

    @classmethod
    def from_dict(cls, data: Any) -> AnomalySpec:
        where = "manifest anomaly"
        if not isinstance(data, dict):
            raise BadInput("manifest: field 'anomaly' must be an object")
        backbone = required_field(data, "backbone", str, where)
        if not BACKBONE_RE.fullmatch(backbone):
            raise BadInput(f"{where}: backbone {backbone!r:.80} must be 1-64 of a-z 0-9 . _ -")
        files = {"bank": required_field(data, "bank", str, where), "head": data.get("head")}
        for key, name in files.items():
            if (name is not None or key == "bank") and (not isinstance(name, str) or not FILE_RE.fullmatch(name)):
                raise BadInput(f"{where}: {key} {name!r:.80} must be a flat bundle file name{' or null' if key == 'head' else ''}")
        return cls(
            backbone=backbone,
            grid=_count(data, "grid", where, 1, MAX_GRID),
            channels=_count(data, "channels", where, 1, MAX_CHANNELS),
            bank=files["bank"],
            bank_rows=_count(data, "bank_rows", where, 1, MAX_BANK_ROWS),
            bank_dtype=enum_field(BankDtype, required_field(data, "bank_dtype", str, where), "anomaly bank_dtype").value,
            threshold=_number(data, "threshold", where, 0.0, 1e6, low_open=True),
            false_reject=_number(data, "false_reject", where, 0.0, 0.5),
            coreset=_number(data, "coreset", where, 0.0, 1.0, low_open=True),
            head=files["head"],
            head_threshold=_number(data, "head_threshold", where, 0.0, 1.0, low_open=True, default=0.5),
            border=_border(data, where),
        )

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @property
    def bank_bytes(self) -> int:
        """The bank's array in memory (float32 after loading, whatever it is stored as)."""
        return self.bank_rows * self.channels * 4
