"""Placement: explicit fallback chains, --require-accelerator, threads under load, missing packages.

Machines are the captured board trees; backend capabilities are given as data
(what a CUDA build of llama.cpp or an onnxruntime-gpu install reports), except
where this machine's real packages are the point of the test.
"""

from __future__ import annotations

import dataclasses
import os
import sys

import pytest

from devices.backends import BackendName
from devices.capabilities import BackendCaps, probe
from devices.machine import detect
from devices.placement import ALL_LAYERS, Target, resolve_placement
from runtime.backends.base import Offload
from runtime.errors import BadInput, MissingDependency, PlacementError
from tests.devices.conftest import FIXTURES

LLAMA_CPU = BackendCaps(BackendName.LLAMACPP, installed=True, version="0.3.36", module="llama_cpp", gpu=False)
LLAMA_CUDA = dataclasses.replace(LLAMA_CPU, gpu=True)
LITERT_TPU = BackendCaps(BackendName.LITERT, installed=True, module="ai_edge_litert.interpreter", npu=True, delegates=("libedgetpu.so.1",))
LITERT_PLAIN = dataclasses.replace(LITERT_TPU, npu=False, delegates=())
ORT_GPU = BackendCaps(
    BackendName.ORT, installed=True, module="onnxruntime", gpu=True, providers=("CUDAExecutionProvider", "CPUExecutionProvider")
)
ORT_CPU = dataclasses.replace(ORT_GPU, gpu=False, providers=("CPUExecutionProvider",))


def board(name):
    return detect(os.path.join(FIXTURES, name))


@pytest.mark.parametrize(
    "fixture, backend, caps, target, device, fallback_words",
    [
        # CUDA build on the x86 server with an A2: honoured, nothing to report
        ("x86-server", "llamacpp", LLAMA_CUDA, "gpu", "cuda:0", []),
        # CPU-only llama.cpp build on a Jetson: falls back and says how to build with CUDA
        ("jetson-orin-nano", "llamacpp", LLAMA_CPU, "gpu", "cpu", ["built without GPU offload", "GGML_CUDA=on", "using cpu"]),
        # a Pi 5's v3d GPU exists but llama.cpp here cannot use it
        ("pi5", "llamacpp", LLAMA_CPU, "gpu", "cpu", ["built without GPU offload"]),
        # llama.cpp asked for the NPU: there is no such backend
        ("pi4-coral", "llamacpp", LLAMA_CPU, "npu", "cpu", ["no NPU backend"]),
        # auto on the Coral Pi with the Edge TPU runtime: the profile prefers the NPU
        ("pi4-coral", "litert", LITERT_TPU, "auto", "edgetpu:usb", []),
        # Coral attached but libedgetpu missing: fallback names the apt package
        ("pi4-coral", "litert", LITERT_PLAIN, "npu", "cpu", ["libedgetpu.so.1", "libedgetpu1-std"]),
        # LiteRT asked for the NPU on a board without one
        ("pi5", "litert", LITERT_TPU, "npu", "cpu", ["no Edge TPU"]),
        # ORT with the CUDA provider on the NVIDIA server
        ("x86-server", "ort", ORT_GPU, "gpu", "cuda:0", []),
        # ORT without a GPU provider on the same server: lists what it has
        ("x86-server", "ort", ORT_CPU, "gpu", "cpu", ["offers CPUExecutionProvider", "CUDAExecutionProvider"]),
        # the null backend never leaves the CPU, and says so
        ("x86-server", "null", BackendCaps(BackendName.NULL, installed=True, module="null"), "gpu", "cpu", ["CPU only"]),
    ],
)
def test_resolution(fixture, backend, caps, target, device, fallback_words):
    p = resolve_placement(backend, target, machine=board(fixture), caps=caps, n_layers=24)
    assert p.device == device
    text = " ".join(p.fallback)
    for word in fallback_words:
        assert word in text
    assert bool(p.fallback) == bool(fallback_words)  # fallback reported iff it happened
    assert p.summary().startswith("placement: ") and "\n" not in p.summary()


def test_gpu_layers_and_providers():
    gpu = resolve_placement("llamacpp", "gpu", machine=board("x86-server"), caps=LLAMA_CUDA, n_layers=24)
    assert gpu.gpu_layers == 25  # 24 repeating layers + the output layer
    assert resolve_placement("llamacpp", "gpu", machine=board("x86-server"), caps=LLAMA_CUDA).gpu_layers == ALL_LAYERS
    assert resolve_placement("llamacpp", "cpu", machine=board("x86-server"), caps=LLAMA_CUDA).gpu_layers == 0
    ort = resolve_placement("ort", "gpu", machine=board("x86-server"), caps=ORT_GPU)
    assert ort.providers == ("CUDAExecutionProvider", "CPUExecutionProvider")


