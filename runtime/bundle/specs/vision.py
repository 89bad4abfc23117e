"""The manifest's ``vision`` section: how an image becomes the model's input and its output becomes labels."""

from __future__ import annotations

import enum
from dataclasses import asdict, dataclass, field
from typing import Any

from runtime.bundle.fields import FILE_RE, count_field, enum_field, flag_field, floats_field, is_finite, required_field, text_field
from runtime.bundle.specs.tensor import TensorQuant
from runtime.errors import BadInput


class Layout(str, enum.Enum):
    NHWC = "nhwc"
    NCHW = "nchw"


class ColorOrder(str, enum.Enum):
    RGB = "rgb"
    BGR = "bgr"


class ResizeMode(str, enum.Enum):
    STRETCH = "stretch"  # resize the whole image to size x size, ignoring aspect
    CENTER_CROP = "center-crop"  # shorter side to size / crop_fraction, then the central size x size


@dataclass(frozen=True)
class VisionSpec:
    """How the runtime turns an image into the model's input and its output into labels.

    Normalization follows TFLite metadata: input = (pixel - mean) / std with pixels
    in 0..255 and one value or one per channel (in ``color_order``).
    """

    size: int  # square input side, pixels
    layout: Layout = Layout.NCHW
    color_order: ColorOrder = ColorOrder.RGB
    resize: ResizeMode = ResizeMode.CENTER_CROP
    crop_fraction: float = 0.875  # CENTER_CROP: the crop is this fraction of the resized shorter side
    mean: tuple[float, ...] = (0.0,)
    std: tuple[float, ...] = (1.0,)
    input: TensorQuant = field(default_factory=TensorQuant)
    output: TensorQuant = field(default_factory=TensorQuant)
    output_is_logits: bool = True  # softmax before reporting scores
    labels: str | None = None  # bundle file (role "labels"), one label per line
    quantization: str = ""  # the recipe: int8, int4w, fp16, float
    arena_bytes: int = 0  # measured activation/tensor bytes at batch 1 (0: unknown)

    @classmethod
    def from_dict(cls, data: Any) -> VisionSpec:
        where = "manifest vision"
        if not isinstance(data, dict):
            raise BadInput("manifest: field 'vision' must be an object")
        size = required_field(data, "size", int, where)
        if not 8 <= size <= 4096:
            raise BadInput(f"{where}: size {size} must be 8..4096 pixels")
        std = floats_field(data, "std", (1.0,), where)
        if any(s <= 0 for s in std):
            raise BadInput(f"{where}: std {list(std)} must be positive")
        crop = data.get("crop_fraction", 0.875)
        if not is_finite(crop) or not 0.1 <= crop <= 1.0:
            raise BadInput(f"{where}: crop_fraction {crop!r:.80} must be in 0.1..1.0")
        labels = data.get("labels")
        if labels is not None and (not isinstance(labels, str) or not FILE_RE.fullmatch(labels)):
            raise BadInput(f"{where}: labels {labels!r} must be a bundle file name or null")
        arena = count_field(data, "arena_bytes", where)
        return cls(
            size=size,
            layout=enum_field(Layout, data.get("layout", "nchw"), "vision layout"),
            color_order=enum_field(ColorOrder, data.get("color_order", "rgb"), "vision color_order"),
            resize=enum_field(ResizeMode, data.get("resize", "center-crop"), "vision resize"),
            crop_fraction=float(crop),
            mean=floats_field(data, "mean", (0.0,), where),
            std=std,
            input=TensorQuant.from_dict(data.get("input", {}), f"{where} input"),
            output=TensorQuant.from_dict(data.get("output", {}), f"{where} output"),
            output_is_logits=flag_field(data, "output_is_logits", True, where),
            labels=labels,
            quantization=text_field(data, "quantization", "", where),
            arena_bytes=arena,
        )

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data.update(layout=self.layout.value, color_order=self.color_order.value, resize=self.resize.value,
                    mean=list(self.mean), std=list(self.std))
        return data
