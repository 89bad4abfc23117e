"""``edgerun doctor`` and ``edgerun serial-peer`` through the real dispatcher, in-process."""

from __future__ import annotations

import json
import os
import threading
import time

import pytest

from apps.cli import main as edgerun
from devices.backends import BackendName
from devices.capabilities import BackendCaps
from devices.doctor import diagnose
from devices.link.frame import Frame, FrameDecoder, FrameType, hello_payload
from devices.link.transport import SerialTransport
from tests.devices.conftest import FIXTURES

NOTHING = {
    BackendName.LLAMACPP: BackendCaps(BackendName.LLAMACPP, installed=False, module="llama_cpp"),
    BackendName.LITERT: BackendCaps(BackendName.LITERT, installed=False, module="ai_edge_litert"),
    BackendName.ORT: BackendCaps(BackendName.ORT, installed=False, module="onnxruntime"),
}
LLAMA_CPU_ONLY = {**NOTHING, BackendName.LLAMACPP: BackendCaps(BackendName.LLAMACPP, installed=True, module="llama_cpp", gpu=False)}
LITERT_NO_TPU_LIB = {**NOTHING, BackendName.LITERT: BackendCaps(BackendName.LITERT, installed=True, module="ai_edge_litert.interpreter")}


@pytest.mark.parametrize(
    "fixture, backends, python, expected_fixes",
    [
        # Jetson with a CPU-only llama.cpp: the CUDA build command, with nvcc's JetPack path
        ("jetson-orin-nano", LLAMA_CPU_ONLY, (3, 11), ["CUDACXX=/usr/local/cuda/bin/nvcc", "GGML_CUDA=on"]),
        # Coral Pi without LiteRT on Python 3.11: the aarch64 wheel exists
        ("pi4-coral", NOTHING, (3, 11), ["pip install ai-edge-litert", "official power supply"]),
        # ... on Python 3.13 there is no wheel: say so instead of a pip line that fails
        ("pi4-coral", NOTHING, (3, 13), ["no wheel for Python 3.13"]),
        # LiteRT present, Edge TPU runtime library missing: the Coral apt line
        ("pi4-coral", LITERT_NO_TPU_LIB, (3, 11), ["libedgetpu1-std", "coral-edgetpu-stable"]),
        # the x86 server with an A2 and CPU-only llama.cpp: CUDA build without the Jetson nvcc path
        ("x86-server", LLAMA_CPU_ONLY, (3, 11), ["GGML_CUDA=on"]),
        # a Pi 5 with nothing attached and nothing wrong
        ("pi5", LLAMA_CPU_ONLY, (3, 11), []),
    ],
)
def test_findings_on_captured_boards(fixture, backends, python, expected_fixes):
    report = diagnose(os.path.join(FIXTURES, fixture), backends, python)
    fixes = " ".join(f.fix for f in report.findings)
    for words in expected_fixes:
        assert words in fixes
    assert bool(report.findings) == bool(expected_fixes)
    if fixture == "x86-server":
        assert "CUDACXX" not in fixes


@pytest.mark.parametrize(
    "fixture, profile",
    [("pi5", "raspberry-pi-5"), ("pi4-coral", "raspberry-pi-4"), ("jetson-orin-nano", "jetson-orin"), ("x86-server", "x86-64")],
)
def test_doctor_json_on_each_fixture(fixture, profile, capsys):
    assert edgerun(["doctor", "--json", "--root", os.path.join(FIXTURES, fixture)]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["machine"]["profile"]["name"] == profile  # each captured board is recognized as itself
    # the backends are probed in this Python, whatever --root says; llama-cpp-python is installed with the tests
    assert report["backends"]["llamacpp"]["installed"] is True
    assert "cpu" in report["backends"]["llamacpp"]["usable_targets"]


def test_doctor_text_here(capsys):
    assert edgerun(["doctor"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("machine:") and "backends (probed in this Python" in out


def test_doctor_bad_root_is_exit_2(capsys, tmp_path):
    assert edgerun(["doctor", "--root", str(tmp_path / "missing")]) == 2
    assert "not a directory" in capsys.readouterr().err


@pytest.mark.parametrize(
    "argv, code, message",
    [
        (["serial-peer", "ftp://x"], 2, "scheme 'ftp'"),  # bad URL scheme: exit 2 with the valid ones
        (["serial-peer", "loop://", "--count", "-1"], 2, "argument --count: '-1' is out of range"),  # negative count
        (["serial-peer", "loop://", "--count", "9" * 400], 2, "argument --count: '99"),  # a count no int32 holds
        (["serial-peer", "loop://", "--trigger-every", "nan"], 2, "argument --trigger-every: 'nan' is out of range"),
        (["serial-peer", "loop://", "--trigger-every", "-1"], 2, "use seconds from 0 to 86400"),
    ],
)
def test_serial_peer_bad_input(argv, code, message, capsys):
    assert edgerun(argv) == code
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1, err  # one line


def test_serial_peer_applies_and_prints_results(make_cable, capsys):
    _, a, b = make_cable()
    result: list[int] = []
    thread = threading.Thread(target=lambda: result.append(edgerun(["serial-peer", b.url, "--count", "2"])))
    thread.start()
    stream = bytes(range(16))
    with SerialTransport(a.url) as port:
        frames = (
            Frame(0, FrameType.HELLO, hello_payload(stream, 1)).encode()
            + Frame(1, FrameType.RESULT, b"accept").encode()
            + Frame(2, FrameType.RESULT, b"reject").encode()
        )
        decoder, seen = FrameDecoder(), []
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            port.write(frames)  # resent like a real sender: the peer flushes its input when it opens the tty
            seen += decoder.feed(port.read())
            if any(f.type is FrameType.ACK and f.seq == 2 for f in seen):
                break
    thread.join(10)
    assert result == [0]
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [(d["seq"], d["payload"]) for d in lines] == [(1, "accept"), (2, "reject")]
