"""End to end on tiny checkpoints: bundle contents, reports, install, inspect, progress, the Python API."""

from __future__ import annotations

import hashlib
import io
import json
import subprocess
import sys
from pathlib import Path

import pytest

from apps.cli import main as cli
from converters.llm import ConvertOptions, Quant, convert
from converters.llm.progress import Progress
from runtime.bundle.manifest import read_manifest_dir, verify_dir
from runtime.bundle.store import Store

QUALITY_KEYS = {"ppl_f16", "ppl_quant", "kl_mean", "kl_p99", "kl_max", "top1_agreement", "tokens", "max_kl", "passed"}


@pytest.mark.parametrize("spec_id,quant", [
    # Each architecture once, each llama.cpp quant type once (q4_k_m falls back per tensor on 64-wide rows).
    ("llama-smollm", "q8_0"),
    ("llama3", "q4_k_m"),
    ("qwen2", "q4_0"),
    ("gemma3", "q8_0"),
    ("llama-spm", "f16"),
])
def test_cli_writes_a_checked_bundle_directory(spec_id, quant, tiny_root: Path, tmp_path: Path, capsys) -> None:
    out = tmp_path / "bundle"
    rc = cli(["convert", "llm", str(tiny_root / spec_id), "--quant", quant, "--out", str(out), "--name", "tiny",
              "--max-kl", "5", "--json"])
    captured = capsys.readouterr()
    assert rc == 0, captured.err
    assert captured.err == ""  # not a terminal: no bars, no llama.cpp chatter
    result = json.loads(captured.out)
    manifest = read_manifest_dir(out)
    verify_dir(out, manifest)
    assert {f.role: f.path for f in manifest.files} == {"weights": "model.gguf", "report": "quality.json", "plot": "quality-kl.png"}
    assert manifest.llm.quantization == quant.upper() and manifest.llm.chat_template
    quality = manifest.reports["quality"]
    assert QUALITY_KEYS <= set(quality) and quality == result["quality"] and quality["passed"] is True
    assert 0 < quality["top1_agreement"] <= 1 and quality["ppl_quant"] > 1
    assert quality["kl_mean"] > 0 if quant != "f16" else quality["kl_mean"] == 0
    per_token = json.loads((out / "quality.json").read_text())["kl_per_token"]
    assert len(per_token) == quality["tokens"] and max(per_token) == pytest.approx(quality["kl_max"], rel=1e-5)
    assert (out / "quality-kl.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bundle"]  # no temp files left


def test_transport_file_installs_and_inspect_shows_the_report(tiny_root: Path, tmp_path: Path, capsys) -> None:
    out = tmp_path / "tiny-q8.edgerun"
    assert cli(["convert", "llm", str(tiny_root / "qwen2"), "--quant", "q8_0", "--out", str(out), "--version", "1.0"]) == 0
    capsys.readouterr()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tiny-q8.edgerun"]
    installed = Store(tmp_path / "store").install(out)
    assert installed.manifest.reports["quality"]["tokens"] > 100
    assert cli(["inspect", str(installed.directory)]) == 0
    text = capsys.readouterr().out
    assert "report quality" in text and "kl_mean" in text


def test_f16_is_measured_against_itself(tiny_root: Path, tmp_path: Path) -> None:
    # F16 is the reference: no quantization step and, by construction, zero drift.
    result = convert(ConvertOptions(tiny_root / "llama3", tmp_path / "f16", Quant.F16))
    assert "quantize" not in result.stages
    assert result.report.kl_mean == 0 and result.report.top1_agreement == 1
    assert result.report.ppl_f16 == result.report.ppl_quant


def test_own_eval_text_and_default_names(tiny_root: Path, tmp_path: Path) -> None:
    text = tmp_path / "eval.txt"
    text.write_text("Ein kurzer Text. 短いテキスト。 A short text, repeated. " * 20)
    result = convert(ConvertOptions(tiny_root / "llama-smollm", tmp_path / "out", Quant.Q8_0, eval_text=text, eval_ctx=64))
    assert result.manifest.ref == "llama-smollm@q8_0"
    assert result.report.ctx == 64
    assert result.report.eval_text_sha256 == hashlib.sha256(text.read_bytes()).hexdigest()


def test_progress_draws_only_when_asked() -> None:
    stream = io.StringIO()  # not a TTY
    with Progress("tensors", 4, stream=stream) as bar:
        bar.advance(4)
    assert stream.getvalue() == ""
    with Progress("tensors", 4, enabled=True, stream=stream) as bar:
        bar.advance(2)
    assert "tensors" in stream.getvalue() and "100.0%" in stream.getvalue()


def test_runtime_and_converter_import_no_torch() -> None:
    # The runtime must never import torch/transformers; the converter only in its parity helpers.
    code = ("import sys, runtime.llm.model, apps.cli, converters.llm.pipeline, apps.cli.convert_llm; "
            "bad = [m for m in ('torch', 'transformers', 'safetensors', 'matplotlib') if m in sys.modules]; "
            "print(bad); sys.exit(1 if bad else 0)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_missing_matplotlib_names_the_extra(tiny_root: Path, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # as if not installed
    from runtime.errors import MissingDependency

    with pytest.raises(MissingDependency, match=r"pip install 'edgerun\[convert\]'"):
        convert(ConvertOptions(tiny_root / "llama-smollm", tmp_path / "out", Quant.Q8_0))
    assert list(tmp_path.iterdir()) == []
