"""Every backend is built one way, ``cls(path, plan, placement)``, and is told where it runs by the placement:
it reads neither the machine nor devices.placement itself, and nothing chooses per-backend arguments for it."""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import os
from pathlib import Path

import pytest

from devices.backends import BACKENDS, BackendName
from devices.capabilities import BackendCaps
from devices.machine import detect
from devices.placement import resolve_placement
from tests.devices.conftest import FIXTURES
from tests.runtime.test_ort_backend import AVX2, VNNI, _saturating_int8_conv
from tests.test_layering import ROOT, imports_of


@pytest.mark.parametrize("name", list(BACKENDS), ids=[b.value for b in BACKENDS])
def test_every_backend_in_the_table_is_built_from_path_plan_and_placement(name: BackendName) -> None:
    spec = BACKENDS[name]
    cls = getattr(importlib.import_module(spec.module), spec.cls)
    params = list(inspect.signature(cls.__init__).parameters.values())[1:]
    assert [p.name for p in params[:3]] == ["path", "plan", "placement"]
    assert all(p.kind is p.POSITIONAL_OR_KEYWORD and p.default is p.empty for p in params[:3])
    # anything after them is optional and not about where the backend runs (llama.cpp's native_log)
    assert all(p.default is not p.empty for p in params[3:])
    assert not {"threads", "gpu_layers", "delegate", "providers", "spin", "cpu"} & {p.name for p in params}


def test_backends_read_the_machine_only_through_their_placement() -> None:
    # The table (devices.backends) names them; anything else of devices/ (cpu, rootfs, machine, placement) is the
    # placement's to read and to tell. ORT read the CPU itself when it was not told.
    found = [str(imp) for path in sorted((ROOT / "runtime" / "backends").glob("*.py")) for imp in imports_of(path, ROOT)
             if imp.module.split(".")[0] == "devices" and imp.module != "devices.backends"]
    assert found == []


@pytest.mark.parametrize("cpu, exact", [(AVX2, "1"), (VNNI, None)], ids=["avx2", "avx512-vnni"])
def test_the_classifier_load_path_tells_ort_the_placements_cpu(tmp_path: Path, cpu, exact: str | None) -> None:
    # The placement resolved for a machine with this CPU decides ORT's INT8 kernels, whatever CPU runs the test:
    # one of the two cases differs from this machine's own.
    from runtime.backends.ort import EXACT_U8S8
    from runtime.bundle.manifest import Manifest
    from runtime.bundle.resolve import ResolvedModel
    from runtime.classify.classifier import open_backend

    path = _saturating_int8_conv(tmp_path)
    os.replace(path, tmp_path / "model.onnx")
    manifest = Manifest.from_dict({"format": "edgerun.bundle", "schema_version": 1, "kind": "vision", "backend": "ort",
                                   "model_format": "onnx", "name": "m", "version": "1",
                                   "files": [{"path": "model.onnx", "sha256": "0" * 64, "size": 1}], "vision": {"size": 8}})
    machine = dataclasses.replace(detect(os.path.join(FIXTURES, "x86-server")), cpu=cpu)
    caps = BackendCaps(BackendName.ORT, installed=True, module="onnxruntime", providers=("CPUExecutionProvider",))
    placement = resolve_placement("ort", "cpu", machine=machine, caps=caps, threads=1)
    assert placement.cpu is cpu
    with open_backend(ResolvedModel(manifest, tmp_path, "bundle-dir"), None, placement) as backend:
        assert backend.session_option(EXACT_U8S8) == exact
