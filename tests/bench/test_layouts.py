"""bench/layouts.py: a requantized copy scored against the shipped file, and the KV-type identity check, on the
default model; bad flags refused in one line."""

from __future__ import annotations

import json

import pytest

from bench.layouts import main


def test_bad_flags_are_one_line_with_exit_2(capsys) -> None:
    assert main(["--threads", "0"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "--threads must be positive integers" in err


@pytest.mark.slow
def test_smoke_on_the_default_model(smollm, tmp_path, capsys) -> None:
    out = tmp_path / "layouts.json"
    argv = [str(smollm.directory), "--weights", "q8_0", "--kv", "f16", "q8_0", "--threads", "1", "--positions", "300",
            "--runs", "1", "--json", str(out)]
    assert main(argv) == 0
    report = json.loads(out.read_text())
    shipped, q8 = report["weights"]
    assert shipped["weights"] == "shipped" and shipped["kl_mean"] == 0 and shipped["top1"] == 1  # itself
    assert q8["weights"] == "q8_0" and 0 < q8["kl_mean"] < 0.05 and q8["mib"] > shipped["mib"]  # 8 bits hold 4 closely
    assert q8["pp_t1"] > 0 and q8["tg_t1"] > 0
    # one thread: llama.cpp computes a batch's rows as it computes single steps, for either KV type
    assert [(r["kv"], r["max_abs_diff"]) for r in report["kv"]] == [("f16", 0.0), ("q8_0", 0.0)]
    assert "KV type: verify batch against single steps" in capsys.readouterr().out
