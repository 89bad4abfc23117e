"""Offload is what the loaded backend reports it did, not what was asked for.

Each case loads a real backend: llama.cpp asked for every layer on a GPU in a build without one, ONNX Runtime
with its CPU provider and with provider lists whose first entry takes nothing, LiteRT with its XNNPACK
delegate, and an Edge TPU placement given a model that edgetpu_compiler never saw.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import pytest

from devices.backends import BackendName
from devices.capabilities import BackendCaps
from devices.machine import detect
from devices.placement import ALL_LAYERS, Target, cpu_placement, resolve_placement
from runtime.backends.base import Offload
from runtime.backends.litert import LiteRTBackend
from runtime.backends.ort import ORTBackend
from runtime.errors import BackendError, PlacementError
from tests.devices.conftest import FIXTURES
from tests.runtime.modelgen import add_gather_tflite, matmul_onnx

GiB = 1 << 30
LITERT_TPU = BackendCaps(BackendName.LITERT, installed=True, module="ai_edge_litert.interpreter", npu=True, delegates=("libedgetpu.so.1",))
ORT_GPU = BackendCaps(BackendName.ORT, installed=True, module="onnxruntime", gpu=True,
                      providers=("CUDAExecutionProvider", "CPUExecutionProvider"))


def board(name: str):
    return detect(os.path.join(FIXTURES, name))


def test_llamacpp_reports_the_layers_llama_cpp_placed(smollm) -> None:
    from runtime.backends.llamacpp import LlamaCppBackend, gpu_offload_supported
    from runtime.formats.gguf_file import read_gguf
    from runtime.llm.plan import plan_llm

    plan = plan_llm(read_gguf(smollm.path()), GiB, ctx=512)
    every_layer = dataclasses.replace(cpu_placement("llamacpp"), gpu_layers=ALL_LAYERS)  # every layer asked for
    with LlamaCppBackend(smollm.path(), plan, every_layer) as backend:
        offload = backend.offload()
    # SmolLM2-135M: 30 repeating layers and the output layer, each on the device llama.cpp's log gave it.
    assert offload.measured and offload.total == 31 and sum(n for _, n in offload.by_device) == 31
    if not gpu_offload_supported():  # this build has no GPU device: all 31 stayed on the CPU, whatever was asked
        assert offload == Offload("layers", 0, 31, by_device=(("CPU", 31),))


def test_llm_placement_carries_the_measured_offload(smollm) -> None:
    from runtime.llm.model import LLM

    with LLM.load(smollm, memory=GiB, ctx=512, threads=1, target="cpu") as llm:
        assert llm.placement.offload.by_device and llm.placement.offload.total == 31
        assert "/31 layers on the accelerator (CPU " in llm.placement.summary()


# AzureExecutionProvider ships in the CPU wheel and ORT keeps it in get_providers(), though it takes no node of
# a plain graph: "the first provider is not the CPU's" said every node was offloaded. CUDA is absent here: ORT
# would drop it with a warning, the backend drops it first.
@pytest.mark.parametrize("providers", [["CPUExecutionProvider"], ["CUDAExecutionProvider", "CPUExecutionProvider"],
                                       ["AzureExecutionProvider", "CPUExecutionProvider"]], ids=["cpu", "cuda-absent", "azure-first"])
def test_ort_counts_nodes_per_provider_from_the_session(tmp_path: Path, providers: list[str]) -> None:
    told = dataclasses.replace(cpu_placement("ort"), providers=tuple(providers))
    with ORTBackend(matmul_onnx(tmp_path / "m.onnx"), None, told) as backend:
        assert backend.offload() == Offload("nodes", 0, 1, by_device=(("CPUExecutionProvider", 1),))


def test_an_accelerator_that_took_nothing_is_reported_and_refused(tmp_path: Path) -> None:
    # The placement a CUDA install would get on the NVIDIA server; here ORT keeps only its CPU provider.
    placement = resolve_placement("ort", "gpu", machine=board("x86-server"), caps=ORT_GPU, threads=1)
    assert placement.device == "cuda:0"
    with ORTBackend(matmul_onnx(tmp_path / "m.onnx"), None, placement) as backend:
        offload = backend.offload()
    with pytest.raises(PlacementError, match=r"--require-accelerator: cuda:0: the accelerator took none of the model's 1 nodes"):
        placement.loaded(offload, require_accelerator=True)
    done = placement.loaded(offload)
    assert (done.target, done.device) == (Target.CPU, "cpu")
    assert done.fallback == ("cuda:0: the accelerator took none of the model's 1 nodes; running on cpu",)
    assert done.to_dict()["offload"]["by_device"] == {"CPUExecutionProvider": 1}


def test_litert_counts_the_ops_xnnpack_took(tmp_path: Path) -> None:
    # XNNPACK takes the ADD; it has no GATHER kernel, so that op stays with LiteRT's own CPU kernels.
    with LiteRTBackend(add_gather_tflite(tmp_path / "m.tflite"), None, cpu_placement("litert")) as backend:
        assert backend.offload() == Offload("ops", 0, 2, by_device=(("XNNPACK", 1), ("CPU", 1)))


def test_litert_counts_a_whole_model_delegated(digit_bundles: dict[str, Path]) -> None:
    with LiteRTBackend(digit_bundles["tflite"] / "model.tflite", None, cpu_placement("litert")) as backend:
        offload = backend.offload()
    assert offload.on_accelerator == 0 and offload.by_device == (("XNNPACK", offload.total),) and offload.total >= 3


def test_an_edgetpu_placement_of_a_model_not_compiled_for_it(tmp_path: Path) -> None:
    placement = resolve_placement("litert", "npu", machine=board("pi4-coral"), caps=LITERT_TPU, threads=1)
    assert (placement.device, placement.delegate) == ("edgetpu:usb", "libedgetpu.so.1")
    # libedgetpu is not installed on this machine: the model has no edgetpu-custom-op, so it is never asked for.
    with LiteRTBackend(add_gather_tflite(tmp_path / "m.tflite"), None, placement) as backend:
        offload = backend.offload()
    assert offload.on_accelerator == 0 and "not compiled for the Edge TPU" in offload.why
    with pytest.raises(PlacementError, match="--require-accelerator: edgetpu:usb: .*not compiled for the Edge TPU"):
        placement.loaded(offload, require_accelerator=True)
    done = placement.loaded(offload)
    assert done.device == "cpu" and "not compiled for the Edge TPU" in done.summary() and "\n" not in done.summary()


def test_a_model_compiled_for_the_edgetpu_goes_to_its_delegate(tmp_path: Path) -> None:
    # The custom op's name is what sends a model to libedgetpu; absent here, its failure to load is one line.
    path = add_gather_tflite(tmp_path / "m.tflite")
    path.write_bytes(path.read_bytes() + b"edgetpu-custom-op")
    with pytest.raises(BackendError, match="cannot load the delegate libedgetpu.so.1"):
        LiteRTBackend(path, None, dataclasses.replace(cpu_placement("litert"), delegate="libedgetpu.so.1"))
