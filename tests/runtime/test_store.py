"""Bundles and the store: checksums before visibility, atomic installs, versions, rollback."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest

from apps.cli import main as cli
from runtime.bundle.manifest import MANIFEST, FileEntry, Manifest
from runtime.bundle.recipes import llm_manifest
from runtime.bundle.store import Store, pack
from runtime.errors import BadInput
from runtime.files import sha256_file
from runtime.formats.gguf_file import read_gguf
from tests.ggufgen import write_tiny


def make_bundle_dir(root: Path, name: str = "tiny", version: str = "1.0", ctx: int = 2048) -> Path:
    directory = root / f"{name}-{version}"
    directory.mkdir(parents=True)
    gguf = write_tiny(directory / "model.gguf", ctx=ctx)
    sha, size = sha256_file(gguf)
    manifest = llm_manifest(read_gguf(gguf), name, version, FileEntry("model.gguf", sha, size), "MIT")
    (directory / MANIFEST).write_bytes(manifest.to_json())
    return directory


def make_transport(root: Path, **kw) -> Path:
    directory = make_bundle_dir(root, **kw)
    return pack(directory, root / f"{directory.name}.edgerun")


def snapshot(store: Store) -> list[str]:
    """Everything visible in the store (models only; tmp and lock are internal)."""
    if not store.models.exists():
        return []
    return sorted(str(p.relative_to(store.root)) for p in store.models.rglob("*"))


def test_install_list_rollback_remove(store: Store, tmp_path: Path) -> None:
    v1 = make_transport(tmp_path, version="1.0")
    v2 = make_transport(tmp_path, version="2.0")
    store.install(v1)
    store.install(v2)
    rows = {(r.manifest.version, r.current) for r in store.list()}
    assert rows == {("1.0", False), ("2.0", True)}
    assert store.get("tiny").manifest.version == "2.0"
    assert store.rollback("tiny").manifest.version == "1.0"
    assert store.get("tiny").manifest.version == "1.0"
    with pytest.raises(BadInput, match="no previous version"):
        store.rollback("tiny")
    assert store.get("tiny", "2.0").manifest.version == "2.0"  # still installed, just not current
    assert store.remove("tiny", "2.0") == ["2.0"]
    assert store.remove("tiny") == ["1.0"]
    assert store.names() == []


def test_installed_files_match_the_bundle(store: Store, tmp_path: Path) -> None:
    bundle = make_transport(tmp_path)
    installed = store.install(bundle)
    entry = installed.manifest.files[0]
    assert sha256_file(installed.directory / entry.path) == (entry.sha256, entry.size)


def test_reinstalling_the_same_version_is_refused(store: Store, tmp_path: Path) -> None:
    bundle = make_transport(tmp_path)
    store.install(bundle)
    with pytest.raises(BadInput, match="already installed"):
        store.install(bundle)


def _rewrite(src: Path, dst: Path, *, manifest=None, payload=None, extra=None, order=None) -> Path:
    """A transport bundle rebuilt with one thing changed."""
    with tarfile.open(src) as tar:
        members = {m.name: tar.extractfile(m).read() for m in tar}
    if manifest is not None:
        members[MANIFEST] = manifest(json.loads(members[MANIFEST]))
    if payload is not None:
        members["model.gguf"] = payload(members["model.gguf"])
    if extra:
        members.update(extra)
    names = order or list(members)
    import io

    with tarfile.open(dst, "w") as tar:
        for name in names:
            data = members[name]
            if isinstance(data, dict):
                data = json.dumps(data).encode()
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return dst


def _drop(key):
    def f(m):
        del m[key]
        return m
    return f


def _set(key, value):
    def f(m):
        m[key] = value
        return m
    return f


# Each bad bundle, and a fragment of the one-line error. None leaves the store changed.
BAD_BUNDLES = [
    # One flipped byte in the weights: storage or transfer corruption.
    ("checksum mismatch", dict(payload=lambda b: b[:-1] + bytes([b[-1] ^ 1])), "checksum mismatch"),
    # Weights cut short: an interrupted copy onto the device.
    ("truncated payload", dict(payload=lambda b: b[: len(b) // 2]), "bytes, the manifest says"),
    # Manifest problems: each required field missing or of the wrong type.
    ("no name", dict(manifest=_drop("name")), "required field 'name' is missing"),
    ("no files", dict(manifest=_drop("files")), "required field 'files' is missing"),
    ("wrong schema", dict(manifest=_set("schema_version", 7)), "schema_version 7 is not supported"),
    ("wrong format", dict(manifest=_set("format", "zip")), "format is 'zip'"),
    ("bad kind", dict(manifest=_set("kind", "robot")), "kind 'robot' is not valid (valid: llm, vision, audio, anomaly)"),
    ("bad version type", dict(manifest=_set("version", 3)), "field 'version' must be str"),
    ("bad name", dict(manifest=_set("name", "../etc")), "model name '../etc' is not valid"),
    ("llm without llm section", dict(manifest=_drop("llm")), "requires an 'llm' section"),
    # A member the manifest does not list (e.g. a path-traversal attempt).
    ("unlisted member", dict(extra={"../../evil": b"x"}), "unexpected member '../../evil'"),
    # Manifest not first: a reader cannot verify while streaming.
    ("manifest not first", dict(order=["model.gguf", MANIFEST]), "first member must be manifest.json"),
]


@pytest.mark.parametrize("change, fragment", [(c, f) for _, c, f in BAD_BUNDLES], ids=[b[0] for b in BAD_BUNDLES])
def test_bad_bundles_are_refused_and_leave_the_store_unchanged(store: Store, tmp_path: Path, change, fragment, capsys) -> None:
    store.install(make_transport(tmp_path / "good", version="0.9"))
    before = snapshot(store)
    bad = _rewrite(make_transport(tmp_path), tmp_path / "bad.edgerun", **change)
    code = cli(["install", str(bad)])
    err = capsys.readouterr().err
    assert code == 2, err
    assert fragment in err and err.count("\n") == 1
    assert snapshot(store) == before
    assert not any(store.tmp.iterdir()) if store.tmp.exists() else True


def test_missing_manifest_member(store: Store, tmp_path: Path) -> None:
    with pytest.raises(BadInput, match="incomplete: missing model.gguf"):
        store.install(_rewrite(make_transport(tmp_path), tmp_path / "x.edgerun", order=[MANIFEST]))


def test_not_a_bundle(store: Store, tmp_path: Path) -> None:
    junk = tmp_path / "junk.edgerun"
    junk.write_bytes(b"hello" * 100)
    with pytest.raises(BadInput, match="not an edgerun bundle"):
        store.install(junk)


def test_killed_install_leaves_the_store_as_it_was(store: Store, tmp_path: Path) -> None:
    """SIGKILL in the middle of copying a large bundle: nothing becomes visible."""
    store.install(make_transport(tmp_path / "old", version="0.1"))
    before = snapshot(store)
    directory = make_bundle_dir(tmp_path / "big", version="9.9")
    big = directory / "model.gguf"
    with open(big, "ab") as fh:  # pad to 400 MB so the copy takes a while; fix the manifest to match
        fh.truncate(400 << 20)
    sha, size = sha256_file(big)
    m = json.loads((directory / MANIFEST).read_text())
    m["files"][0].update(sha256=sha, size=size)
    (directory / MANIFEST).write_text(json.dumps(m))
    bundle = pack(directory, tmp_path / "big.edgerun")
    proc = subprocess.Popen([sys.executable, "-m", "apps", "install", str(bundle)], env={**os.environ, "EDGERUN_HOME": str(store.root)})
    deadline = time.time() + 30
    while time.time() < deadline and not (store.tmp.exists() and any(store.tmp.iterdir())):
        time.sleep(0.005)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL
    assert snapshot(store) == before
    # The next change cleans the staging leftovers.
    store.install(make_transport(tmp_path / "new", version="0.2"))
    assert not any(store.tmp.iterdir())


def test_cli_store_commands(store: Store, tmp_path: Path, capsys) -> None:
    bundle = make_transport(tmp_path)
    assert cli(["install", str(bundle)]) == 0
    assert cli(["list", "--json"]) == 0
    out = capsys.readouterr().out
    assert json.loads(out.split("\n", 1)[1])[0]["name"] == "tiny"
    assert cli(["rollback", "tiny"]) == 2  # only one version
    assert cli(["remove", "tiny@7.0"]) == 2
    err = capsys.readouterr().err
    assert "no version '7.0' (installed: 1.0)" in err
    assert cli(["remove", "tiny"]) == 0


def test_manifest_roundtrip(tmp_path: Path) -> None:
    directory = make_bundle_dir(tmp_path)
    raw = (directory / MANIFEST).read_bytes()
    m = Manifest.from_bytes(raw, "x")
    assert Manifest.from_bytes(m.to_json(), "x") == m
    assert m.llm is not None and m.llm.context_length == 2048 and m.license == "MIT"
