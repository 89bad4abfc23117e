"""Bad input: one line on stderr, a meaningful exit code, and nothing left next to the output.

Each case edits a private copy of a tiny checkpoint, runs ``edgerun convert llm``
in-process, and checks that the output's directory holds exactly what it held before.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np
import pytest

from apps.cli import main as cli


def _set_config(key: str, value):
    def edit(d: Path) -> None:
        cfg = json.loads((d / "config.json").read_text())
        cfg[key] = value
        (d / "config.json").write_text(json.dumps(cfg))
    return edit


def _poison(value: float):
    def edit(d: Path) -> None:
        from safetensors.numpy import load_file, save_file

        tensors = load_file(d / "model.safetensors")
        w = tensors["model.layers.1.mlp.up_proj.weight"].copy()
        w[3, 5] = value
        tensors["model.layers.1.mlp.up_proj.weight"] = w
        save_file(tensors, d / "model.safetensors")
    return edit


def _truncate(d: Path) -> None:
    path = d / "model.safetensors"
    path.write_bytes(path.read_bytes()[:-100])


def _huge_header(d: Path) -> None:
    path = d / "model.safetensors"
    raw = path.read_bytes()
    path.write_bytes(struct.pack("<Q", 1 << 40) + raw[8:])


def _pre_tokenizer(d: Path) -> None:
    tj = json.loads((d / "tokenizer.json").read_text())
    tj["pre_tokenizer"] = {"type": "Whitespace"}
    (d / "tokenizer.json").write_text(json.dumps(tj))


def _edit_tokenizer_json(change):
    def edit(d: Path) -> None:
        tj = json.loads((d / "tokenizer.json").read_text())
        change(tj)
        (d / "tokenizer.json").write_text(json.dumps(tj))
    return edit


def _lowercase_first(tj: dict) -> None:
    tj["normalizer"] = {"type": "Sequence", "normalizers": [{"type": "Lowercase"}, tj["normalizer"]]}


def _added_token_reuses_a_text(tj: dict) -> None:
    tj["added_tokens"][-1]["content"] = "a"  # a text the BPE vocabulary has under another id


def _sentencepiece_only(d: Path) -> None:
    (d / "tokenizer.json").unlink()
    (d / "tokenizer.model").write_bytes(b"\x0a\x00")


CASES = [
    # (id, edit of the checkpoint, extra CLI args, exit code, fragment of the one-line error[, tiny spec id])
    # No config: nothing says what the tensors are.
    ("missing-config", lambda d: (d / "config.json").unlink(), [], 2, "config.json is missing"),
    # No weights, but a PyTorch pickle: we say how to re-save it.
    ("missing-weights", lambda d: (d / "model.safetensors").rename(d / "pytorch_model.bin"), [], 2,
     "re-save it with safe_serialization=True"),
    # An architecture we have no layout for: refuse and list the ones we have.
    ("unknown-arch", _set_config("architectures", ["MambaForCausalLM"]), [], 2,
     "supported: LlamaForCausalLM, Qwen2ForCausalLM"),
    # config.json disagrees with the tensors: caught before any tensor is read.
    ("shape-mismatch", _set_config("intermediate_size", 128), [], 2, "config.json implies [128, 64]"),
    # A layer count the weights do not have.
    ("missing-layer", _set_config("num_hidden_layers", 3), [], 2, "weights lack"),
    # A NaN and an Inf in one weight: found while streaming, the partial GGUF is removed.
    ("nan-weight", _poison(float("nan")), [], 2, "NaN/Inf"),
    ("inf-weight", _poison(float("inf")), [], 2, "NaN/Inf"),
    # A truncated download: tensor extents run past the end of the file.
    ("truncated-weights", _truncate, [], 2, "truncated or damaged"),
    # A hostile header length.
    ("huge-header", _huge_header, [], 2, "header length"),
    # A tokenizer.json that is not JSON.
    ("unreadable-tokenizer", lambda d: (d / "tokenizer.json").write_text("{not json"), [], 2, "unreadable tokenizer"),
    # A pre-tokenizer llama.cpp does not implement: converting would silently tokenize differently.
    ("unknown-pre-tokenizer", _pre_tokenizer, [], 2, "matches none of gpt-2, smollm, llama-bpe, qwen2"),
    # A SentencePiece-style tokenizer.json whose normalizer also lowercases: llama.cpp's SentencePiece would not.
    ("spm-json-normalizer", _edit_tokenizer_json(_lowercase_first), [], 2,
     "does more than llama.cpp's SentencePiece tokenizer", "gemma3-json"),
    # One text under two ids: llama.cpp would abort the process while loading the vocabulary.
    ("duplicate-token-text", _edit_tokenizer_json(_added_token_reuses_a_text), [], 2, "appear more than once"),
    # A damaged SentencePiece tokenizer.model (it takes precedence over tokenizer.json).
    ("broken-sentencepiece", _sentencepiece_only, [], 2, "unreadable SentencePiece tokenizer.model"),
    # An evaluation text that is not UTF-8.
    ("bad-eval-text", lambda d: (d / "eval.txt").write_bytes(b"\xff\xfe\x00bad"), ["--eval-text", "{ckpt}/eval.txt"], 2,
     "not readable UTF-8"),
    # Gemma 3 with a global layer where llama.cpp's fixed pattern has a sliding one: refused, not mis-converted.
    ("gemma3-layer-pattern", _set_config("layer_types", ["full_attention"] * 6), [], 2, "fixed pattern", "gemma3"),
    # A negative gate makes no sense.
    ("negative-max-kl", lambda d: None, ["--max-kl", "-1"], 2, "argument --max-kl: '-1' is out of range: use a number from 0 to 100"),
    # The gate: a zero KL budget on q4_0 cannot pass; no bundle may appear.
    ("quality-gate", lambda d: None, ["--quant", "q4_0", "--max-kl", "0"], 7, "exceeds --max-kl 0.0"),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_bad_input_one_line_and_nothing_left(case, tiny_copy, tmp_path: Path, capsys) -> None:
    _, edit, extra, code, fragment, *spec_id = case
    ckpt = tiny_copy(*spec_id)
    edit(ckpt)
    outdir = tmp_path / "out"
    outdir.mkdir()
    args = [a.replace("{ckpt}", str(ckpt)) for a in extra]
    if "--quant" not in args:
        args += ["--quant", "q8_0"]
    rc = cli(["convert", "llm", str(ckpt), "--out", str(outdir / "m.edgerun"), *args])
    err = capsys.readouterr().err.strip()
    assert rc == code, err
    assert len(err.splitlines()) == 1 and fragment in err, err
    assert list(outdir.iterdir()) == []


def test_a_name_llama_cpp_refuses_stops_the_conversion(tiny_copy, tmp_path: Path, capsys, monkeypatch) -> None:
    # The check before publishing: a tokenizer.ggml.pre the pinned llama.cpp does not know ("gpt2", the name
    # this converter once wrote for a plain byte-level pre-tokenizer) ends the conversion with llama.cpp's reason.
    monkeypatch.setattr("converters.llm.vocab.pre_tokenizer_name", lambda path: "gpt2")
    outdir = tmp_path / "out"
    outdir.mkdir()
    rc = cli(["convert", "llm", str(tiny_copy()), "--quant", "q8_0", "--out", str(outdir / "m.edgerun")])
    err = capsys.readouterr().err.strip()
    assert rc == 6 and len(err.splitlines()) == 1 and "unknown pre-tokenizer type: 'gpt2'" in err, err
    assert list(outdir.iterdir()) == []


def test_existing_output_is_refused_and_untouched(tiny_copy, tmp_path: Path, capsys) -> None:
    out = tmp_path / "bundle"
    out.mkdir()
    (out / "keep").write_text("mine")
    rc = cli(["convert", "llm", str(tiny_copy()), "--quant", "q8_0", "--out", str(out)])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and "already exists" in err and len(err.splitlines()) == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bundle", "ckpt-llama-smollm"]
    assert (out / "keep").read_text() == "mine"


def test_unknown_quant_lists_the_valid_ones(tiny_copy, capsys) -> None:
    assert cli(["convert", "llm", str(tiny_copy()), "--quant", "q3_k", "--out", "x"]) == 2  # argparse's exit, returned
    err = capsys.readouterr().err
    assert "invalid choice: 'q3_k'" in err and "'q4_k_m'" in err


def test_safetensors_numbers_are_read_exactly(tiny_copy) -> None:
    # BF16 is widened by a bit shift without torch: check it against numpy float32.
    from converters.llm.safetensors_file import SafetensorsFile

    d = tiny_copy()
    values = np.array([[1.0, -2.5], [3.140625, 0.0]], np.float32)
    bf16 = (values.view(np.uint32) >> 16).astype("<u2").tobytes()
    header = json.dumps({"w": {"dtype": "BF16", "shape": [2, 2], "data_offsets": [0, 8]}}).encode()
    (d / "one.safetensors").write_bytes(struct.pack("<Q", len(header)) + header + bf16)
    with SafetensorsFile(d / "one.safetensors") as f:
        np.testing.assert_array_equal(f.read("w"), values)
