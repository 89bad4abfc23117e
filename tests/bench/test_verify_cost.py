"""bench/verify_cost.py: the break-even acceptance of a verify batch, and a smoke run on the default model."""

from __future__ import annotations

import json

import pytest

from bench.verify_cost import break_even, main
from runtime.llm.speculative import expected_tokens


def test_break_even_acceptance() -> None:
    assert break_even(1.0, 4) == 0.0  # a batch that costs a step: any acceptance pays
    assert break_even(2.2, 1) is None  # one drafted token keeps 2 tokens at most: a 2.2-step batch never pays
    a = break_even(4.4, 8)
    assert a is not None and abs(expected_tokens(a, 8) - 4.4) < 1e-6
    assert break_even(6.9, 8) > a  # a dearer batch needs a higher acceptance


@pytest.mark.slow
def test_smoke_on_the_default_model(smollm, tmp_path, capsys) -> None:
    out = tmp_path / "verify.json"
    assert main([str(smollm.directory), "--sizes", "3", "--position", "64", "--repeats", "2", "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "break-even acceptance" in printed
    rows = json.loads(out.read_text())["results"][0]["rows"]
    assert [r["tokens"] for r in rows] == [1, 3] and rows[0]["steps"] == 1.0 and rows[1]["ms"] > 0


def test_bad_flags_exit_2(capsys) -> None:
    assert main(["--sizes", "0"]) == 2
    assert "--sizes must be a positive integer" in capsys.readouterr().err
