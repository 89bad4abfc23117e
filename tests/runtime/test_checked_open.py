"""Item 13: what a backend loads is the file that was verified (runtime/bundle/checked_open.py).

Verification records each file's identity (device, inode, size, mtime_ns, ctime_ns). A loader opens each file
once, refuses any other file at that path (renamed over, rewritten in place, a folder of the bundle swapped for a
symlink, a symlink or a FIFO put in its place) and hands the backend /proc/self/fd/N of the open file, so a swap
after the open cannot reach the backend either. Before: loaders reopened the checked paths, and loaded whatever
was there by then.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import threading
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from devices.placement import cpu_placement, resolve_placement
from runtime.backends.base import TensorInfo
from runtime.backends.null import NullBackend
from runtime.bundle import checked_open
from runtime.bundle.resolve import resolve
from runtime.bundle.store import Store
from runtime.classify.classifier import Classifier, open_backend, read_labels
from runtime.errors import BadInput
from tests.runtime.modelgen import vision_bundle
from tests.runtime.test_null_backend import IMAGE_IN, null_bundle
from tests.runtime.test_store import make_bundle_dir

OTHER_OUTPUT = TensorInfo("output", (-1, 12), "float32")  # another model: 12 classes instead of 10


def other_model(size: int) -> bytes:
    """A valid null model of ``size`` bytes that is not the bundle's (JSON padded with spaces)."""
    data = NullBackend.describe(IMAGE_IN, OTHER_OUTPUT)
    assert len(data) <= size
    return data.ljust(size)


def blobs_bundle(tmp_path: Path) -> tuple[Path, Path]:
    """A null bundle whose model.null is a link to blobs/model.null inside it (allowed): (bundle, real weights file)."""
    directory = null_bundle(tmp_path / "bundle")
    (directory / "blobs").mkdir()
    real = directory / "blobs" / "model.null"
    (directory / "model.null").rename(real)
    (directory / "model.null").symlink_to("blobs/model.null")
    return directory, real


# Each swap happens after verification and before the load; each leaves a valid, different model at the path.
def rename_over(real: Path) -> None:  # a new inode
    (real.parent / "new").write_bytes(other_model(real.stat().st_size))
    os.replace(real.parent / "new", real)


def rewrite_in_place(real: Path) -> None:  # the same inode, size and mtime: only ctime tells
    st = real.stat()
    time.sleep(0.05)  # past the coarse clock tick of the ctime that verification recorded
    with open(real, "r+b") as fh:
        fh.write(other_model(st.st_size))
    os.utime(real, ns=(st.st_atime_ns, st.st_mtime_ns))
    now = real.stat()
    assert (now.st_ino, now.st_size, now.st_mtime_ns) == (st.st_ino, st.st_size, st.st_mtime_ns) and now.st_ctime_ns != st.st_ctime_ns


def folder_to_symlink(real: Path) -> None:  # the bundle's blobs/ folder now points outside it
    elsewhere = real.parent.parent.parent / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / real.name).write_bytes(other_model(real.stat().st_size))
    real.parent.rename(real.parent.parent.parent / "old-blobs")
    real.parent.symlink_to(elsewhere)


def file_to_symlink(real: Path) -> None:
    other = real.parent.parent.parent / "other.null"
    other.write_bytes(other_model(real.stat().st_size))
    real.unlink()
    real.symlink_to(other)


def file_to_fifo(real: Path) -> None:
    """A FIFO fed another model: a loader that reads the path gets that model (and one with no writer would hang)."""
    data = other_model(real.stat().st_size)
    real.unlink()
    os.mkfifo(real)

    def feed() -> None:
        with contextlib.suppress(OSError), open(real, "wb") as fh:  # waits for a reader
            fh.write(data)

    threading.Thread(target=feed, daemon=True).start()


