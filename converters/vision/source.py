"""What ``edgerun convert vision MODEL`` accepts, loaded into one shape: a torch module or an ONNX file.

MODEL is ``zoo:NAME`` (a packaged ImageNet model), a ``.pt2`` ExportedProgram,
a TorchScript file (``.pt``/``.ts``, ONNX route only), an ``.onnx`` file, or a
Keras model (``.keras`` file or a SavedModel directory; TFLite route only,
through ``tensorflow-cpu``). Legacy ``.h5`` files are refused: re-save as ``.keras``.

``.pt2``, TorchScript and Keras/SavedModel files are code as much as data: loading one can run what it carries
(pickled objects, custom layers, graph ops that read or write files). :func:`load_source` logs one warning
naming the file before it loads such a source; convert only files you trust.
"""

from __future__ import annotations

import enum
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from runtime.bundle.manifest import name_from
from runtime.errors import BadInput, require

log = logging.getLogger(__name__)
KERAS_SUFFIXES = (".h5", ".keras")
TORCHSCRIPT_SUFFIXES = (".pt", ".ts", ".pth", ".jit")


class SourceKind(str, enum.Enum):
    TORCH = "torch"  # an nn.Module (zoo or ExportedProgram): TFLite and ONNX routes
    TORCHSCRIPT = "torchscript"  # ONNX route only: litert-torch needs torch.export
    ONNX = "onnx"  # ONNX route only
    KERAS = "keras"  # .keras file or SavedModel directory: TFLite route only (tensorflow's converter)


@dataclass
class Source:
    kind: SourceKind
    name: str  # default bundle name
    module: Any = None  # torch module (TORCH, TORCHSCRIPT)
    onnx_path: Path | None = None
    keras_path: Path | None = None
    size: int | None = None  # defaults the model brings (zoo)
    mean: tuple[float, ...] | None = None
    std: tuple[float, ...] | None = None
    labels: list[str] | None = None
    license: str = "unknown"
    notes: list[str] = field(default_factory=list)


def _torch():
    return require("torch", "pip install torch==2.13.0", purpose="converting a PyTorch model")


def warn_code(path: Path, what: str) -> None:
    """The one stderr line (WARNING) before a source that can run code when loaded is loaded."""
    log.warning("%s is a %s: loading it can run code it carries; convert only files from a source you trust", path, what)


def load_source(ref: str) -> Source:
    if ref.startswith("zoo:"):
        from converters.vision import zoo

        entry = zoo.find(ref[4:])
        return Source(SourceKind.TORCH, entry.name, module=entry.build(), size=entry.size, mean=entry.mean,
                      std=entry.std, labels=zoo.imagenet_labels(), license=entry.license)
    path = Path(ref)
    if not path.exists():
        raise BadInput(f"{ref}: no such model file (give zoo:NAME, a .pt2 ExportedProgram, a TorchScript file or an .onnx file)")
    if path.suffix == ".h5":
        raise BadInput(f"{ref}: legacy HDF5 Keras files are not read; load it in Keras and save it as .keras (or model.export(DIR))")
    if path.is_dir() or path.suffix == ".keras":
        if path.is_dir() and not (path / "saved_model.pb").is_file():
            raise BadInput(f"{ref}: a directory must be a SavedModel (saved_model.pb inside); give a model file or SavedModel directory")
        from converters.vision.tflite import keras_input_size

        warn_code(path, "Keras SavedModel directory" if path.is_dir() else "Keras model")
        return Source(SourceKind.KERAS, name_from(path.stem), keras_path=path, size=keras_input_size(path))
    if path.suffix == ".onnx":
        return Source(SourceKind.ONNX, name_from(path.stem), onnx_path=path)
    torch = _torch()
    if path.suffix == ".pt2":
        warn_code(path, "PyTorch ExportedProgram (.pt2)")
        try:
            program = torch.export.load(str(path))
        except Exception as exc:
            raise BadInput(f"{ref}: not a loadable ExportedProgram ({type(exc).__name__}: {str(exc)[:300]})") from None
        return Source(SourceKind.TORCH, name_from(path.stem), module=program.module())
    if path.suffix in TORCHSCRIPT_SUFFIXES:
        warn_code(path, "TorchScript file")
        try:
            module = torch.jit.load(str(path), map_location="cpu")
        except Exception as exc:
            raise BadInput(f"{ref}: not a TorchScript file ({type(exc).__name__}: {str(exc)[:300]}); "
                           "a state dict needs its model code: save torch.export.export(model, (x,)) as .pt2") from None
        return Source(SourceKind.TORCHSCRIPT, name_from(path.stem), module=module.eval())
    raise BadInput(f"{ref}: unknown model file type {path.suffix!r} (valid: .pt2, {', '.join(TORCHSCRIPT_SUFFIXES)}, .onnx, or zoo:NAME)")
