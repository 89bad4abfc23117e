"""Hostile manifests: every one is refused at parse time with one line, before any backend sees it."""

from __future__ import annotations

import copy
import hashlib
import json
from pathlib import Path

import pytest

from apps.cli import main as cli
from runtime.bundle.manifest import MANIFEST, Manifest
from runtime.errors import BadInput
from tests.ggufgen import write_tiny

SHA = "0" * 64
VISION = {"format": "edgerun.bundle", "schema_version": 1, "kind": "vision", "backend": "ort", "model_format": "onnx",
          "name": "m", "version": "1", "license": "MIT", "files": [{"path": "model.onnx", "sha256": SHA, "size": 1}],
          "vision": {"size": 224, "mean": [1, 2, 3], "std": [4], "input": {"dtype": "int8", "scale": 0.5, "zero_point": -3}},
          "source": {"file": "m.pt"}, "reports": {"accuracy": {"agreement": 0.99}}}
LLM = {"format": "edgerun.bundle", "schema_version": 1, "kind": "llm", "backend": "llamacpp", "model_format": "gguf",
       "name": "m", "version": "1", "files": [{"path": "model.gguf", "sha256": SHA, "size": 1}],
       "llm": {"architecture": "llama", "context_length": 2048, "sampling": {"temperature": 0.2, "top_k": 40}}}


def _raw(base: dict, path: str, text: str) -> bytes:
    """``base`` as JSON with the value at ``path`` (dotted, list indexes as numbers) replaced by raw JSON ``text``."""
    data = copy.deepcopy(base)
    *parents, last = path.split(".")
    node = data
    for key in parents:
        node = node[int(key)] if isinstance(node, list) else node[key]
    node[int(last) if isinstance(node, list) else last] = "@RAW@"
    return json.dumps(data).replace('"@RAW@"', text).encode()


# (base, where, raw JSON value, fragment of the error). Each case is a class of hostile JSON text.
HOSTILE_JSON = [
    # nesting past the interpreter's stack: json.loads raised RecursionError (also in `edgerun list`)
    (VISION, "source.file", "[" * 100_000 + "]" * 100_000, "more than 32 levels deep"),
    # nesting that parses but is deep enough to break a later recursive walk (to_json's encoder): accepted before
    (VISION, "source.file", "[" * 600 + "]" * 600, "more than 32 levels deep"),
    # a 4,300-digit integer: int() refuses it with a ValueError
    (VISION, "files.0.size", "9" * 4300, "an integer of 4300 digits is out of range"),
    # 21 digits is past any size or count a manifest holds (2^64 has 20)
    (VISION, "vision.arena_bytes", "1" + "0" * 20, "an integer of 21 digits is out of range"),
    # NaN and Infinity are not JSON, but Python's json accepted them: mean NaN gave `nan%` scores
    (VISION, "vision.mean", "[NaN, 0, 0]", "NaN is not a number a manifest may hold"),
    (VISION, "vision.std", "Infinity", "Infinity is not a number a manifest may hold"),
    (VISION, "vision.input.scale", "NaN", "NaN is not a number a manifest may hold"),
    (LLM, "llm.sampling.temperature", "NaN", "NaN is not a number a manifest may hold"),
    # ... and anywhere else: a report or the source is printed and re-serialized
    (VISION, "reports.accuracy.agreement", "-Infinity", "-Infinity is not a number a manifest may hold"),
    # a number JSON allows whose float is inf
    (VISION, "vision.mean", "1e400", "the number 1e400 is out of the float range"),
    # A \u escape of half a surrogate pair parses to a str that no UTF-8 encode takes: accepted before, then a
    # UnicodeEncodeError traceback in `edgerun list` (the license) and in chat (the template handed to llama.cpp).
    # Strings and keys, at any depth, in fields the runtime reads and in those it only prints.
    (VISION, "license", '"MIT\\udc80"', "the string at license is not text: it holds a lone surrogate '\\udc80'"),
    (LLM, "llm.chat_template", '"{{ messages }}\\ud800"', "the string at llm.chat_template is not text"),
    (VISION, "reports.accuracy", '{"notes": ["ok", "\\udfff"]}', "the string at reports.accuracy.notes[1] is not text"),
    (VISION, "source", '{"a\\ud800": 1}', "the key at source.a\\ud800 is not text"),
]


@pytest.mark.parametrize("base, where, text, message", HOSTILE_JSON, ids=[f"{w}={t[:12]}" for _, w, t, _ in HOSTILE_JSON])
def test_hostile_json_is_refused_with_one_line(base: dict, where: str, text: str, message: str) -> None:
    with pytest.raises(BadInput) as exc:
        Manifest.from_bytes(_raw(base, where, text), "bundle")
    assert str(exc.value).startswith("bundle: manifest.json") and message in str(exc.value)
    assert "\n" not in str(exc.value)


def _set(base: dict, path: str, value) -> dict:
    data = copy.deepcopy(base)
    *parents, last = path.split(".")
    node = data
    for key in parents:
        node = node[int(key)] if isinstance(node, list) else node[key]
    node[last] = value
    return data


