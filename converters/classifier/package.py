"""The package step: a gated model's bundle files (labels, report, plot), its manifest, and publishing it at ``--out``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from converters.classifier.memory import arena_bytes
from converters.vision import gate
from converters.vision.recipes import Format
from converters.vision.source import Source
from devices.backends import for_format
from runtime.bundle.manifest import FileEntry, Manifest, ModelKind, check_name, check_version
from runtime.bundle.store import publish
from runtime.files import sha256_file


def write_extras(bundle: Path, files: list[tuple[str, Path]], labels: list[str] | None, data: dict[str, Any],
                 gated: tuple[gate.GateReport, np.ndarray, np.ndarray], title: str, model_path: Path,
                 float_path: Path) -> tuple[tuple[Any, Any], int]:
    """labels.txt, report.json and report.png into ``bundle`` (appended to ``files`` with their roles); then the
    quantized model's input/output quantization and its measured arena bytes."""
    if labels:
        (bundle / "labels.txt").write_text("\n".join(labels) + "\n", encoding="utf-8")
        files.append(("labels", bundle / "labels.txt"))
    (bundle / "report.json").write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
    files.append(("report", bundle / "report.json"))
    if gate.plot(*gated, title, bundle / "report.png"):
        files.append(("report-plot", bundle / "report.png"))
    ext = model_path.suffix[1:]
    with gate.open_model(model_path, ext) as backend:
        return (gate.tensor_quant(backend.input), gate.tensor_quant(backend.output)), arena_bytes(backend, float_path, ext)


def make_manifest(kind: ModelKind, fmt: Format, name: str, version: str, files: list[tuple[str, Path]], source: Source,
                  origin: dict[str, str], data: dict[str, Any], **spec: Any) -> Manifest:
    return Manifest(
        kind=kind, backend=for_format(fmt.value).name, model_format=fmt.value, name=check_name(name), version=check_version(version),
        files=tuple(FileEntry(p.name, *sha256_file(p), role=role) for role, p in files), license=source.license,
        source={**origin, "route": f"{source.kind.value}->{fmt.value}"}, reports={"accuracy": data}, **spec,
    )


def package(bundle: Path, manifest: Manifest, out: Path) -> None:
    """Write the manifest into the finished ``bundle`` directory and publish it at ``out`` (runtime.bundle.store.publish)."""
    (bundle / "manifest.json").write_bytes(manifest.to_json())
    publish(bundle, out)