def test_auto_walks_the_profile_chain_and_reports_each_step():
    p = resolve_placement("llamacpp", "auto", machine=board("pi4-coral"), caps=LLAMA_CPU)
    assert p.target is Target.CPU
    assert p.fallback == ("npu (auto): llama.cpp has no NPU backend; using cpu",)  # the Pi 4 profile: npu, then cpu


def test_require_accelerator_refuses_a_cpu_fallback_on_a_board():
    with pytest.raises(PlacementError, match="built without GPU offload") as err:
        resolve_placement("llamacpp", "gpu", require_accelerator=True, machine=board("jetson-orin-nano"), caps=LLAMA_CPU)
    assert err.value.exit_code == 5


def test_this_machine_gpu_request_falls_back_with_the_reason():
    # This machine has no accelerator: the real path, with the real llama.cpp install where present.
    p = resolve_placement("null", "gpu")
    assert p.device == "cpu" and p.fallback
    with pytest.raises(PlacementError, match="would run on the CPU"):
        resolve_placement("null", "gpu", require_accelerator=True)
    with pytest.raises(PlacementError):
        resolve_placement("null", "auto", require_accelerator=True)


def test_this_machine_llamacpp_gpu_falls_back():
    # With the [llm] extra installed (the venv) the real probe runs; without it, the real error.
    if not probe("llamacpp").installed:
        with pytest.raises(MissingDependency):
            resolve_placement("llamacpp", "gpu")
        return
    p = resolve_placement("llamacpp", "gpu")
    assert p.device == "cpu" and "no GPU" in p.fallback[0]


@pytest.mark.parametrize(
    "kwargs, error, message",
    [
        ({"backend": "tensorrt"}, BadInput, "valid backends: llamacpp, litert, ort, null"),  # unknown backend lists choices
        ({"backend": "null", "target": "tpu"}, BadInput, "valid targets: cpu, gpu, npu, auto"),  # unknown target lists choices
        ({"backend": "null", "target": "cpu", "require_accelerator": True}, BadInput, "contradicts"),  # contradictory flags
        ({"backend": "null", "threads": 0}, BadInput, "threads=0"),  # zero threads
        # thousands of threads: libgomp fails inside llama.cpp, ONNX Runtime's pool hangs (the library, not only the CLI)
        ({"backend": "null", "threads": 10000}, BadInput, "threads=10000 is invalid; give an integer from 1 to "),
        ({"backend": "null", "threads": 2**31}, BadInput, "threads=2147483648"),
        ({"backend": "null", "n_layers": -1}, BadInput, "n_layers=-1"),  # negative layer count
        ({"backend": "null", "busy_threads": -1}, BadInput, "busy_threads=-1"),  # negative busy threads
    ],
)
def test_bad_requests(kwargs, error, message):
    with pytest.raises(error, match=message):
        resolve_placement(**kwargs)


def test_missing_backend_package_names_the_install_command(monkeypatch):
    monkeypatch.setitem(sys.modules, "llama_cpp", None)  # as if llama-cpp-python were not installed
    caps = probe("llamacpp")
    assert not caps.installed
    with pytest.raises(MissingDependency, match=r"pip install 'edgerun\[llm\]'") as err:
        resolve_placement("llamacpp", "cpu")
    assert err.value.exit_code == 4


def test_missing_onnxruntime_and_litert_are_not_installed(monkeypatch):
    for name in ("onnxruntime", "ai_edge_litert", "ai_edge_litert.interpreter", "tflite_runtime", "tflite_runtime.interpreter"):
        monkeypatch.setitem(sys.modules, name, None)
    assert probe("ort").install == "pip install onnxruntime==1.32.0" and not probe("ort").installed
    assert not probe("litert").installed


def _with_load(machine, load1):
    return dataclasses.replace(machine, live=dataclasses.replace(machine.live, load_avg=(load1, load1, load1)))


@pytest.mark.parametrize(
    "fixture, load1, threads",
    [
        ("pi5", 0.2, 4),  # idle Pi 5: all four cores
        ("pi5", 2.6, 1),  # three cores busy elsewhere: llama.cpp gets the one left, not four spinning threads
        ("pi5", 9.0, 1),  # overloaded: never below one
        ("x86-server", 6.2, 8),  # 16 logical CPUs, 6 busy: still the 8 physical cores
        ("x86-server", 12.0, 4),  # 12 busy of 16: 4 left
    ],
)
def test_threads_follow_profile_and_load(fixture, load1, threads):
    p = resolve_placement("null", "cpu", machine=_with_load(board(fixture), load1))
    assert p.threads == threads
    assert bool(p.notes) == (threads < board(fixture).profile_threads())  # a reduction is reported


def test_explicit_threads_win():
    assert resolve_placement("null", "cpu", threads=3, machine=_with_load(board("pi5"), 9.0)).threads == 3


