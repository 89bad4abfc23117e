"""llama.cpp's log not giving every layer's device: the offload is reported as unmeasured, never as a count.

The real model loads with llama.cpp; what is faked is the log's content (the layer-assignment pattern is made to
match nothing, as with a llama.cpp whose log says it otherwise) and, for the GPU case, whether the build offloads."""

from __future__ import annotations

import dataclasses
import os
import re

import pytest

from devices.backends import BackendName
from devices.capabilities import BackendCaps
from devices.machine import detect
from devices.placement import ALL_LAYERS, cpu_placement, resolve_placement
from runtime.backends.base import Offload
from tests.devices.conftest import FIXTURES

GiB = 1 << 30
LLAMA_CUDA = BackendCaps(BackendName.LLAMACPP, installed=True, version="0.3.36", module="llama_cpp", gpu=True)


def _load_with_a_silent_log(smollm, monkeypatch: pytest.MonkeyPatch, *, gpu_build: bool) -> Offload:
    from runtime.backends import llamacpp
    from runtime.formats.gguf_file import read_gguf
    from runtime.llm.plan import plan_llm

    monkeypatch.setattr(llamacpp, "LAYER_DEVICE", re.compile(rb"(?!)(\d+)(\S+)"))  # matches no log line
    monkeypatch.setattr(llamacpp, "gpu_offload_supported", lambda: gpu_build)
    plan = plan_llm(read_gguf(smollm.path()), GiB, ctx=512)
    every_layer = dataclasses.replace(cpu_placement("llamacpp"), gpu_layers=ALL_LAYERS)
    with llamacpp.LlamaCppBackend(smollm.path(), plan, every_layer) as backend:
        return backend.offload()


def test_an_offload_build_whose_log_is_silent_reports_the_offload_as_unmeasured(smollm, monkeypatch) -> None:
    offload = _load_with_a_silent_log(smollm, monkeypatch, gpu_build=True)
    # SmolLM2-135M: 30 repeating layers and the output layer; every one asked for (999 is clamped to them)
    assert offload == Offload("layers", None, 31, why="llama.cpp logged the device of 0 of its 31 layers", asked=31)
    assert not offload.measured
    assert offload.describe() == "offload not reported (llama.cpp logged the device of 0 of its 31 layers); asked for 31 of the 31 layers"
    placement = resolve_placement("llamacpp", "gpu", machine=detect(os.path.join(FIXTURES, "x86-server")), caps=LLAMA_CUDA,
                                  n_layers=30).loaded(offload)
    summary = placement.summary()
    assert "offload not reported" in summary and "on the accelerator" not in summary and "as requested" not in summary
    assert placement.to_dict()["offload"]["on_accelerator"] is None


def test_a_cpu_build_whose_log_is_silent_has_every_layer_on_the_cpu(smollm, monkeypatch) -> None:
    # without GPU offload in the build no layer can leave the CPU: that is known without the log
    offload = _load_with_a_silent_log(smollm, monkeypatch, gpu_build=False)
    assert offload == Offload("layers", 0, 31, by_device=(("CPU", 31),))
    assert offload.describe() == "0/31 layers on the accelerator (CPU 31)"
