"""Backend run calls: a model that loads and then fails, or asks for more memory than exists, or takes a fixed batch.

Each failure of a native call reaches the caller as one BackendError line (exit 6), never a native
exception's traceback; a model with a fixed batch size is fed batches of exactly that size.
"""

from __future__ import annotations

import contextlib
import resource
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from devices.placement import cpu_placement
from runtime.backends.litert import LiteRTBackend
from runtime.backends.ort import ORTBackend
from runtime.errors import BackendError, BadInput
from tests.runtime.modelgen import add_gather_tflite, huge_expand_onnx, matmul_onnx

W = np.array([[1, 0], [0, 1], [1, 1]], np.float32)  # matmul_onnx's weights


@contextlib.contextmanager
def address_space_capped(extra: int = 8 << 30) -> Iterator[None]:
    """This process may map at most ``extra`` bytes more while the block runs.

    Whatever the machine's memory and overcommit policy, a 256 GiB allocation then fails at once instead
    of being granted and touched."""
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    with open("/proc/self/statm") as f:
        mapped = int(f.read().split()[0]) * resource.getpagesize()
    resource.setrlimit(resource.RLIMIT_AS, (mapped + extra, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


def test_tflite_that_fails_at_invoke_is_one_backend_error(tmp_path: Path) -> None:
    # The GATHER's constant index 9 is out of bounds of 4 columns: LiteRT loads and allocates it, then fails to invoke.
    with LiteRTBackend(add_gather_tflite(tmp_path / "m.tflite", index=9), None, cpu_placement("litert")) as backend:
        with pytest.raises(BackendError, match=r"^litert: the model failed at run time \(RuntimeError: gather index out of bounds") as err:
            backend.run(np.ones((2, 4), np.float32))
    assert "\n" not in str(err.value) and err.value.exit_code == 6


def test_onnx_asking_for_256_gib_at_run_time_is_one_backend_error(tmp_path: Path) -> None:
    with ORTBackend(huge_expand_onnx(tmp_path / "m.onnx", gib=256), None, cpu_placement("ort")) as backend, address_space_capped():
        with pytest.raises(BackendError, match=r"^ort: the model failed at run time \(Fail: .*allocate") as err:
            backend.run(np.ones((1, 8), np.float32))
    assert "\n" not in str(err.value) and err.value.exit_code == 6


@pytest.mark.parametrize("rows", [1, 3, 4, 6, 9])  # fewer, exactly, and more than the fixed batch of 4, with a remainder
def test_fixed_batch_onnx_is_fed_its_batch_size(tmp_path: Path, rows: int) -> None:
    x = np.arange(rows * 3, dtype=np.float32).reshape(rows, 3)
    with ORTBackend(matmul_onnx(tmp_path / "m.onnx", batch=4), None, cpu_placement("ort")) as backend:
        assert backend.input.shape == (4, 3)
        np.testing.assert_array_equal(backend.run(x), x @ W)


def test_dynamic_batch_onnx_takes_the_whole_batch_at_once(tmp_path: Path) -> None:
    x = np.arange(21, dtype=np.float32).reshape(7, 3)
    with ORTBackend(matmul_onnx(tmp_path / "m.onnx"), None, cpu_placement("ort")) as backend:
        calls = []
        real = backend._run
        backend._run = lambda batch: calls.append(len(batch)) or real(batch)  # type: ignore[method-assign]
        np.testing.assert_array_equal(backend.run(x), x @ W)
    assert calls == [7]


def test_bad_input_stays_bad_input(tmp_path: Path) -> None:
    # Our own checks still come first and keep their exit code 2.
    with ORTBackend(matmul_onnx(tmp_path / "m.onnx", batch=4), None, cpu_placement("ort")) as backend:
        with pytest.raises(BadInput, match="dimension 1 is 5, the model takes 3"):
            backend.run(np.ones((4, 5), np.float32))
