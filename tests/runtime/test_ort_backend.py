"""The ONNX Runtime backend computes INT8 convolutions exactly on every x86 CPU, and fast where that is free.

Without VNNI, ORT's fast uint8 x int8 kernel adds pairs of products in 16 bits
(VPMADDUBSW) and saturates: 255 * 127 * 2 = 64770 does not fit. The model below
makes every pair saturate, so on such a CPU (AVX2 without VNNI, like the machine
this was found on) the result halves unless the backend asks ORT for its exact
kernels (``session.x64quantprecision``). With VNNI that option only doubles INT8
latency, so it is set from the CPU's features: each branch is tested with faked
features, reading the option back from the session itself, so the test fails on
any machine when the choice is wrong.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from devices.cpu import CpuInfo
from devices.placement import cpu_placement
from runtime.backends.ort import EXACT_U8S8, ORTBackend

AVX2 = CpuInfo("x86_64", "AMD EPYC 7R32", 2, 1, 1, ("avx", "avx2", "f16c", "fma"))  # the machine the saturation was found on
AVX512 = CpuInfo("x86_64", "Intel Xeon Gold 6148", 2, 1, 1, ("avx", "avx2", "avx512", "fma"))  # Skylake: AVX-512, no VNNI
VNNI = CpuInfo("x86_64", "AMD EPYC 9R14", 2, 1, 1, ("avx", "avx2", "avx512", "avx512_vnni", "fma"))
AVX_VNNI = CpuInfo("x86_64", "Intel Core i5-12400", 2, 1, 1, ("avx", "avx2", "avx_vnni", "fma"))  # Alder Lake: VEX VNNI
A76 = CpuInfo("aarch64", "Cortex-A76", 4, 4, 4, ("dotprod", "fp16", "neon"))
A72 = CpuInfo("aarch64", "Cortex-A72", 4, 4, 4, ("neon",))  # no dotprod, but ARM's kernels do not saturate


def _saturating_int8_conv(tmp_path: Path) -> Path:
    import onnx
    from onnx import TensorProto, helper, numpy_helper
    from onnxruntime import quantization

    w = np.ones((8, 64, 1, 1), np.float32)  # weights at int8 127, inputs of 1.0 at uint8 255
    graph = helper.make_graph([helper.make_node("Conv", ["x", "w"], ["y"])], "conv",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 64, 4, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, 4, 4])],
                              [numpy_helper.from_array(w, "w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    float_path, int8_path = tmp_path / "conv.onnx", tmp_path / "conv_int8.onnx"
    onnx.save(model, float_path)

    class Calib(quantization.CalibrationDataReader):
        def __init__(self) -> None:
            self.samples = iter([np.zeros((1, 64, 4, 4), np.float32), np.ones((1, 64, 4, 4), np.float32)])

        def get_next(self) -> dict[str, np.ndarray] | None:
            x = next(self.samples, None)
            return None if x is None else {"x": x}

    quantization.quantize_static(str(float_path), str(int8_path), Calib(), quant_format=quantization.QuantFormat.QDQ,
                                 activation_type=quantization.QuantType.QUInt8,
                                 weight_type=quantization.QuantType.QInt8, per_channel=True)
    return int8_path


@pytest.mark.parametrize("cpu, exact", [(AVX2, True), (AVX512, True), (VNNI, False), (AVX_VNNI, False), (A76, False), (A72, False)],
                         ids=["avx2", "avx512-no-vnni", "avx512-vnni", "avx-vnni", "a76", "a72"])
def test_exact_int8_kernels_only_where_the_fast_ones_saturate(tmp_path: Path, cpu: CpuInfo, exact: bool) -> None:
    path = _saturating_int8_conv(tmp_path)
    with ORTBackend(path, None, cpu_placement("ort", cpu=cpu)) as backend:
        assert backend.session_option(EXACT_U8S8) == ("1" if exact else None)
        y = backend.run(np.ones((1, 64, 4, 4), np.float32))
    if exact:  # the exact kernel gives the same answer on every CPU
        # 64 channels of 1.0 x 1.0; the output's own uint8 step is 64/255. Saturated, it reads about 32.
        np.testing.assert_allclose(y, 64.0, atol=0.5)


def test_this_machine_gets_an_exact_result(tmp_path: Path) -> None:
    # Whatever this CPU is, the features devices/ reads must lead to an unsaturated convolution.
    path = _saturating_int8_conv(tmp_path)
    with ORTBackend(path, None, cpu_placement("ort")) as backend:
        y = backend.run(np.ones((1, 64, 4, 4), np.float32))
    np.testing.assert_allclose(y, 64.0, atol=0.5)


def _with_load(machine, load1: float):
    import dataclasses

    return dataclasses.replace(machine, live=dataclasses.replace(machine.live, load_avg=(load1, load1, load1)))


@pytest.mark.parametrize("load1, spins", [(0.2, True), (4.0, False)], ids=["idle", "cores-busy"])
def test_threads_spin_only_when_the_placement_has_the_cores_to_itself(tmp_path: Path, load1: float, spins: bool) -> None:
    # Threads that spin while waiting take time from llama.cpp's threads (or anything else) on the same cores.
    import os

    from devices.backends import BackendName
    from devices.capabilities import BackendCaps
    from devices.machine import detect
    from devices.placement import resolve_placement
    from runtime.backends.ort import SPIN_KEYS
    from runtime.bundle.manifest import Manifest
    from runtime.bundle.resolve import ResolvedModel
    from runtime.classify.classifier import open_backend
    from tests.devices.conftest import FIXTURES
    from tests.runtime.modelgen import matmul_onnx

    matmul_onnx(tmp_path / "model.onnx")
    manifest = Manifest.from_dict({"format": "edgerun.bundle", "schema_version": 1, "kind": "vision", "backend": "ort",
                                   "model_format": "onnx", "name": "m", "version": "1",
                                   "files": [{"path": "model.onnx", "sha256": "0" * 64, "size": 1}], "vision": {"size": 8}})
    caps = BackendCaps(BackendName.ORT, installed=True, module="onnxruntime", providers=("CPUExecutionProvider",))
    placement = resolve_placement("ort", "cpu", machine=_with_load(detect(os.path.join(FIXTURES, "pi5")), load1), caps=caps)
    assert placement.shares_cores is not spins
    with open_backend(ResolvedModel(manifest, tmp_path, "bundle-dir"), None, placement) as backend:
        assert [backend.session_option(key) for key in SPIN_KEYS] == [None if spins else "0"] * 2  # unset: ORT spins