# (base, where, value, fragment of the error). Each case is a value of the wrong type or past what a backend takes.
HOSTILE_VALUES = [
    # a number as a string: TypeError in the sampler, after llama.cpp had loaded (and the backend was not closed)
    (LLM, "llm.sampling.temperature", "0.7", "manifest llm.sampling.temperature must be a finite number >= 0"),
    # past int32_t: a ctypes error, or accepted and wrapped
    (LLM, "llm.sampling.top_k", 2**40, "manifest llm.sampling.top_k 1099511627776 is not valid: use an integer in [0, 2147483647]"),
    # JSON true is not an integer
    (LLM, "llm.sampling.max_tokens", True, "manifest llm.sampling.max_tokens must be an integer"),
    (LLM, "llm.sampling.seed", 2**32, "manifest llm.sampling.seed 4294967296 is not valid"),
    # a misspelt setting was silently ignored
    (LLM, "llm.sampling.temprature", 0.5, "unknown setting 'temprature' (valid: max_tokens, temperature,"),
    (LLM, "llm.sampling", [], "manifest llm.sampling must be an object"),
    # llama.cpp's context fields are 32-bit
    (LLM, "llm.context_length", 2**32, "context_length 4294967296 must be in [1, 2147483647] tokens"),
    # a format no backend loads, and a format the named backend does not load
    (VISION, "model_format", "pickle", "model_format 'pickle' is not valid (valid: gguf, tflite, onnx, null)"),
    (VISION, "model_format", "tflite", "backend 'ort' loads onnx models, not model_format 'tflite'"),
    # str() of anything was taken for a string
    (VISION, "license", {"spdx": "MIT"}, "field 'license' must be str, got dict"),
    (LLM, "llm.quantization", 4, "field 'quantization' must be str, got int"),
    # bool("false") is True: the softmax would silently flip
    (VISION, "vision.output_is_logits", "false", "field 'output_is_logits' must be true or false, got str"),
    # a source or report that is not an object was silently dropped
    (VISION, "source", ["m.pt"], "field 'source' must be an object, got list"),
    (VISION, "reports", "good", "field 'reports' must be an object, got str"),
    # finite numbers only, also when a caller builds the dict itself
    (VISION, "vision.std", [float("nan")], "std must be 1 or 3 numbers, all finite"),
    (VISION, "vision.mean", [10**400], "mean must be 1 or 3 numbers, all finite"),
    (VISION, "vision.input.scale", float("inf"), "scale inf must be a finite number >= 0"),
    # a zero point int8 cannot hold
    (VISION, "vision.input.zero_point", 1000, "zero_point 1000 must be an integer in [-128, 127] for int8"),
    (VISION, "vision.arena_bytes", 2**64, "arena_bytes 18446744073709551616 must be an integer in [0, 9223372036854775807]"),
    # a file's role was str()-ed: a list became the role "['weights']", and any length or character went through
    (VISION, "files.0.role", ["weights"], "manifest files[0]: field 'role' must be str, got list"),
    (VISION, "files.0.role", 7, "field 'role' must be str, got int"),
    (VISION, "files.0.role", "w" * 4096, "role 'wwww"),
    (VISION, "files.0.role", "weights\n", "role 'weights\\n' is not valid: use 1-32 of a-z 0-9 _ - starting with a letter"),
    (VISION, "files.0.role", "", "role '' is not valid"),
    (VISION, "files.0.role", "\x1b[2J", "role '\\x1b[2J' is not valid"),
]


@pytest.mark.parametrize("base, where, value, message", HOSTILE_VALUES, ids=[f"{w}={v!r:.16}" for _, w, v, _ in HOSTILE_VALUES])
def test_hostile_values_are_refused_at_parse_time(base: dict, where: str, value, message: str) -> None:
    with pytest.raises(BadInput) as exc:
        Manifest.from_dict(_set(base, where, value))
    assert message in str(exc.value) and "\n" not in str(exc.value)


def test_good_manifests_round_trip() -> None:
    for base in (VISION, LLM):
        manifest = Manifest.from_bytes(json.dumps(base).encode(), "bundle")
        assert Manifest.from_bytes(manifest.to_json(), "bundle") == manifest
    assert Manifest.from_dict(LLM).llm.sampling == {"temperature": 0.2, "top_k": 40}
    # A whole surrogate pair is one character outside the BMP, and text: accepted.
    emoji = Manifest.from_bytes(_raw(VISION, "license", '"MIT \\ud83d\\ude00"'), "bundle")
    assert emoji.license == "MIT \U0001f600"
    # A writer that put NaN in a report would make a bundle no reader installs: refused when written instead.
    with pytest.raises(ValueError, match="Out of range float values"):
        Manifest.from_dict(_set(VISION, "reports", {"latency_ratio": float("nan")})).to_json()


def _bundle(directory: Path, manifest: dict, weights: bytes) -> Path:
    directory.mkdir()
    name = manifest["files"][0]["path"]
    (directory / name).write_bytes(weights)
    manifest = _set(manifest, "files", [{"path": name, "sha256": hashlib.sha256(weights).hexdigest(), "size": len(weights)}])
    (directory / MANIFEST).write_text(json.dumps(manifest))
    return directory


