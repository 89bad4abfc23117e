"""Hostile names, transport tars, bundle folders and store folders: one line, exit 2, nothing changed.

Each hostile tar is built here byte by byte (tarfile headers written by hand), small
on disk; a "huge" file is a sparse file (truncate), so the tests stay cheap and a
copy of its gigabytes would show as a failed assertion, not as a slow test.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

import runtime.bundle.store
from apps.cli import main as cli
from runtime.bundle.manifest import MANIFEST, Manifest, check_name, check_version
from runtime.bundle.store import MAX_TAR_HEADER, Store, parse_ref
from runtime.errors import BadInput
from tests.runtime.test_store import make_bundle_dir, make_transport, snapshot

ROOT = Path(__file__).resolve().parents[2]


def tree(root: Path) -> list[str]:
    """Everything under a store root, models or not (the 'remove ..' case deletes beside models/)."""
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if "tmp" not in p.relative_to(root).parts[:1])


def one_error_line(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("edgerun: "), err
    assert "Traceback" not in err
    return err


def manifest_bytes(directory: Path) -> bytes:
    return (directory / MANIFEST).read_bytes()


def raw_tar(members: list[tuple[tarfile.TarInfo, bytes]], fmt: int = tarfile.GNU_FORMAT) -> bytes:
    """A tar written header by header: TarInfo.tobuf as given (sizes, types and PAX headers
    need not match the data), each body padded to 512 bytes, then the end-of-archive blocks."""
    out = io.BytesIO()
    for info, data in members:
        out.write(info.tobuf(fmt, "utf-8", "surrogateescape"))
        out.write(data + b"\0" * (-len(data) % 512))
    out.write(b"\0" * 1024)
    return out.getvalue()


def member(name: str, size: int, type_: bytes = tarfile.REGTYPE, pax: dict[str, str] | None = None) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.size, info.type = size, type_
    if pax:
        info.pax_headers = pax
    return info


# -- item 1: names and versions, checked once before any path is made ------------------------

@pytest.mark.parametrize("bad", ["..", ".", "../../somewhere/foo", "x\n", "tiny\n", "a/b", "", "-x", "X" * 65, "tiny@", "tiny@..",
                                 "tiny@1.0\n"])
def test_parse_ref_refuses_every_bad_name_and_version(bad: str) -> None:
    with pytest.raises(BadInput, match="is not valid"):
        parse_ref(bad)


def test_names_and_file_names_are_whole_string_matches() -> None:
    # re.match with "$" accepted a trailing newline: a bundle named "x\n" installed as a folder "x\n".
    for check, good in ((check_name, "x"), (check_version, "1.0")):
        assert check(good) == good
        with pytest.raises(BadInput):
            check(good + "\n")
    directory_manifest = {
        "format": "edgerun.bundle", "schema_version": 1, "kind": "llm", "backend": "llamacpp", "model_format": "gguf",
        "name": "x", "version": "1", "llm": {"architecture": "llama", "context_length": 8},
        "files": [{"path": "model.gguf", "sha256": "0" * 64, "size": 1}],
    }
    assert Manifest.from_dict(directory_manifest).name == "x"
    for field, where in (("name", None), ("version", None), ("path", "files")):
        bad = json.loads(json.dumps(directory_manifest))
        (bad["files"][0] if where else bad)[field] += "\n"
        with pytest.raises(BadInput, match="not valid"):
            Manifest.from_dict(bad)


def test_remove_dotdot_deletes_nothing(store: Store, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`edgerun remove ..` with a bundle folder beside models/ deleted the whole store (exit 0)."""
    store.install(make_transport(tmp_path / "src"))
    make_bundle_dir(store.root, name="beside", version="1.0")  # a bundle folder in the store root, beside models/
    before = tree(store.root)
    for argv in (["remove", ".."], ["remove", "../../somewhere/foo"], ["remove", "tiny@"], ["remove", "tiny\n"],
                 ["remove", "../beside-1.0"], ["rollback", ".."]):
        assert cli(argv) == 2, argv
        assert "is not valid" in one_error_line(capsys)
        assert tree(store.root) == before
    assert [i.ref for i in store.list()] == ["tiny@1.0"]


@pytest.mark.parametrize("call", [
    lambda s: s.remove(".."), lambda s: s.remove("tiny", ""), lambda s: s.remove("../x", "1.0"), lambda s: s.rollback(".."),
    lambda s: s.get(".."), lambda s: s.get("tiny", "../../x"),
])
def test_every_store_method_checks_its_name(store: Store, tmp_path: Path, call) -> None:
    store.install(make_transport(tmp_path / "src"))
    before = tree(store.root)
    with pytest.raises(BadInput, match="is not valid"):
        call(store)
    assert tree(store.root) == before


