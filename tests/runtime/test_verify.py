"""Verification once, then stamps; `edgerun verify`; verified paths are what loaders get; .edgerun reuse."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

import runtime.bundle.manifest
from apps.cli import main as cli
from runtime.bundle.manifest import MANIFEST
from runtime.bundle.resolve import resolve
from runtime.bundle.store import Store
from runtime.errors import BadInput
from tests.ggufgen import write_tiny
from tests.runtime.test_store import make_bundle_dir, make_transport, snapshot


@pytest.fixture
def hashed(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The files hashed in full, in order: a spy around the real sha256_file."""
    seen: list[str] = []
    real = runtime.bundle.manifest.sha256_file

    def spy(path, *args, **kwargs):
        seen.append(Path(os.path.realpath(path)).name)  # the file a /proc/self/fd/N path names
        return real(path, *args, **kwargs)

    monkeypatch.setattr(runtime.bundle.manifest, "sha256_file", spy)
    monkeypatch.setattr("runtime.bundle.resolve.sha256_file", spy)
    return seen


def flip_last_byte_keeping_mtime(path: Path) -> None:
    st = path.stat()
    data = bytearray(path.read_bytes())
    data[-1] ^= 1
    path.write_bytes(bytes(data))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))  # same size, same mtime, same inode: only ctime tells


# -- item 13: verify once, keep a stamp that a change voids ------------------------------------

def test_bundle_dir_is_hashed_once_then_stamped(store: Store, tmp_path: Path, hashed: list[str]) -> None:
    directory = make_bundle_dir(tmp_path / "src")
    first = resolve(str(directory), store)
    assert hashed == ["model.gguf"]
    again = resolve(str(directory), store)
    assert hashed == ["model.gguf"], "an unchanged bundle was hashed again"
    assert again.files == first.files
    os.utime(directory / "model.gguf", ns=(1, 1))  # a touch (mtime) voids the stamp
    resolve(str(directory), store)
    assert hashed == ["model.gguf"] * 2


@pytest.mark.parametrize("where", ["bundle-dir", "installed"])
def test_a_change_that_keeps_size_and_mtime_is_still_caught(store: Store, tmp_path: Path, where: str) -> None:
    """The stamp holds ctime too: a rewrite with the old mtime put back is not "unchanged"."""
    if where == "installed":
        ref, directory = "tiny", store.install(make_transport(tmp_path / "src")).directory
    else:
        directory = make_bundle_dir(tmp_path / "src")
        ref = str(directory)
    resolve(ref, store)
    flip_last_byte_keeping_mtime(directory / "model.gguf")
    with pytest.raises(BadInput, match="checksum mismatch for model.gguf"):
        resolve(ref, store)


@pytest.mark.parametrize("garbage", [b"[" * 100_000, b"[" * 50_000 + b"]" * 50_000, b'{"record": ' + b"[" * 100_000, b"1" * 5000])
@pytest.mark.parametrize("bare", [False, True], ids=["bundle-dir", "bare-gguf"])
def test_a_damaged_stamp_means_a_full_check(store: Store, tmp_path: Path, hashed: list[str], garbage: bytes, bare: bool) -> None:
    """A stamp nested 100,000 deep raised RecursionError (only OSError and ValueError were caught): now it is
    read with the manifests' bounded parser, and a stamp it refuses is no stamp."""
    target = write_tiny(tmp_path / "m.gguf") if bare else make_bundle_dir(tmp_path / "src")
    resolve(str(target), store)
    store.stamps._path(target).write_bytes(garbage)
    resolve(str(target), store)
    assert len(hashed) == 2
    resolve(str(target), store)  # the full check wrote a good stamp again
    assert len(hashed) == 2


def test_a_changed_manifest_voids_the_stamp(store: Store, tmp_path: Path) -> None:
    directory = make_bundle_dir(tmp_path / "src")
    resolve(str(directory), store)
    m = json.loads((directory / MANIFEST).read_text())
    m["files"][0]["sha256"] = "0" * 64  # the same file, checked against another checksum
    (directory / MANIFEST).write_text(json.dumps(m))
    with pytest.raises(BadInput, match="checksum mismatch"):
        resolve(str(directory), store)


def test_bare_gguf_is_hashed_once(store: Store, tmp_path: Path, hashed: list[str]) -> None:
    gguf = write_tiny(tmp_path / "m.gguf")
    first = resolve(str(gguf), store)
    second = resolve(str(gguf), store)
    assert hashed == ["m.gguf"]
    assert first.manifest == second.manifest and second.path() == gguf.resolve()
    flip_last_byte_keeping_mtime(gguf)
    third = resolve(str(gguf), store)
    assert hashed == ["m.gguf"] * 2 and third.manifest.version != first.manifest.version


def test_installed_models_are_stamped_at_install(store: Store, tmp_path: Path, hashed: list[str]) -> None:
    """An install hashes while it copies; the first run after it does not hash again."""
    installed = store.install(make_transport(tmp_path / "src"))
    hashed.clear()
    model = resolve("tiny", store)
    assert hashed == [] and model.origin == "store" and model.directory == installed.directory