def test_loaded_placement_reports_offload():
    p = resolve_placement("llamacpp", "gpu", machine=board("x86-server"), caps=LLAMA_CUDA, n_layers=18)
    done = p.loaded(Offload(unit="layers", on_accelerator=19, total=19, by_device=(("CUDA0", 19),)))
    assert "19/19 layers on the accelerator (CUDA0 19)" in done.summary() and done.device == "cuda:0"
    assert done.to_dict()["offload"] == {
        "unit": "layers",
        "on_accelerator": 19,
        "total": 19,
        "by_device": {"CUDA0": 19},
        "measured": True,
        "why": None,
        "asked": None,
    }


@pytest.mark.parametrize("require", [False, True])
def test_an_unmeasured_offload_says_so_and_claims_no_count(require):
    p = resolve_placement("llamacpp", "gpu", machine=board("x86-server"), caps=LLAMA_CUDA, n_layers=18)
    offload = Offload(unit="layers", on_accelerator=None, total=19, why="llama.cpp logged the device of 0 of its 19 layers", asked=19)
    done = p.loaded(offload, require_accelerator=require)  # nothing measured to refuse on: kept, and said to be unknown
    assert done.device == "cuda:0" and not done.fallback
    assert "offload not reported (llama.cpp logged the device of 0 of its 19 layers); asked for 19 of the 19 layers" in done.summary()
    assert "on the accelerator" not in done.summary()  # no count that nobody measured
    assert done.to_dict()["offload"]["on_accelerator"] is None and done.to_dict()["offload"]["measured"] is False


@pytest.mark.parametrize(
    "fixture, load1, busy_threads, asked, threads, shares",
    [
        # idle Pi 5 (4 usable CPUs): the cores are ours, idle threads may spin
        ("pi5", 0.2, 0, None, 4, False),
        # three cores busy elsewhere: the threads are cut to the one free core, which they have to themselves
        ("pi5", 2.6, 0, None, 1, False),
        # 16 logical CPUs, 6 busy: the profile's 8 threads fit beside them
        ("x86-server", 6.2, 0, None, 8, False),
        # every core busy: even the one thread left shares a core
        ("pi5", 4.0, 0, None, 1, True),
        # the user asks for 4 threads while one core is busy: 4 + 1 > 4
        ("pi5", 1.0, 0, 4, 4, True),
        # more threads than cores on an idle machine
        ("pi5", 0.0, 0, 8, 8, True),
        # a resident llama.cpp model runs the profile's 4 threads: the one thread left shares a core with them
        ("pi5", 0.2, 4, None, 1, True),
        # on the x86 server (16 usable CPUs) a resident llama.cpp model's 8 threads and 8 busy cores fill them all
        ("x86-server", 8.4, 8, None, 1, True),
        # a resident llama.cpp model runs 2 threads: ours are cut to the other 2 cores and may spin there
        ("pi5", 0.2, 2, None, 2, False),
    ],
)
def test_shares_cores_when_threads_and_busy_cores_exceed_the_usable_cpus(fixture, load1, busy_threads, asked, threads, shares):
    p = resolve_placement("null", "cpu", threads=asked, machine=_with_load(board(fixture), load1), busy_threads=busy_threads)
    assert (p.threads, p.shares_cores) == (threads, shares)
    assert p.to_dict()["shares_cores"] is shares


@pytest.mark.parametrize("fixture, slow", [("pi4-coral", True), ("pi5", False), ("x86-server", False)])
def test_int8_on_a_cpu_without_dot_product_says_it_is_not_faster(fixture, slow):
    # the Pi 4's Cortex-A72 lacks ARM dotprod; the Pi 5's A76 and the Xeon's VNNI have it
    p = resolve_placement("litert", "cpu", machine=board(fixture), caps=LITERT_PLAIN, threads=2, int8=True)
    assert any("INT8 about as fast as float" in n for n in p.notes) is slow
    assert ("INT8 about as fast as float" in p.summary()) is slow
    plain = resolve_placement("litert", "cpu", machine=board(fixture), caps=LITERT_PLAIN, threads=2)
    assert not any("INT8" in n for n in plain.notes)


def test_thread_cap_is_the_placed_machines():
    # The cap is 4 x the logical CPUs of the machine placed on (a Pi 5 tree has 4), not of the machine running the test.
    pi5 = _with_load(board("pi5"), 0.0)
    assert pi5.cpu.logical_cpus == 4
    assert resolve_placement("null", "cpu", threads=16, machine=pi5).threads == 16
    with pytest.raises(BadInput, match=r"threads=17 is invalid; give an integer from 1 to 16 \(4 x the 4 logical CPUs"):
        resolve_placement("null", "cpu", threads=17, machine=pi5)