# state.json is a file in the store, not checked input. Before, any entry whose <models>/tiny/<entry>/manifest.json
# existed was kept, and the last one became the current version: a path out of the store, or another spelling of one.
@pytest.mark.parametrize("hostile", [
    "../../../out/evil-9.0", "2.0/../../../../out/evil-9.0",  # the bundle in tmp_path/out: outside the store
    "1.0/.", "2.0/../1.0",  # installed folders under names that are not versions
    7, "2.0\n",  # not a string; no such folder (refused before too, kept as cases of the class)
])
def test_state_json_versions_must_be_installed_versions(store: Store, tmp_path: Path, hostile: object) -> None:
    store.install(make_transport(tmp_path / "a", version="1.0"))
    store.install(make_transport(tmp_path / "b", version="2.0"))  # current: 2.0
    make_bundle_dir(tmp_path / "out", name="evil", version="9.0")  # a bundle outside the store
    state = store.models / "tiny" / "state.json"
    state.write_text(json.dumps({"history": ["1.0", "2.0", hostile]}))
    current = store.get("tiny")
    assert (current.ref, current.directory, current.current) == ("tiny@2.0", store.models / "tiny" / "2.0", True)
    assert [(i.ref, i.current) for i in store.list()] == [("tiny@1.0", False), ("tiny@2.0", True)]
    assert store.rollback("tiny").ref == "tiny@1.0"  # the hostile entry was not a version to roll back from
    assert json.loads(state.read_text()) == {"history": ["1.0"]}


@pytest.mark.parametrize("garbage", [b"[" * 100_000, b"{not json", b"\xff\xfe", b""])
def test_list_survives_one_damaged_manifest(store: Store, tmp_path: Path, capsys, caplog, garbage: bytes) -> None:
    store.install(make_transport(tmp_path / "a", name="good"))
    broken = store.install(make_transport(tmp_path / "b", name="broken"))
    (broken.directory / MANIFEST).write_bytes(garbage)
    assert cli(["list"]) == 0
    assert "good" in capsys.readouterr().out
    assert [r.getMessage().split(" is damaged")[0] for r in caplog.records] == ["broken@1.0"]


# -- item 2 / 7: transport tars -------------------------------------------------------------

def _install_fails(store: Store, data: bytes, tmp_path: Path, capsys, fragment: str) -> None:
    store.install(make_transport(tmp_path / "old", name="old"))
    before = snapshot(store)
    bad = tmp_path / "bad.edgerun"
    bad.write_bytes(data)
    assert cli(["install", str(bad)]) == 2
    assert fragment in one_error_line(capsys)
    assert snapshot(store) == before
    assert not any(store.tmp.iterdir())


@pytest.mark.parametrize("where", ["first", "after-manifest"])
@pytest.mark.parametrize("size", [1 << 40, MAX_TAR_HEADER + 1])
def test_huge_pax_header_is_one_line_not_memory_error(store: Store, tmp_path: Path, capsys, where: str, size: int) -> None:
    """A PAX header declaring 1 TiB made tarfile allocate it: MemoryError. Bounded before tarfile reads it."""
    good = make_bundle_dir(tmp_path / "src")
    pax = (member("././@PaxHeader", size, tarfile.XHDTYPE), b"30 path=" + b"a" * 21 + b"\n")
    manifest = (member(MANIFEST, len(manifest_bytes(good))), manifest_bytes(good))
    members = [pax, manifest] if where == "first" else [manifest, pax]
    _install_fails(store, raw_tar(members), tmp_path, capsys, f"extended header declares {size} bytes")


def test_gnu_long_name_header_is_bounded(store: Store, tmp_path: Path, capsys) -> None:
    good = make_bundle_dir(tmp_path / "src")
    members = [(member(MANIFEST, len(manifest_bytes(good))), manifest_bytes(good)),
               (member("././@LongLink", 1 << 40, tarfile.GNUTYPE_LONGNAME), b"x" * 100)]
    _install_fails(store, raw_tar(members), tmp_path, capsys, f"declares {1 << 40} bytes")


def test_gnu_sparse_member_is_refused(store: Store, tmp_path: Path, capsys) -> None:
    """GNU type 'S' counted as a regular file (tarfile.isfile): a few KB could expand to gigabytes."""
    good = make_bundle_dir(tmp_path / "src")
    weights = (good / "model.gguf").read_bytes()
    members = [(member(MANIFEST, len(manifest_bytes(good))), manifest_bytes(good)),
               (member("model.gguf", len(weights), tarfile.GNUTYPE_SPARSE), weights)]
    _install_fails(store, raw_tar(members), tmp_path, capsys, "is a GNU sparse file; bundle members are plain files")


