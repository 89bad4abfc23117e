"""The kiosk's shared value types: a captured :class:`Part` and the one :class:`Decision` every part gets.

Times are seconds on ``time.monotonic()``; latencies are milliseconds.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum

import numpy as np


@dataclass(frozen=True)
class Part:
    """One captured part. ``seq`` is assigned by the source, monotonically, never reused."""

    seq: int
    frame_id: str
    source: str
    t_capture: float  # time.monotonic() at capture
    image: np.ndarray | None  # HxWx3 uint8 RGB; None when the frame could not be read
    error: str | None = None  # unreadable/corrupt frame: decided fail-safe with this reason
    label: str | None = None  # ground truth when the source knows it (generated data), else None


class Verdict(str, Enum):
    PASS = "pass"
    REJECT = "reject"
    REVIEW = "review"


# The stage names of Decision.latency_ms, in pipeline order.
STAGES = ("capture", "queue", "preprocess", "infer", "decide", "total")


@dataclass(frozen=True)
class Decision:
    """The decision for one part. ``failsafe`` is True when the part was rejected without a model verdict
    (deadline, saturation, corrupt frame, backend error, shutdown); ``reason`` then says which."""

    seq: int
    frame_id: str
    verdict: Verdict
    reason: str
    label: str | None
    score: float  # class probability of the decided class, or the anomaly score
    confidence: float  # in [0, 1]
    failsafe: bool
    model: str
    version: str
    latency_ms: dict[str, float] = field(default_factory=dict)  # keys from STAGES
    heatmap: np.ndarray | None = None  # anomaly mode: HxW float32 in [0, 1]
