"""GGUF contents that llama.cpp or the memory plan would trip on are refused by the reader, as one line.

Each hostile file is a valid GGUF container (written by llama.cpp's own gguf writer, then patched byte by byte where
a value is out of the writer's reach), so only the content checks can refuse it.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from gguf import GGUFValueType, GGUFWriter

from apps.cli import main as cli
from runtime.errors import BadInput
from runtime.formats.gguf_file import read_gguf
from tests.ggufgen import set_scalar, write_tiny

VOCAB = 32
ROOT = Path(__file__).resolve().parents[2]
T = GGUFValueType


def _kv(key: str, value, vtype: GGUFValueType, sub: GGUFValueType | None = None):
    return lambda w: w.add_key_value(key, value, vtype, sub)


def _bpe(merges: list[str] | None):
    """A gpt2 (BPE) vocabulary: the tiny file's tokens plus the given merges (None: no merges key at all)."""
    return {"tokenizer": "gpt2", "edit": None if merges is None else _kv("tokenizer.ggml.merges", merges, T.ARRAY, T.STRING)}


# (id, write_tiny arguments, a fragment of the one-line refusal). The comment on each says which failure it stands for.
HOSTILE = [
    # llama.cpp reads scores and token types through a raw pointer, one per token: a short array is read past its end.
    ("scores shorter than tokens", {"edit": _kv("tokenizer.ggml.scores", [0.0] * (VOCAB - 1), T.ARRAY, T.FLOAT32)},
     "tokenizer.ggml.scores has 31 entries for 32 tokens"),
    ("token types longer than tokens", {"edit": _kv("tokenizer.ggml.token_type", [1] * (VOCAB + 5), T.ARRAY, T.INT32)},
     "tokenizer.ggml.token_type has 37 entries for 32 tokens"),
    # An array of another element type than the pointer llama.cpp casts it to (bytes read as int32).
    ("token types as bytes", {"edit": _kv("tokenizer.ggml.token_type", [1] * VOCAB, T.ARRAY, T.UINT8)},
     "tokenizer.ggml.token_type is an array of uint8, not of int32"),
    ("scores as a scalar", {"edit": _kv("tokenizer.ggml.scores", 1.0, T.FLOAT32)}, "tokenizer.ggml.scores is a float32, not an array"),
    # Special-token ids past the vocabulary: the classic off-by-one, a -1 stored unsigned, a FIM id of another model.
    ("bos id = vocabulary size", {"edit": _kv("tokenizer.ggml.bos_token_id", VOCAB, T.UINT32)},
     "tokenizer.ggml.bos_token_id is 32, not a token id of the 32-token vocabulary (0..31)"),
    ("eos id = -1 unsigned", {"edit": _kv("tokenizer.ggml.eos_token_id", 2**32 - 1, T.UINT32)}, "eos_token_id is 4294967295"),
    ("fim id out of range", {"edit": _kv("tokenizer.ggml.fim_pre_token_id", 151659, T.UINT32)}, "fim_pre_token_id is 151659"),
    ("seperator id negative", {"edit": _kv("tokenizer.ggml.seperator_token_id", -3, T.INT32)}, "seperator_token_id is -3"),
    ("padding id a string", {"edit": _kv("tokenizer.ggml.padding_token_id", "0", T.STRING)}, "padding_token_id is '0'"),
    # Token texts: llama.cpp maps each text to one id and GGML_ASSERTs one entry per token, so a repeat aborts the
    # process (test_llama_cpp_aborts_on_what_the_reader_refuses). It keys a token by its text up to the first NUL
    # byte, and an empty text by "[EMPTY_<id>]": a repeat in either form aborts the same way.
    ("repeated token text", {"tokens": {1: b"t2"}}, "tokenizer.ggml.tokens[1] and [2] are both b't2' as llama.cpp reads them"),
    ("repeated token past the kept-array size", {"vocab": 600, "tokens": {599: b"t7"}}, "tokenizer.ggml.tokens[7] and [599]"),
    ("empty token named like another", {"tokens": {5: b"", 9: b"[EMPTY_5]"}}, "tokens[5] and [9] are both b'[EMPTY_5]'"),
    ("token text cut at a NUL byte", {"tokens": {3: b"t4\x00x"}}, "tokenizer.ggml.tokens[3] and [4] are both b't4'"),
    # Merges: llama.cpp splits each at its first space after byte 0; anything else is a pair no token can match.
    ("merge without a space", _bpe(["t1 t2", "t1t2"]), "tokenizer.ggml.merges[1] is b't1t2'"),
    ("merge with an empty half", _bpe(["t1 "]), "tokenizer.ggml.merges[0] is b't1 '"),
    ("merge with a leading space", _bpe([" t1 t2"]), "merges[0] is b' t1 t2'"),
    ("merge of three parts", _bpe(["t1 t2 t3"]), "not two non-empty parts separated by one space"),
    ("merges past the kept-array size", _bpe(["t1 t2"] * 600 + ["bad"]), "tokenizer.ggml.merges[600] is b'bad'"),
    ("merges as integers", {"tokenizer": "gpt2", "edit": _kv("tokenizer.ggml.merges", [1, 2], T.ARRAY, T.INT32)},
     "merges is an array of int32, not of strings"),
    ("BPE without merges", _bpe(None), "BPE vocabulary (tokenizer.ggml.model 'gpt2') without tokenizer.ggml.merges"),
    # Architecture numbers against the tensors the file holds.
    ("more layers than tensors", {"patch": ("llama.block_count", 3)},
     "llama.block_count is 3 but the file holds tensors for 2 layers (blk.0..blk.1)"),
    ("fewer layers than tensors", {"patch": ("llama.block_count", 1)}, "block_count is 1 but the file holds tensors for 2 layers"),
    ("zero layers", {"patch": ("llama.block_count", 0)}, "llama.block_count is 0; valid: an integer in 1..512"),
    ("head count past every tensor", {"patch": ("llama.attention.head_count", 2**31 - 1)},
     "llama.attention.head_count is 2147483647; valid: an integer in 0..256"),
    ("feed-forward length 2^32-1", {"patch": ("llama.feed_forward_length", 2**32 - 1)}, "feed_forward_length is 4294967295"),
    ("embedding length 0", {"patch": ("llama.embedding_length", 0)}, "llama.embedding_length is 0; valid: an integer in 1..256"),
    ("embedding length not the embedding's", {"patch": ("llama.embedding_length", 32)},
     "llama.embedding_length is 32 but token_embd.weight rows are 64 wide"),
    ("sliding window negative", {"edit": _kv("llama.attention.sliding_window", -1, T.INT32)}, "sliding_window is -1"),
    ("vocabulary not the embedding's", {"embd_rows": VOCAB + 8}, "token_embd.weight has 40 rows for 32 tokens"),
    # Per-layer values must have one entry per layer (llama.cpp throws; the plan would zip them short).
    ("per-layer heads for 3 layers", {"n_head_kv": [2, 2, 2], "n_layer": 2}, "head_count_kv has 3 entries for 2 layers"),
    # The KV cache is planned from head_count_kv x key_length: the K projection must agree.
    ("KV heads not the K projection's", {"kv_tensors": True, "patch": ("llama.attention.head_count_kv", 4)},
     "blk.0.attn_k.weight has 32 outputs but llama.attention.head_count_kv x key_length is 4 x 16"),
    ("key length not the K projection's", {"kv_tensors": True, "edit": _kv("llama.attention.key_length", 8, T.UINT32)},
     "blk.0.attn_k.weight has 32 outputs but llama.attention.head_count_kv x key_length is 2 x 8"),
    # llama.cpp GGML_ASSERTs these (a SIGABRT, not an error): more experts used than exist, none used, too many.
    ("experts used > experts", {"edit": lambda w: (w.add_expert_count(4), w.add_expert_used_count(8))},
     "llama.expert_used_count is 8; valid: 1..4"),
    ("experts but none used", {"edit": lambda w: w.add_expert_count(4)}, "llama.expert_used_count is 0; valid: 1..4"),
    ("experts used without experts", {"edit": lambda w: w.add_expert_used_count(2)}, "has no experts"),
]