@pytest.mark.parametrize("pax", [
    {"GNU.sparse.major": "1", "GNU.sparse.minor": "0", "GNU.sparse.name": "model.gguf", "GNU.sparse.realsize": str(1 << 40)},
    {"GNU.sparse.map": "0,10," + str(1 << 40) + ",10", "GNU.sparse.size": str(1 << 40)},
    {"GNU.sparse.size": str(1 << 40), "GNU.sparse.numblocks": "1", "GNU.sparse.offset": "0", "GNU.sparse.numbytes": "10"},
], ids=["pax-1.0", "pax-0.1", "pax-0.0"])
def test_pax_sparse_member_is_refused(store: Store, tmp_path: Path, capsys, pax: dict[str, str]) -> None:
    good = make_bundle_dir(tmp_path / "src")
    weights = (good / "model.gguf").read_bytes()
    members = [(member(MANIFEST, len(manifest_bytes(good))), manifest_bytes(good)),
               (member("model.gguf", len(weights), pax=pax), b"1\n0\n10\n" + weights)]
    _install_fails(store, raw_tar(members, tarfile.PAX_FORMAT), tmp_path, capsys, "is a PAX sparse file; bundle members are plain files")


@pytest.mark.parametrize("type_, what", [(tarfile.SYMTYPE, "'2'"), (tarfile.LNKTYPE, "'1'"), (tarfile.FIFOTYPE, "'6'"),
                                         (tarfile.CHRTYPE, "'3'"), (tarfile.DIRTYPE, "'5'")])
def test_non_regular_members_are_refused(store: Store, tmp_path: Path, capsys, type_: bytes, what: str) -> None:
    good = make_bundle_dir(tmp_path / "src")
    link = member("model.gguf", 0, type_)
    link.linkname = "/etc/passwd"
    members = [(member(MANIFEST, len(manifest_bytes(good))), manifest_bytes(good)), (link, b"")]
    _install_fails(store, raw_tar(members), tmp_path, capsys, f"is tar type b{what}")