def test_run_refuses_a_bad_sampling_default_before_loading(tmp_path: Path, capsys) -> None:
    # Before: nothing looked at the value until after llama.cpp had loaded the model (with a real model, a TypeError
    # traceback from the sampler; this tiny GGUF llama.cpp refuses to load, exit 6). Now the manifest is refused first.
    gguf = write_tiny(tmp_path / "tiny.gguf").read_bytes()
    bundle = _bundle(tmp_path / "b", _set(LLM, "llm.sampling.top_k", "40"), gguf)
    code = cli(["run", str(bundle), "--prompt", "x", "--memory", "1G"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "Traceback" not in err
    assert "manifest llm.sampling.top_k must be an integer" in err


# What a hostile author puts in a printed string: ANSI (clear screen, window title), a carriage return that
# hides what came before, NUL, DEL, a C1 control, a bidi override that reorders the line, a line separator.
HOSTILE_TEXT = "MIT\x1b[2J\x1b]0;owned\x07\rApache\x00\x7f\x9b31m\u202eTIM\u2028x"
ESCAPED = r"MIT\x1b[2J\x1b]0;owned\x07\rApache\x00\x7f\x9b31m\u202eTIM\u2028x"


def test_inspect_escapes_control_characters(tmp_path: Path, capsys) -> None:
    manifest = _set(VISION, "license", HOSTILE_TEXT)
    manifest = _set(manifest, "source", {"file": HOSTILE_TEXT})
    manifest = _set(manifest, "reports", {"accuracy": {"note": HOSTILE_TEXT}, "summary": HOSTILE_TEXT})
    bundle = _bundle(tmp_path / "b", manifest, b"weights")
    assert cli(["inspect", str(bundle)]) == 0
    out = capsys.readouterr().out
    assert f"license: {ESCAPED}" in out and f"source: file={ESCAPED}" in out
    assert f"note = {ESCAPED}" in out and f"report summary: {ESCAPED}" in out
    assert not any(ch in out for ch in "\x1b\x07\r\x00\x7f\x9b\u202e\u2028")


def test_printable_leaves_ordinary_text_alone() -> None:
    from apps.cli.terminal import printable

    assert printable("Café Zürich 日本, Apache-2.0 (c) 2024") == "Café Zürich 日本, Apache-2.0 (c) 2024"
    assert printable({"note": "a\x1b"}) == "{'note': 'a\\x1b'}"  # containers print their items' repr: escaped once


def test_inspect_escapes_gguf_strings(tmp_path: Path, capsys) -> None:
    # A bare GGUF: the license and every metadata string come from the file's author.
    path = write_tiny(tmp_path / "tiny.gguf", extra={"general.license": HOSTILE_TEXT, "general.name": HOSTILE_TEXT})
    assert cli(["inspect", str(path)]) == 0
    out = capsys.readouterr().out
    assert f"license: {ESCAPED}" in out and f"general.name = {ESCAPED}" in out
    assert not any(ch in out for ch in "\x1b\x07\r\x00\x7f\x9b\u202e\u2028")


def test_list_escapes_the_license(store, tmp_path: Path, capsys) -> None:
    # `edgerun list` printed each installed manifest's license raw.
    store.install(_bundle(tmp_path / "b", _set(VISION, "license", HOSTILE_TEXT), b"weights"))
    assert cli(["list"]) == 0
    out = capsys.readouterr().out
    assert out.rstrip("\n").endswith(f"  {ESCAPED}") and out.count("\n") == 1
    assert not any(ch in out for ch in "\x1b\x07\r\x00\x7f\x9b\u202e\u2028")


# A label cannot hold a line break (the labels file is split into lines), but every other control character it can.
HOSTILE_LABEL = "cat\x1b[2J\x1b]0;owned\x07\x00\x7f\x9b31m\u202etac"
ESCAPED_LABEL = r"cat\x1b[2J\x1b]0;owned\x07\x00\x7f\x9b31m\u202etac"


def test_classifier_labels_are_escaped(tmp_path: Path, capsys) -> None:
    # `edgerun run` printed the bundle's label text raw under each input.
    from PIL import Image

    from tests.runtime.test_null_backend import null_bundle

    bundle = null_bundle(tmp_path / "b")
    labels = "".join(f"{HOSTILE_LABEL}{i}\n" for i in range(10)).encode()
    (bundle / "labels.txt").write_bytes(labels)
    manifest = json.loads((bundle / MANIFEST).read_text())
    manifest["files"][1].update(sha256=hashlib.sha256(labels).hexdigest(), size=len(labels))
    (bundle / MANIFEST).write_text(json.dumps(manifest))
    Image.new("RGB", (8, 8)).save(tmp_path / "in.png")
    assert cli(["run", str(bundle), "--input", str(tmp_path / "in.png"), "--top", "3"]) == 0
    out = capsys.readouterr().out
    assert out.count(ESCAPED_LABEL) == 3
    assert not any(ch in out for ch in "\x1b\x07\x00\x7f\x9b\u202e")
