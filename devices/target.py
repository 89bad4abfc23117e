"""What a load asks to run on.

Re-exported by :mod:`devices.placement`; kept here so detection can name targets without importing placement."""

from __future__ import annotations

import enum

from runtime.errors import BadInput


class Target(str, enum.Enum):
    CPU = "cpu"
    GPU = "gpu"
    NPU = "npu"
    AUTO = "auto"

    @classmethod
    def parse(cls, value: "Target | str") -> "Target":
        """A Target from a CLI string; BadInput naming the valid targets otherwise."""
        if isinstance(value, Target):
            return value
        try:
            return cls(str(value).strip().lower())
        except ValueError:
            raise BadInput(f"target {value!r} is not valid; valid targets: {', '.join(t.value for t in cls)}") from None