def test_member_larger_than_its_manifest_entry_is_refused_before_copying(store: Store, tmp_path: Path, capsys,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """A 4 GiB member under a manifest entry of the real size: refused from its header, nothing read or copied."""
    good = make_bundle_dir(tmp_path / "src")
    store.install(make_transport(tmp_path / "old", name="old"))
    before = snapshot(store)
    bad = tmp_path / "big.edgerun"
    with open(bad, "wb") as fh:
        fh.write(raw_tar([(member(MANIFEST, len(manifest_bytes(good))), manifest_bytes(good))])[:-1024])
        fh.write(member("model.gguf", 4 << 30).tobuf(tarfile.GNU_FORMAT, "utf-8", "surrogateescape"))
        fh.truncate(fh.tell() + (4 << 30) + 1024)  # the 4 GiB body is a hole: cheap here, and never read
    monkeypatch.setattr(runtime.bundle.store, "sha256_stream", _never("copied a member before checking its size"))
    assert cli(["install", str(bad)]) == 2
    assert f"member 'model.gguf' is {4 << 30} bytes, the manifest says" in one_error_line(capsys)
    assert snapshot(store) == before


def _never(what: str):
    def fail(*_a, **_k):
        raise AssertionError(what)
    return fail


def test_free_space_is_checked_before_staging(store: Store, tmp_path: Path, capsys) -> None:
    good = make_bundle_dir(tmp_path / "src")
    manifest = json.loads(manifest_bytes(good))
    manifest["files"][0]["size"] = 1 << 60  # an exabyte: no disk has it free
    raw = json.dumps(manifest).encode()
    _install_fails(store, raw_tar([(member(MANIFEST, len(raw)), raw)]), tmp_path, capsys, "free in")


# -- item 7: bundle folders ------------------------------------------------------------------

def test_folder_install_checks_sizes_before_copying(store: Store, tmp_path: Path, capsys, monkeypatch: pytest.MonkeyPatch) -> None:
    """A 4 GiB file whose manifest says its real size of a few KB was copied whole before the check."""
    directory = make_bundle_dir(tmp_path / "src")
    with open(directory / "model.gguf", "r+b") as fh:
        fh.truncate(4 << 30)  # sparse: 4 GiB by stat(), nothing on disk
    monkeypatch.setattr(runtime.bundle.store, "sha256_stream", _never("copied a file before checking its size"))
    assert cli(["install", str(directory)]) == 2
    assert f"model.gguf is {4 << 30} bytes, the manifest says" in one_error_line(capsys)
    assert snapshot(store) == []


def test_huge_manifest_in_a_folder_is_refused_before_reading(tmp_path: Path) -> None:
    """A 64 GiB (sparse) manifest.json was read whole before the 4 MiB limit: run under a 1 GiB address space."""
    directory = make_bundle_dir(tmp_path / "src")
    with open(directory / MANIFEST, "r+b") as fh:
        fh.truncate(64 << 30)
    code = ("import resource, sys; resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30)); "
            "from apps.cli import main; sys.exit(main(sys.argv[1:]))")
    done = subprocess.run([sys.executable, "-c", code, "install", str(directory)], capture_output=True, text=True, cwd=ROOT,
                          env={**os.environ, "EDGERUN_HOME": str(tmp_path / "home")}, timeout=60)
    assert done.returncode == 2, done.stderr
    assert f"manifest is {64 << 30} bytes (at most" in done.stderr and done.stderr.count("\n") == 1


def test_fifo_inside_a_bundle_is_refused_unopened(store: Store, tmp_path: Path, capsys) -> None:
    directory = make_bundle_dir(tmp_path / "src")
    (directory / "model.gguf").unlink()
    os.mkfifo(directory / "model.gguf")
    for argv in (["install", str(directory)], ["inspect", str(directory)]):
        assert cli(argv) == 2
        assert "model.gguf: is a FIFO, not a regular file" in one_error_line(capsys)
    os.unlink(directory / MANIFEST)
    os.mkfifo(directory / MANIFEST)
    assert cli(["inspect", str(directory)]) == 2
    assert "is a FIFO" in one_error_line(capsys)


@pytest.mark.parametrize("name, argv", [("x.edgerun", ["install"]), ("x.gguf", ["inspect"]), ("x.edgerun", ["inspect"]),
                                        ("x.edgerun", ["verify"])])
def test_fifo_as_the_model_path_is_refused_without_blocking(tmp_path: Path, name: str, argv: list[str]) -> None:
    """Opening a FIFO for reading blocks until a writer comes: it hung forever. Run in a child with a timeout."""
    fifo = tmp_path / name
    os.mkfifo(fifo)
    done = subprocess.run([sys.executable, "-m", "apps", *argv, str(fifo)], capture_output=True, text=True, cwd=ROOT,
                          env={**os.environ, "EDGERUN_HOME": str(tmp_path / "home")}, timeout=60)
    assert done.returncode == 2, done.stderr
    assert "is a FIFO" in done.stderr and done.stderr.count("\n") == 1


# -- item 7: the store folder and pack's output ---------------------------------------------

@pytest.mark.parametrize("home", ["file", "/proc", "under-a-file"])
def test_unusable_store_folder_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys, home: str) -> None:
    bundle = make_transport(tmp_path / "src")
    (tmp_path / "file").write_text("not a folder")
    root = {"file": str(tmp_path / "file"), "/proc": "/proc", "under-a-file": str(tmp_path / "file" / "store")}[home]
    monkeypatch.setenv("EDGERUN_HOME", root)
    for argv in (["install", str(bundle)], ["run", str(bundle), "--prompt", "hi"], ["remove", "tiny"]):
        assert cli(argv) == 2, argv
        err = one_error_line(capsys)
        assert f"model store {root}" in err and "set EDGERUN_HOME to a writable folder" in err
    if home == "file":
        assert cli(["list"]) == 2
        assert "is a regular file, not a folder" in one_error_line(capsys)


def test_pack_into_a_missing_folder_is_one_line(store: Store, tmp_path: Path, capsys) -> None:
    directory = make_bundle_dir(tmp_path / "src")
    out = tmp_path / "missing" / "x.edgerun"
    assert cli(["pack", str(directory), "--out", str(out)]) == 2
    assert f"the folder {out.parent} does not exist" in one_error_line(capsys)
    assert not out.parent.exists()


def test_pack_writes_the_file_a_link_names(store: Store, tmp_path: Path) -> None:
    """A link inside the bundle is packed as the file it names (tarfile.add would pack a symlink member)."""
    directory = make_bundle_dir(tmp_path / "src")
    (directory / "model.gguf").rename(directory / "real.bin")
    (directory / "model.gguf").symlink_to("real.bin")
    out = runtime.bundle.store.pack(directory, tmp_path / "x.edgerun")
    with tarfile.open(out) as tar:
        assert [(m.name, m.isreg()) for m in tar] == [(MANIFEST, True), ("model.gguf", True)]
    assert store.install(out).ref == "tiny@1.0"
