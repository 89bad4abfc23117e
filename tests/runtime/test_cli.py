"""The CLI in-process: data on stdout, one line on stderr for errors, meaningful exit codes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from apps.cli import main as cli
from tests.ggufgen import write_tiny

RUN_FIELDS = {"text", "tokens_in", "tokens_out", "ttft_ms", "prefill_tps", "decode_tps", "peak_rss_bytes", "n_ctx",
              "kv_type", "truncated", "prefix_cache_hit", "placement", "plan", "seed"}


def _one_line_error(capsys, code: int, expected: int, fragment: str) -> None:
    err = capsys.readouterr().err
    assert code == expected, err
    assert fragment in err, err
    assert err.count("\n") == 1 and "Traceback" not in err


def test_run_json_has_every_field(smollm, capsys) -> None:
    code = cli(["run", "default", "--prompt", "Hello", "--max-tokens", "6", "--temperature", "0", "--memory", "1G", "--json"])
    out = capsys.readouterr().out
    assert code == 0
    data = json.loads(out)
    assert RUN_FIELDS <= set(data)
    assert data["tokens_out"] == 6 and data["kv_type"] == "f16" and data["placement"]["backend"] == "llamacpp"  # 1G: the f16 plan
    assert data["plan"]["fits"] is True


def test_run_streams_text_and_reports_placement(smollm, capsys) -> None:
    code = cli(["run", "default", "--prompt", "1, 2, 3,", "--max-tokens", "8", "--temperature", "0", "--memory", "1G"])
    captured = capsys.readouterr()
    assert code == 0 and captured.out.lstrip().startswith("4, 5"), captured.out  # greedy: the count goes on
    assert "placement: llamacpp on cpu" in captured.err


def test_plan_json_fields(smollm, capsys) -> None:
    assert cli(["plan", "default", "--memory", "512M", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    for key in ("weights_bytes", "kv_bytes", "compute_bytes", "prefix_cache_bytes", "runtime_bytes", "total_bytes",
                "n_ctx", "kv_type", "fits", "budget_bytes"):
        assert key in data
    terms = ("weights_bytes", "kv_bytes", "compute_bytes", "prefix_cache_bytes", "runtime_bytes", "vocab_bytes")
    assert data["total_bytes"] == sum(data[k] for k in terms)
    assert data["total_bytes"] + data["reserve_bytes"] <= data["budget_bytes"] == 512 << 20


def test_plan_shrinks_context_then_kv_type_to_fit(smollm, capsys) -> None:
    assert cli(["plan", "default", "--memory", "1G", "--json"]) == 0
    roomy = json.loads(capsys.readouterr().out)
    assert (roomy["n_ctx"], roomy["kv_type"]) == (8192, "f16")  # the first choice, when it fits
    assert cli(["plan", "default", "--memory", "300M", "--json"]) == 0
    tight = json.loads(capsys.readouterr().out)
    assert tight["fits"] and (tight["n_ctx"], tight["kv_type"]) != (8192, "f16")
    # it had to shrink: the first choice does not fit 300M ...
    assert cli(["plan", "default", "--memory", "300M", "--ctx", "8192", "--kv-type", "f16"]) == 3
    # ... and it shrank no further than it had to: 256 more cells, same KV type and micro-batch, do not fit
    from runtime.errors import DoesNotFit
    from runtime.formats.gguf_file import read_gguf
    from runtime.llm.plan import KVType, plan_llm

    with pytest.raises(DoesNotFit):
        plan_llm(read_gguf(smollm.path()), 300 << 20, ctx=tight["n_ctx"] + 256, kv_type=KVType(tight["kv_type"]),
                 n_ubatch=tight["n_ubatch"])


# Bad input: (argv, exit code, fragment of the one-line error). Each case is a mistake a user makes.
BAD = [
    (["run", "no-such-model", "--prompt", "x"], 2, "unknown model 'no-such-model'"),
    (["run", "default@9.9", "--prompt", "x"], 2, "no version '9.9'"),
    (["run", "/nonexistent/model.gguf", "--prompt", "x"], 2, "no such file"),
    (["run", "default", "--prompt", "x", "--memory", "lots"], 2, "argument --memory: 'lots' is not a size"),
    (["run", "default", "--prompt", "x", "--temperature", "-1"], 2, "argument --temperature: '-1' is out of range"),
    (["run", "default", "--prompt", "x", "--threads", "0"], 2, "argument --threads: '0' is out of range"),
    (["run", "default", "--prompt", "x", "--target", "tpu"], 2, "valid targets: cpu, gpu, npu, auto"),
    (["run", "default", "--prompt", "x", "--target", "gpu", "--require-accelerator"], 5, "require-accelerator"),
    (["plan", "default", "--memory", "64M"], 3, "the weights alone need"),
    (["plan", "default", "--memory", "230M", "--ctx", "8192"], 3, "largest context that fits"),
    (["plan", "default", "--ctx", "100000"], 2, "exceeds the model's training context 8192"),
    (["run", "default", "--prompt", ""], 2, "--prompt is missing or empty"),
    (["frobnicate"], 2, "unknown command 'frobnicate'"),
]


@pytest.mark.parametrize("argv, code, fragment", BAD, ids=[" ".join(b[0][:2]) + f" #{i}" for i, b in enumerate(BAD)])
def test_bad_input_gets_one_line_and_an_exit_code(smollm, argv, code, fragment, capsys) -> None:
    _one_line_error(capsys, cli(argv), code, fragment)


def test_not_gguf_and_damaged_files(tmp_path: Path, capsys) -> None:
    text = tmp_path / "notes.gguf"
    text.write_text("this is not a model\n" * 10)
    _one_line_error(capsys, cli(["run", str(text), "--prompt", "x"]), 2, "not a GGUF file")
    tiny = write_tiny(tmp_path / "cut.gguf")
    tiny.write_bytes(tiny.read_bytes()[:-64])
    _one_line_error(capsys, cli(["run", str(tiny), "--prompt", "x"]), 2, "truncated GGUF")


def test_bare_gguf_is_wrapped_with_its_checksum(smollm, capsys) -> None:
    assert cli(["inspect", str(smollm.path()), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["origin"] == "gguf"
    assert data["manifest"]["files"][0]["sha256"] == smollm.manifest.files[0].sha256
    assert data["manifest"]["llm"]["architecture"] == "llama"


def test_inspect_shows_manifest_and_license(smollm, capsys) -> None:
    assert cli(["inspect", "default"]) == 0
    out = capsys.readouterr().out
    assert "smollm2-135m-instruct@q4_1-0.1.2" in out and "Apache-2.0" in out and "chat template: yes" in out


def test_chat_reads_turns_from_stdin(smollm, capsys, monkeypatch) -> None:
    import io

    monkeypatch.setattr("sys.stdin", io.StringIO("Say hello.\n/quit\n"))
    assert cli(["chat", "default", "--max-tokens", "8", "--memory", "1G", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["tokens_out"] >= 1 and data["text"]