SWAPS: list[tuple[Callable[[Path], None], str]] = [
    (rename_over, "changed since it was verified"),
    (rewrite_in_place, "changed since it was verified"),
    (folder_to_symlink, "changed since it was verified"),
    (file_to_symlink, "is now a symbolic link"),
    (file_to_fifo, "is now a FIFO"),
]


@pytest.mark.parametrize(("swap", "says"), SWAPS, ids=[s.__name__ for s, _ in SWAPS])
def test_a_file_changed_between_verification_and_load_is_refused(store: Store, tmp_path: Path, swap, says: str) -> None:
    directory, real = blobs_bundle(tmp_path)
    model = resolve(str(directory), store)
    checked = model.path()
    assert checked == real.resolve()
    swap(real)
    try:
        with pytest.raises(BadInput) as refused:
            open_backend(model, None, resolve_placement("null", "cpu", threads=1))
    finally:
        if real.is_fifo():  # let a feeder still waiting for a reader finish
            os.close(os.open(real, os.O_RDONLY | os.O_NONBLOCK))
    message = str(refused.value)
    assert message.startswith(f"{checked}: ") and says in message and "\n" not in message


def test_changed_labels_are_refused(store: Store, tmp_path: Path) -> None:
    directory = null_bundle(tmp_path / "bundle")
    model = resolve(str(directory), store)
    assert read_labels(model, "labels.txt")[0] == "label-0"
    labels = directory / "labels.txt"
    (directory / "new").write_text(labels.read_text().replace("label-0", "label-X"))  # same size, other text
    os.replace(directory / "new", labels)
    with pytest.raises(BadInput, match="labels.txt: changed since it was verified"):
        read_labels(model, "labels.txt")


@pytest.mark.parametrize("bare", [False, True], ids=["bundle-dir", "bare-gguf"])
def test_an_llm_file_changed_after_verification_is_refused(store: Store, tmp_path: Path, bare: bool) -> None:
    from runtime.llm.model import LLM

    directory = make_bundle_dir(tmp_path / "src")
    gguf = directory / "model.gguf"
    model = resolve(str(gguf if bare else directory), store)
    shutil.copy(gguf, tmp_path / "copy.gguf")  # the same bytes under a new inode: still not the file that was verified
    os.replace(tmp_path / "copy.gguf", gguf)
    with pytest.raises(BadInput, match=f"^{gguf}: changed since it was verified"):
        LLM.load(model, threads=1)


# -- the narrowest race: the path is swapped just before the backend opens it ---------------------------------------

BACKEND_CLASSES = {"onnx": ("runtime.backends.ort", "ORTBackend"), "tflite": ("runtime.backends.litert", "LiteRTBackend"),
                   "null": ("runtime.backends.null", "NullBackend"), "gguf": ("runtime.backends.llamacpp", "LlamaCppBackend")}


def swap_before_backend(monkeypatch: pytest.MonkeyPatch, fmt: str, real: Path) -> list[str]:
    """From now on, the backend class for ``fmt`` first finds zeros renamed over ``real``; returns the paths it was given."""
    import importlib

    module = importlib.import_module(BACKEND_CLASSES[fmt][0])
    backend_class = getattr(module, BACKEND_CLASSES[fmt][1])
    given: list[str] = []

    def swapped_then_load(path: Path, *args, **kwargs):
        given.append(str(path))
        (real.parent / ".zeros").write_bytes(b"\0" * real.stat().st_size)
        os.replace(real.parent / ".zeros", real)
        return backend_class(path, *args, **kwargs)

    monkeypatch.setattr(module, BACKEND_CLASSES[fmt][1], swapped_then_load)
    return given


def descriptor(path: str) -> int:
    assert path.startswith("/proc/self/fd/"), path
    return int(path.rsplit("/", 1)[1])


def holds(fd: int, path: Path) -> bool:
    """Whether descriptor ``fd`` is still open on the (since replaced) file ``path``."""
    try:
        return os.readlink(f"/proc/self/fd/{fd}") == f"{path} (deleted)"
    except OSError:
        return False