def test_verify_command_forces_a_full_check(store: Store, tmp_path: Path, hashed: list[str], capsys) -> None:
    directory = make_bundle_dir(tmp_path / "src")
    resolve(str(directory), store)
    for _ in range(2):
        assert cli(["verify", str(directory)]) == 0
    assert hashed == ["model.gguf"] * 3
    assert "tiny@1.0: 1 file(s)" in capsys.readouterr().out
    bundle = make_transport(tmp_path / "t", version="2.0")
    assert cli(["verify", str(bundle), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["verified"] == "tiny@2.0"
    assert snapshot(store) == []  # a .edgerun is checked in place, not installed
    with open(directory / "model.gguf", "r+b") as fh:
        fh.seek(100)
        fh.write(b"\xff")
    assert cli(["verify", str(directory)]) == 2
    err = capsys.readouterr().err
    assert "checksum mismatch for model.gguf" in err and err.count("\n") == 1


def test_verify_installed_name(store: Store, tmp_path: Path, capsys) -> None:
    installed = store.install(make_transport(tmp_path / "src"))
    assert cli(["verify", "tiny@1.0"]) == 0
    flip_last_byte_keeping_mtime(installed.directory / "model.gguf")
    assert cli(["verify", "tiny"]) == 2
    assert "checksum mismatch" in capsys.readouterr().err


# -- item 13: load what was verified; no link out of the bundle --------------------------------

def test_a_link_out_of_the_bundle_is_refused(store: Store, tmp_path: Path, capsys) -> None:
    directory = make_bundle_dir(tmp_path / "src")
    outside = tmp_path / "elsewhere.gguf"
    (directory / "model.gguf").rename(outside)
    (directory / "model.gguf").symlink_to(outside)
    for argv in (["inspect", str(directory)], ["install", str(directory)], ["verify", str(directory)]):
        assert cli(argv) == 2
        err = capsys.readouterr().err
        assert f"model.gguf is a link to {outside}, outside the bundle" in err and err.count("\n") == 1


def test_loaders_get_the_real_file_that_was_checked(store: Store, tmp_path: Path) -> None:
    """A link inside the bundle is allowed; the path handed to a loader is the checked real file, so
    re-pointing the link afterwards cannot change what is loaded."""
    directory = make_bundle_dir(tmp_path / "src")
    (directory / "blobs").mkdir()
    (directory / "model.gguf").rename(directory / "blobs" / "w.gguf")
    (directory / "model.gguf").symlink_to("blobs/w.gguf")
    model = resolve(str(directory), store)
    assert model.path() == (directory / "blobs" / "w.gguf").resolve()
    (directory / "model.gguf").unlink()
    (directory / "model.gguf").symlink_to("/etc/passwd")
    assert model.path() == (directory / "blobs" / "w.gguf").resolve()


# -- item 12: a .edgerun runs on every use -------------------------------------------------------

def test_edgerun_file_is_installed_once_then_reused(store: Store, tmp_path: Path, hashed: list[str]) -> None:
    bundle = make_transport(tmp_path / "src")
    first = resolve(str(bundle), store)
    hashed.clear()
    second = resolve(str(bundle), store)
    assert (second.origin, second.directory, second.files) == ("store", first.directory, first.files)
    assert hashed == []  # the installed copy's stamp holds
    assert [i.ref for i in store.list()] == ["tiny@1.0"]


def test_inspect_an_edgerun_file_twice(store: Store, tmp_path: Path, capsys) -> None:
    bundle = make_transport(tmp_path / "src")
    for _ in range(3):
        assert cli(["inspect", str(bundle)]) == 0, capsys.readouterr().err


def test_a_different_bundle_under_an_installed_version_is_refused(store: Store, tmp_path: Path) -> None:
    resolve(str(make_transport(tmp_path / "a", ctx=2048)), store)
    other = make_transport(tmp_path / "b", ctx=4096)  # same name@version, other weights
    with pytest.raises(BadInput, match="tiny@1.0 is already installed with different files"):
        resolve(str(other), store)


@pytest.mark.slow
def test_bench_an_edgerun_file_at_two_thread_counts(store: Store, digit_bundles: dict[str, Path], tmp_path: Path, capsys) -> None:
    """bench resolves once per thread count: the second resolve failed with "already installed"."""
    from runtime.bundle.store import pack

    bundle = pack(digit_bundles["onnx"], tmp_path / "digits.edgerun")
    for _ in range(2):
        assert cli(["bench", str(bundle), "--threads", "1", "2", "--runs", "2", "--batch", "2", "--json"]) == 0
        rows = json.loads(capsys.readouterr().out)["results"]
        assert [r["threads"] for r in rows] == [1, 2]


def test_a_bundle_installed_meanwhile_is_reused_under_the_lock(store: Store, tmp_path: Path) -> None:
    """Two first runs of one .edgerun at once: the second finds it installed only when it commits."""
    bundle = make_transport(tmp_path / "src")
    first = store.install(bundle)
    assert store.install(bundle, reuse_same=True).directory == first.directory
    with pytest.raises(BadInput, match="already installed with different files"):
        store.install(make_transport(tmp_path / "other", ctx=4096), reuse_same=True)
