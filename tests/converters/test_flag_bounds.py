"""The converters' number flags are bounded where argparse reads them: one line, exit 2, nothing converted.

Each case was accepted before: NaN as --max-kl made every gate fail after the whole conversion, --threads 10000 reached
llama.cpp (libgomp fails), and --size 10**6 asked for a terabyte-scale input tensor.
"""

from __future__ import annotations

import pytest

from apps.cli import main as cli

CASES = [
    (["llm", "ckpt", "--quant", "q8_0", "--max-kl", "nan"], "--max-kl", "is out of range: use a number from 0 to 100"),
    (["llm", "ckpt", "--quant", "q8_0", "--max-kl", "-1"], "--max-kl", "is out of range"),
    (["llm", "ckpt", "--quant", "q8_0", "--eval-ctx", "0"], "--eval-ctx", "is out of range: use an integer from 16 to 32768"),
    (["llm", "ckpt", "--quant", "q8_0", "--eval-ctx", "9" * 400], "--eval-ctx", "is out of range"),
    (["llm", "ckpt", "--quant", "q8_0", "--threads", "10000"], "--threads", "is out of range: use an integer from 1 to"),
    (["vision", "zoo:mobilenet-v2", "--calib", "photos", "--size", "1000000"], "--size", "is out of range: use an integer from 8 to 4096"),
    (["vision", "zoo:mobilenet-v2", "--calib", "photos", "--size", "inf"], "--size", "is not an integer"),
]


@pytest.mark.parametrize("argv, flag, message", CASES, ids=[f"{c[0][0]} {c[1]} {c[0][-1][:8]}" for c in CASES])
def test_out_of_range_number_is_one_line_exit_2(argv: list[str], flag: str, message: str, tmp_path, capsys) -> None:
    code = cli(["convert", *argv, "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert code == 2, err
    assert err.count("\n") == 1 and f"argument {flag}" in err and message in err, err
    assert not (tmp_path / "out").exists()
