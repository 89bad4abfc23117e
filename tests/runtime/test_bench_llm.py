"""`edgerun bench` on an LLM bundle: llama-bench's pp/tg rows per thread count, speculation on/off, bad input."""

from __future__ import annotations

import json

import pytest

from apps.cli import main as cli
from apps.cli.bench_llm import tokens_of


def _one_line(capsys, code: int, fragment: str) -> None:
    err = capsys.readouterr().err
    assert code == 2, err
    assert fragment in err, err
    assert err.count("\n") == 1 and "Traceback" not in err


@pytest.mark.slow  # six model loads, two of them on 2 threads: seconds when quiet, over a minute on a busy 2-core machine
def test_bench_llm_reports_pp_and_tg_per_thread_count(smollm, capsys) -> None:
    argv = ["bench", "default", "--threads", "1", "2", "--runs", "2", "--prompt-tokens", "16", "--gen-tokens", "2", "--json"]
    assert cli(argv) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["kind"] == "llm" and data["model"] == smollm.manifest.ref
    assert [(r["threads"], r["test"]) for r in data["results"]] == [(1, "pp16"), (1, "tg2"), (2, "pp16"), (2, "tg2")]
    for r in data["results"]:
        assert len(r["samples"]) == 2 and all(s > 0 for s in r["samples"])
        assert r["tokens_per_s"] == pytest.approx(sum(r["samples"]) / 2)
    assert [p["threads"] for p in data["placements"]] == [1, 2]  # each row on the threads it names
    assert data["plan"]["n_ctx"] >= 18
    assert [s["threads"] for s in data["speculation"]] == [1, 2]
    for s in data["speculation"]:
        assert s["off"]["decode_tps"] > 0 and s["on"]["decode_tps"] > 0 and s["text_identical"] is True
        assert s["drafter"] == "prompt-lookup" and s["stats"]["enabled"] is True
        assert s["speed_up"] == pytest.approx(s["on"]["decode_tps"] / s["off"]["decode_tps"])
        assert s["forced"]["decode_tps"] > 0 and s["forced"]["stats"]["on"] is True  # forced: never switched off


def test_bench_llm_text_table_and_skipped_test(smollm, capsys) -> None:
    assert cli(["bench", "default", "--threads", "1", "--runs", "1", "--prompt-tokens", "0", "--gen-tokens", "3"]) == 0
    out = capsys.readouterr().out
    assert "tg3" in out and "pp" not in out.split("t/s", 1)[1]  # --prompt-tokens 0 skips pp, as llama-bench's -p 0
    assert "tg3 repetitive" in out and "speed-up" in out and "drafted tokens accepted" in out


def test_bench_llm_without_decode_has_no_speculation_row(smollm, capsys) -> None:
    assert cli(["bench", "default", "--threads", "1", "--runs", "1", "--prompt-tokens", "8", "--gen-tokens", "0", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert [r["test"] for r in data["results"]] == ["pp8"]
    assert data["speculation"] is None and "--gen-tokens 0" in data["speculation_absent"]  # said so, never a made-up row


def test_bench_llm_draft_model_row(smollm, capsys) -> None:
    argv = ["bench", "default", "--draft", "default", "--threads", "1", "--runs", "1", "--prompt-tokens", "0", "--gen-tokens", "6",
            "--json"]
    assert cli(argv) == 0
    (row,) = json.loads(capsys.readouterr().out)["speculation"]
    assert row["drafter"] == "draft-model" and row["stats"]["enabled"] is True
    assert row["text_identical"] is True and row["on"]["tokens_out"] == 6


def test_bench_tokens_keep_the_bos_and_have_the_length(smollm) -> None:
    from runtime.llm.model import LLM

    with LLM.load(smollm, ctx=512, threads=1) as llm:
        body = llm.backend.tokenize(" one two three", add_bos=False, special=False)
        head = llm.tokenize(" one two three")[: -len(body)]  # the BOS, where the model adds one
        tokens = tokens_of(llm, " one two three", 50)
        assert len(tokens) == 50 and tokens == (head + body * 50)[:50]


@pytest.mark.parametrize(
    "extra, fragment",
    [
        (["--prompt-tokens", "0", "--gen-tokens", "0"], "nothing to measure"),
        (["--batch", "4"], "--batch does not apply to"),
        (["--prompt-tokens", "7000", "--gen-tokens", "1000"], "they share one context"),
        (["--draft", "default", "--gen-tokens", "0"], "--draft"),
    ],
    ids=["both-zero", "batch", "too-long", "draft-without-decode"],
)
def test_bench_llm_bad_input_is_one_line(smollm, extra, fragment, capsys) -> None:
    _one_line(capsys, cli(["bench", "default", *extra]), fragment)


def test_bench_classifier_refuses_llm_flags(digit_bundles, capsys) -> None:
    _one_line(capsys, cli(["bench", str(digit_bundles["tflite"]), "--prompt-tokens", "8"]), "--prompt-tokens does not apply to")
    _one_line(capsys, cli(["bench", str(digit_bundles["tflite"]), "--draft", "default"]), "--draft does not apply to")