def _write(tmp_path: Path, args: dict) -> Path:
    args = dict(args)
    patch = args.pop("patch", None)
    path = write_tiny(tmp_path / "hostile.gguf", **args)
    if patch:
        set_scalar(path, *patch)
    return path


@pytest.mark.parametrize("args, fragment", [c[1:] for c in HOSTILE], ids=[c[0] for c in HOSTILE])
def test_hostile_contents_are_refused_with_one_line(tmp_path: Path, args: dict, fragment: str, capsys) -> None:
    path = _write(tmp_path, args)
    with pytest.raises(BadInput) as err:
        read_gguf(path)
    message = str(err.value)
    assert fragment in message and message.startswith(f"{path}: ") and "\n" not in message
    assert cli(["inspect", str(path)]) == 2
    assert capsys.readouterr().err == f"edgerun: {message}\n"


def test_well_formed_contents_are_accepted(tmp_path: Path) -> None:
    """The same checks pass a file that has every checked part right: they refuse the fault, not the feature."""
    def edit(w: GGUFWriter) -> None:
        w.add_token_scores([0.0] * VOCAB)
        w.add_token_types([1] * VOCAB)
        w.add_token_merges(["t1 t2", "t3 t12"] * 300)
        for key in ("bos", "eos", "eot", "unknown", "seperator", "padding", "fim_pre"):
            w.add_uint32(f"tokenizer.ggml.{key}_token_id", VOCAB - 1)
        w.add_expert_count(8)
        w.add_expert_used_count(2)

    path = write_tiny(tmp_path / "ok.gguf", n_layer=3, tokenizer="gpt2", kv_tensors=True, n_head_kv=[2, 1, 2], edit=edit)
    info = read_gguf(path)
    assert info.arch_value("attention.head_count_kv") == [2, 1, 2]
    assert info.metadata["tokenizer.ggml.merges"].length == 600 and info.arch_value("expert_used_count") == 2