@pytest.mark.parametrize("fmt", ["onnx", "tflite", "null"])
def test_backends_load_the_open_file_not_the_path(store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fmt: str) -> None:
    """ONNX Runtime, LiteRT and the null backend each load /proc/self/fd/N; the descriptor is closed once loaded."""
    directory = null_bundle(tmp_path / "b") if fmt == "null" else vision_bundle(tmp_path / "b", fmt)
    model = resolve(str(directory), store)
    weights = model.path()
    placement = resolve_placement(model.manifest.backend.value, "cpu", threads=1)
    given = swap_before_backend(monkeypatch, fmt, weights)
    with open_backend(model, None, placement) as backend:
        assert weights.read_bytes() == b"\0" * weights.stat().st_size  # the path holds zeros...
        assert backend.output.shape[1:] == (10,)  # ...and the backend has the verified model
        spec = model.manifest.vision
        shape = (1, 3, spec.size, spec.size) if spec.layout.value == "nchw" else (1, spec.size, spec.size, 3)
        assert backend.run(np.zeros(shape, np.float32)).shape == (1, 10)
    assert len(given) == 1 and not holds(descriptor(given[0]), weights)


@pytest.mark.slow
def test_llama_cpp_loads_the_open_file_not_the_path(smollm, tmp_path: Path, store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    """llama.cpp maps /proc/self/fd/N (the verified file) and keeps the mapping after the descriptor is closed."""
    from runtime.llm.model import LLM
    from runtime.llm.sampling import SamplingParams

    gguf = tmp_path / "smollm.gguf"
    shutil.copy(smollm.path(), gguf)
    model = resolve(str(gguf), store)
    given = swap_before_backend(monkeypatch, "gguf", gguf)
    with LLM.load(model, threads=1, ctx=256) as llm:
        with open(gguf, "rb") as fh:
            assert fh.read(4) == b"\0" * 4  # the path holds zeros
        assert not holds(descriptor(given[0]), gguf)  # closed: llama.cpp keeps its mapping, not the path
        assert llm.generate("The capital of France is", SamplingParams(max_tokens=2, temperature=0)).tokens_out == 2


def test_errors_name_the_file_not_the_descriptor(store: Store, tmp_path: Path) -> None:
    directory = null_bundle(tmp_path / "b")
    (directory / "model.null").write_bytes(b"[" * 8)  # verified as it is (the manifest's hash matches), then refused
    manifest = json.loads((directory / "manifest.json").read_text())
    manifest["files"][0].update(sha256=hashlib.sha256(b"[" * 8).hexdigest(), size=8)
    (directory / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(BadInput) as refused:
        Classifier.load(str(directory), threads=1)
    assert str(refused.value).startswith(f"{directory.resolve() / 'model.null'}: not a null model")
    assert "/proc/self/fd" not in str(refused.value)


# -- without /proc/self/fd: the real path is loaded and checked again afterwards -----------------------------------

def test_without_proc_a_change_during_the_load_is_refused_and_the_backend_closed(store: Store, tmp_path: Path,
                                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(checked_open, "PROC_FD", str(tmp_path / "no-proc"))
    directory, real = blobs_bundle(tmp_path)
    model = resolve(str(directory), store)
    closed: list[bool] = []

    class Tracked(NullBackend):
        def close(self) -> None:
            closed.append(True)
            super().close()

    def load_then_swap(paths: list[Path]) -> NullBackend:
        assert paths == [real.resolve()]  # no descriptor path to give: the real one
        backend = Tracked(paths[0], None, told)
        rename_over(real)  # while the backend loads
        return backend

    told = cpu_placement("null")
    assert model.load(lambda paths: Tracked(paths[0], None, told), "model.null").output.shape[1:] == (10,)  # unchanged: loads
    with pytest.raises(BadInput, match="model.null: changed since it was verified"):
        model.load(load_then_swap, "model.null")
    assert closed == [True]
