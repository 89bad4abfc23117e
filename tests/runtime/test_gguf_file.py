"""The GGUF reader rejects hostile and damaged files before llama.cpp sees them."""

from __future__ import annotations

import os
import struct
import threading
from pathlib import Path

import pytest

from apps.cli import main as cli
from runtime.errors import BadInput
from runtime.formats.gguf_file import read_gguf
from tests.ggufgen import patch, write_tiny


@pytest.fixture
def tiny(tmp_path: Path) -> Path:
    return write_tiny(tmp_path / "tiny.gguf")


def test_reads_a_valid_file(tiny: Path) -> None:
    info = read_gguf(tiny)
    assert info.version == 3
    assert info.architecture == "llama"
    assert info.n_vocab == 32
    assert [t.name for t in info.tensors] == ["token_embd.weight", "blk.0.attn_q.weight", "blk.0.ffn_up.weight",
                                              "blk.1.attn_q.weight", "blk.1.ffn_up.weight"]
    assert info.tensor_bytes == (32 * 64 + 2 * (64 * 64 + 256 * 64)) * 4  # f32
    assert info.arch_value("attention.head_count_kv") == 2


def _first_kv_type_offset(path: Path) -> int:
    # first KV: u64 key length, key bytes, u32 type
    data = path.read_bytes()
    (klen,) = struct.unpack_from("<Q", data, 24)
    return 24 + 8 + klen


def _cut(path: Path, n: int) -> None:
    path.write_bytes(path.read_bytes()[:n])


def _tensor_info_start(path: Path) -> int:
    """Offset of the first tensor info: walk the KVs with the reader's own rules."""
    info = read_gguf(path)
    data = path.read_bytes()
    name = info.tensors[0].name.encode()
    return data.index(struct.pack("<Q", len(name)) + name)


# Each case: how to damage the file, and a fragment the one-line error must contain.
HOSTILE = [
    # Not a GGUF at all: another format's magic (a safetensors/zip/ELF file renamed).
    ("bad magic", lambda p: patch(p, 0, "<4s", b"GGML"), "magic"),
    # GGUF v1 had 32-bit counts; llama.cpp no longer reads it.
    ("version 1", lambda p: patch(p, 4, "<I", 1), "unsupported GGUF version 1"),
    # A future version we cannot know the layout of.
    ("version 99", lambda p: patch(p, 4, "<I", 99), "unsupported GGUF version 99"),
    # A count that would make a naive reader allocate for ever.
    ("absurd tensor count", lambda p: patch(p, 8, "<Q", 1 << 62), "tensor count"),
    ("absurd KV count", lambda p: patch(p, 16, "<Q", 1 << 40), "metadata count"),
    # Counts that are plausible but cannot fit in the file's size.
    ("KV count beyond file", lambda p: patch(p, 16, "<Q", 60000), "cannot fit"),
    # A string whose length runs past the end of the file.
    ("huge key length", lambda p: patch(p, 24, "<Q", 1 << 50), "bytes long"),
    # An unknown value type tag.
    ("bad value type", lambda p: patch(p, _first_kv_type_offset(p), "<I", 77), "unknown value type"),
    # Cut inside the metadata: a partial copy.
    ("truncated header", lambda p: _cut(p, _tensor_info_start(p) - 5), "truncated"),
    # So short that the declared counts alone cannot fit.
    ("counts exceed size", lambda p: _cut(p, 40), "cannot fit"),
    # Cut inside the tensor data: the classic interrupted download.
    ("truncated tensor data", lambda p: _cut(p, p.stat().st_size - 100), "truncated GGUF"),
    # Shorter than the fixed header.
    ("tiny file", lambda p: _cut(p, 10), "shorter than a GGUF header"),
    # An empty file.
    ("empty file", lambda p: _cut(p, 0), "shorter than a GGUF header"),
    # A tensor with an impossible number of dimensions.
    ("too many dims", lambda p: patch(p, _tensor_info_start(p) + 8 + len(b"token_embd.weight"), "<I", 9), "dimensions"),
    # A tensor with a ggml type that does not exist.
    ("bad tensor type", lambda p: patch(p, _tensor_info_start(p) + 8 + 17 + 4 + 16, "<I", 250), "unknown type 250"),
    # A tensor offset that is not aligned (data would be read at the wrong place).
    ("unaligned offset", lambda p: patch(p, _tensor_info_start(p) + 8 + 17 + 4 + 16 + 4, "<Q", 3), "not aligned"),
]