# Child process body: the CLI in-process in a fresh interpreter (a fork of this multithreaded test process could
# deadlock), its exit code and stderr written out; the address space is capped so that a plan which tries to allocate
# per-layer lists for 2**31 layers fails fast instead of swapping the machine.
_CHILD = """
import io, json, resource, sys
from pathlib import Path
with open("/proc/self/status") as f:
    vm = next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmSize:"))
resource.setrlimit(resource.RLIMIT_AS, (vm + (3 << 30), resource.RLIM_INFINITY))
from apps.cli import main
sys.stderr = io.StringIO()
try:
    code = main(json.loads(sys.argv[2]))
except BaseException as exc:  # the failure this test exists to catch: report it rather than die silently
    code = f"{type(exc).__name__}: {exc}"
Path(sys.argv[1]).write_text(json.dumps({"code": code, "stderr": sys.stderr.getvalue()}))
"""


# The three files the issue reproduced: 2**31-1 layers hung `edgerun run` past a minute, 2**32-1 layers ended in a
# MemoryError, and a training context of 2**32-1 in llama-cpp-python's "Array length must be >= 0" (int32 -1).
REPRODUCED = [
    ("block_count 2^31-1", "llama.block_count", 2**31 - 1, "llama.block_count is 2147483647; valid: an integer in 1..512"),
    ("block_count 2^32-1", "llama.block_count", 2**32 - 1, "llama.block_count is 4294967295; valid: an integer in 1..512"),
    ("context 2^32-1", "llama.context_length", 2**32 - 1, "llama.context_length is 4294967295; valid: an integer in 1..2147483647"),
]


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="the address-space guard reads /proc (Linux)")
@pytest.mark.parametrize("key, value, fragment", [c[1:] for c in REPRODUCED], ids=[c[0] for c in REPRODUCED])
def test_edgerun_run_refuses_absurd_architecture_numbers(tmp_path: Path, key: str, value: int, fragment: str) -> None:
    path = write_tiny(tmp_path / "absurd.gguf")
    set_scalar(path, key, value)
    out = tmp_path / "result.json"
    # A child interpreter runs the CLI in-process (same code path as the tests above), so that a hang can be timed out.
    argv = ["run", str(path), "--prompt", "hi", "--memory", "4G"]
    try:
        subprocess.run([sys.executable, "-c", _CHILD, str(out), json.dumps(argv)], cwd=ROOT, timeout=60, check=False)
    except subprocess.TimeoutExpired:
        pytest.fail(f"edgerun run {key}={value} still running after 60 s")
    result = json.loads(out.read_text())
    assert result["code"] == 2, result
    assert result["stderr"].startswith(f"edgerun: {path}: GGUF {fragment} (") and result["stderr"].count("\n") == 1, result


# What llama.cpp itself does with a vocabulary: the repeated texts the reader refuses abort it (SIGABRT from
# GGML_ASSERT(id_to_token.size() == token_to_id.size()), no exception a caller could catch), and texts that only
# look alike (two empty tokens are [EMPTY_5] and [EMPTY_6]; "t99\0" is "t99") load. Together they hold the reader's
# mapping to llama.cpp's own, in both directions.
VOCAB_CASES = [c for c in HOSTILE if "tokens" in c[1] and "vocab" not in c[1]]
LOOKALIKE = {5: b"", 6: b"", 7: b"\x00zz", 8: b"t99\x00"}
_LOAD = "import sys, llama_cpp; llama_cpp.Llama(sys.argv[1], vocab_only=True, verbose=False)"


def _llama_cpp_load(path: Path) -> subprocess.CompletedProcess:
    # A fresh interpreter: an abort must not take the test process with it.
    return subprocess.run([sys.executable, "-c", _LOAD, str(path)], capture_output=True, timeout=120, check=False)


@pytest.mark.parametrize("args", [c[1] for c in VOCAB_CASES], ids=[c[0] for c in VOCAB_CASES])
def test_llama_cpp_aborts_on_what_the_reader_refuses(tmp_path: Path, args: dict) -> None:
    path = _write(tmp_path, args)
    with pytest.raises(BadInput):
        read_gguf(path)
    result = _llama_cpp_load(path)
    assert result.returncode in (-signal.SIGABRT, 128 + signal.SIGABRT), (result.returncode, result.stderr[-500:])


def test_look_alike_token_texts_load_in_llama_cpp_and_are_accepted(tmp_path: Path) -> None:
    path = write_tiny(tmp_path / "lookalike.gguf", tokens=LOOKALIKE)
    assert read_gguf(path).metadata["tokenizer.ggml.tokens"][5:9] == ["", "", "\x00zz", "t99\x00"]
    result = _llama_cpp_load(path)
    assert result.returncode == 0, result.stderr[-500:]