@pytest.mark.parametrize("damage, fragment", [(d, f) for _, d, f in HOSTILE], ids=[c[0] for c in HOSTILE])
def test_hostile_files_are_rejected_with_one_line(tiny: Path, damage, fragment: str, capsys) -> None:
    damage(tiny)
    with pytest.raises(BadInput) as err:
        read_gguf(tiny)
    assert fragment in str(err.value)
    assert "\n" not in str(err.value)
    # The CLI turns it into exit 2 and one line on stderr, no traceback.
    code = cli(["inspect", str(tiny)])
    captured = capsys.readouterr()
    assert code == 2
    assert captured.err.count("\n") == 1 and captured.err.startswith("edgerun: ")
    assert "Traceback" not in captured.err


def test_duplicate_key_is_rejected(tmp_path: Path) -> None:
    # Two keys of the same length, so renaming the second to the first shifts no byte: the file stays well-formed
    # in every other way, and the only possible refusal is the duplicate.
    path = write_tiny(tmp_path / "dup.gguf", extra={"general.aaaa": "x", "general.bbbb": "y"})
    assert read_gguf(path).metadata["general.bbbb"] == "y"
    data = path.read_bytes()
    assert data.count(b"general.bbbb") == 1
    path.write_bytes(data.replace(b"general.bbbb", b"general.aaaa"))
    with pytest.raises(BadInput) as err:
        read_gguf(path)
    assert str(err.value) == f"{path}: not a valid GGUF file: duplicate metadata key 'general.aaaa'"


def test_duplicate_tensor_is_rejected(tmp_path: Path) -> None:
    path = write_tiny(tmp_path / "dupt.gguf")
    data = path.read_bytes().replace(b"blk.1.attn_q.weight", b"blk.0.attn_q.weight")
    path.write_bytes(data)
    with pytest.raises(BadInput, match="duplicate tensor 'blk.0.attn_q.weight'"):
        read_gguf(path)


def test_missing_and_directory_paths(tmp_path: Path) -> None:
    with pytest.raises(BadInput, match="no such file"):
        read_gguf(tmp_path / "nope.gguf")
    with pytest.raises(BadInput, match="not a regular file"):
        read_gguf(tmp_path)


def test_a_fifo_swapped_in_after_the_check_is_refused_not_waited_on(tmp_path: Path, monkeypatch) -> None:
    """The path is checked, then opened: a FIFO put in its place between the two must not block the reader.
    The swap is simulated by having stat() still report the regular file that was there when it was checked."""
    regular = write_tiny(tmp_path / "tiny.gguf")
    fifo = tmp_path / "swapped.gguf"
    os.mkfifo(fifo)
    real_stat = os.stat

    def stat(p, *args, **kwargs):
        named = isinstance(p, (str, os.PathLike)) and Path(p) == fifo
        return real_stat(regular if named else p, *args, **kwargs)

    monkeypatch.setattr(os, "stat", stat)
    result: dict[str, str] = {}

    def read() -> None:
        try:
            read_gguf(fifo)
        except BadInput as exc:
            result["error"] = str(exc)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    reader.join(10)
    if reader.is_alive():
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))  # a writer releases the blocked open, then the thread ends
        reader.join(5)
        pytest.fail("read_gguf blocked opening a FIFO that replaced the checked file")
    assert result["error"] == f"{fifo}: is a FIFO, not a regular file; give a regular file"


def test_an_encoded_surrogate_in_a_string_is_refused(tmp_path: Path) -> None:
    # UTF-8 bytes of a lone surrogate (U+D800): a lenient decoder would hand on a str that later fails to encode
    # (printing it, passing a chat template to llama.cpp). Same length as the text it replaces, so no offset moves.
    path = write_tiny(tmp_path / "surrogate.gguf", extra={"general.name": "QQQ"})
    path.write_bytes(path.read_bytes().replace(b"QQQ", b"\xed\xa0\x80"))
    with pytest.raises(BadInput, match=r"value of 'general.name' is not valid UTF-8$"):
        read_gguf(path)
