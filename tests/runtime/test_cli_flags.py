"""Command-line values as a hostile user types them: numbers, bytes that are not UTF-8, flags of the other kind of model.

Every refusal is one line on stderr and exit 2, before anything loads.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from apps.cli import main as cli
from apps.cli.common import MAX_CTX
from apps.cli.flags import max_threads
from runtime.errors import BadInput
from runtime.units import parse_size

ROOT = Path(__file__).resolve().parents[2]
HUGE = "4" * 400  # 400 digits: an OverflowError through float() before
CAP = max_threads()


def _refused(capsys, argv: list[str], *fragments: str) -> str:
    code = cli(argv)
    err = capsys.readouterr().err
    assert code == 2, err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    for fragment in fragments:
        assert fragment in err, err
    return err


# (argv, the flag, what the one line must say). "no-such-model": the value is refused before the model is looked up.
NUMBERS = [
    # thousands of threads made libgomp fail in llama.cpp and hung ORT; 2^31 was accepted
    (["run", "no-such-model", "--prompt", "x", "--threads", "10000"], "--threads", f"use an integer from 1 to {CAP}"),
    (["run", "no-such-model", "--prompt", "x", "--threads", "2147483648"], "--threads", "is out of range"),
    (["run", "no-such-model", "--prompt", "x", "--threads", "-1"], "--threads", "is out of range"),
    (["run", "no-such-model", "--prompt", "x", "--threads", "1.5"], "--threads", "is not an integer"),
    (["chat", "no-such-model", "--threads", str(CAP + 1)], "--threads", "is out of range"),
    (["bench", "no-such-model", "--threads", "1", "10000"], "--threads", "is out of range"),
    # sizes: 400 digits raised OverflowError; past 2^48 no machine can hold it
    (["run", "no-such-model", "--prompt", "x", "--memory", HUGE], "--memory", "is too large: use a size from 1 B to 256 TiB"),
    (["run", "no-such-model", "--prompt", "x", "--memory", "256.5T"], "--memory", "is too large"),
    (["run", "no-such-model", "--prompt", "x", "--memory", "0"], "--memory", "is too small"),
    (["run", "no-such-model", "--prompt", "x", "--memory", "1e9"], "--memory", "is not a size"),
    (["run", "no-such-model", "--prompt", "x", "--prefix-cache", HUGE], "--prefix-cache", "is too large: use a size from 0 to"),
    (["plan", "no-such-model", "--memory", HUGE], "--memory", "is too large"),
    (["plan", "no-such-model", "--prefix-cache", "1.5.2M"], "--prefix-cache", "is not a size"),
    # context: llama.cpp's cells are int32, padded to 256
    (["run", "no-such-model", "--prompt", "x", "--ctx", str(2**31)], "--ctx", f"use an integer from 256 to {MAX_CTX}"),
    (["plan", "no-such-model", "--ctx", HUGE], "--ctx", "is out of range"),
    (["plan", "no-such-model", "--ctx", "100"], "--ctx", "is out of range"),
    # sampling: int32 counts, a uint32 seed, finite floats
    (["run", "no-such-model", "--prompt", "x", "--max-tokens", str(2**31)], "--max-tokens", "is out of range"),
    (["run", "no-such-model", "--prompt", "x", "--max-tokens", "0"], "--max-tokens", "is out of range"),
    (["run", "no-such-model", "--prompt", "x", "--top-k", str(2**31)], "--top-k", "is out of range"),
    (["run", "no-such-model", "--prompt", "x", "--seed", str(2**32 - 1)], "--seed", "is out of range"),
    (["run", "no-such-model", "--prompt", "x", "--temperature", "nan"], "--temperature", "is out of range"),
    (["run", "no-such-model", "--prompt", "x", "--temperature", "inf"], "--temperature", "is out of range"),
    (["run", "no-such-model", "--prompt", "x", "--temperature", "1e999"], "--temperature", "is out of range"),
    (["run", "no-such-model", "--prompt", "x", "--top-p", "0"], "--top-p", "is out of range"),
    (["run", "no-such-model", "--prompt", "x", "--min-p", "1"], "--min-p", "is out of range"),
    (["run", "no-such-model", "--prompt", "x", "--repeat-penalty", "inf"], "--repeat-penalty", "is out of range"),
    (["run", "no-such-model", "--prompt", "x", "--repeat-penalty", "hot"], "--repeat-penalty", "is not a number"),
    # classifier counts
    (["run", "no-such-model", "--input", "a.jpg", "--top", "0"], "--top", "is out of range"),
    (["plan", "no-such-model", "--batch", "65537"], "--batch", "use an integer from 1 to 65536"),
    (["bench", "no-such-model", "--runs", "0"], "--runs", "is out of range"),
    (["bench", "no-such-model", "--batch", HUGE], "--batch", "is out of range"),
]


@pytest.mark.parametrize("argv, flag, valid", NUMBERS, ids=[f"{a[0]} {f} {a[-1][:12]}" for a, f, _ in NUMBERS])
def test_numbers_out_of_range_are_one_argparse_line(argv, flag, valid, capsys) -> None:
    err = _refused(capsys, argv, f"edgerun {argv[0]}: error: argument {flag}: ", valid)
    assert repr(argv[-1][:40]) in err  # the bad value (always last here), cut short when it is long


# The bounds themselves are accepted: each of these gets past the flags to the model lookup.
BOUNDS = [
    ["run", "no-such-model", "--prompt", "x", "--threads", str(CAP), "--memory", "256T", "--prefix-cache", "0",
     "--ctx", str(MAX_CTX), "--max-tokens", str(2**31 - 1), "--top-k", "0", "--seed", str(2**32 - 2), "--top-p", "1",
     "--min-p", "0", "--temperature", "0"],
    ["bench", "no-such-model", "--threads", "1", str(CAP), "--runs", "1000000", "--batch", "65536"],
    ["plan", "no-such-model", "--memory", "1.5G", "--batch", "1"],
]


@pytest.mark.parametrize("argv", BOUNDS, ids=[a[0] for a in BOUNDS])
def test_values_at_the_bounds_are_accepted(argv, capsys) -> None:
    _refused(capsys, argv, "edgerun: unknown model 'no-such-model'")


@pytest.mark.parametrize(
    "text, expected",
    [("512M", 512 << 20), ("1.5G", 3 << 29), (" 2 GiB ", 2 << 30), ("256T", 1 << 48), ("7", 7), ("0.5K", 512)],
)
def test_parse_size_is_exact(text: str, expected: int) -> None:
    assert parse_size(text) == expected


@pytest.mark.parametrize("text", [HUGE, "9" * 5000, "256.0001T", "0", "0.4", "1e3", "nan", "inf", "-1", "12Q"])
def test_parse_size_refuses_with_one_line(text: str) -> None:
    with pytest.raises(BadInput, match=r"^--memory '.*(is not a size|is too large|is too small)") as exc:
        parse_size(text)
    assert "\n" not in str(exc.value) and len(str(exc.value)) < 200


def test_a_multi_line_error_is_folded_to_one_line(capsys) -> None:
    # a path with a newline and a terminal escape in it: the error names it, on one line, the escape made harmless
    err = _refused(capsys, ["run", "/nonexistent/a\nb\x1b[2J.gguf", "--prompt", "x"], "/nonexistent/a b\\x1b[2J.gguf")
    assert "\x1b" not in err


# --- text that is not UTF-8: bytes in argv (decoded by Python with surrogateescape) and on stdin ---------------

def _edgerun(args: list[bytes | str], stdin: bytes | int = b"") -> subprocess.CompletedProcess[bytes]:
    """The CLI in a fresh interpreter; ``stdin`` is the bytes to feed, or a file descriptor (a terminal)."""
    # strict UTF-8 stdio, as in an en_US.UTF-8 terminal (the C and C.UTF-8 locales would use surrogateescape)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "LC_ALL": "C.UTF-8", "PYTHONIOENCODING": "utf-8:strict", "OMP_NUM_THREADS": "1"}
    feed = {"input": stdin} if isinstance(stdin, bytes) else {"stdin": stdin}
    code = "import sys; from apps.cli import main; sys.exit(main())"
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, env=env, timeout=300, **feed)


@pytest.mark.parametrize(
    "args, flag, where",
    [
        ([b"run", b"default", b"--prompt", b"caf\xe9 au lait"], "--prompt", "byte 0xe9 at character 4"),
        ([b"run", b"default", b"--prompt", b"hi", b"--stop", b"\xff"], "--stop", "byte 0xff at character 1"),
        ([b"chat", b"default", b"--system", b"be \xc3 terse"], "--system", "byte 0xc3 at character 4"),
    ],
    ids=["prompt", "stop", "system"],
)
def test_argv_bytes_that_are_not_utf8_are_refused(smollm, args, flag, where) -> None:
    done = _edgerun(args)
    err = done.stderr.decode()
    assert done.returncode == 2, err
    assert err.count("\n") == 1 and f"argument {flag}: the text is not valid UTF-8 ({where})" in err, err
    assert done.stdout == b""


def test_chat_input_that_is_not_utf8_is_refused(smollm) -> None:
    done = _edgerun(["chat", "default", "--memory", "1G", "--max-tokens", "4"], stdin=b"\xffbonjour\nHello\n")
    err = done.stderr.decode().splitlines()
    assert done.returncode == 2, err
    assert err[-1] == "edgerun: chat input line 1 is not valid UTF-8 (byte 0xff at character 1): give UTF-8 text", err
    assert not any("Traceback" in line for line in err)


def test_an_interactive_chat_says_so_and_goes_on(smollm) -> None:
    # on a terminal a bad line is a typing slip: one line on stderr, and the conversation goes on to /quit
    import pty

    controller, terminal = pty.openpty()
    os.write(controller, b"\xffbonjour\n/quit\n")
    try:
        done = _edgerun(["chat", "default", "--memory", "1G"], stdin=terminal)
    finally:
        os.close(terminal)
        os.close(controller)
    err = done.stderr.decode()
    assert done.returncode == 0, err
    assert "edgerun: that line is not valid UTF-8 (byte 0xff at character 1): give UTF-8 text" in err, err


def test_chat_input_with_surrogates_in_process(smollm, capsys, monkeypatch) -> None:
    import io

    monkeypatch.setattr("sys.stdin", io.StringIO("\udcfe\n"))  # what a POSIX-locale stdin makes of byte 0xfe
    assert cli(["chat", "default", "--memory", "1G"]) == 2
    err = capsys.readouterr().err.splitlines()  # the placement line, then the error
    assert err[-1] == "edgerun: chat input line 1 is not valid UTF-8 (byte 0xfe at character 1): give UTF-8 text", err


# --- flags of the other kind of model ------------------------------------------------------------------------

@pytest.mark.parametrize(
    "extra, named",
    [
        (["--ctx", "512"], "--ctx does not apply"),
        (["--kv-type", "f16"], "--kv-type does not apply"),
        (["--prefix-cache", "0"], "--prefix-cache does not apply"),  # a value of 0 is still given
        (["--top-k", "40"], "--top-k does not apply"),  # the LLM default value is still given
        (["--chat"], "--chat does not apply"),
        (["--prompt", "hi", "--temperature", "0"], "--prompt, --temperature do not apply"),
    ],
    ids=["ctx", "kv-type", "prefix-cache-0", "top-k-40", "chat", "prompt+temperature"],
)
def test_llm_flags_are_refused_for_a_classifier(digit_bundles, digits, extra, named, capsys) -> None:
    argv = ["run", str(digit_bundles["tflite"]), "--input", str(digits.test_images[0]), *extra]
    _refused(capsys, argv, named, "a vision model", "--top N")


def test_a_classifier_takes_top(digit_bundles, digits, capsys) -> None:
    import json

    assert cli(["run", str(digit_bundles["tflite"]), "--input", str(digits.test_images[0]), "--top", "2", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert [len(p["labels"]) for p in data["predictions"]] == [2]


@pytest.mark.parametrize(
    "extra, named",
    [(["--input", "cat.jpg"], "--input does not apply"), (["--top", "3"], "--top does not apply")],
    ids=["input", "top"],
)
def test_classifier_flags_are_refused_for_an_llm(smollm, extra, named, capsys) -> None:
    _refused(capsys, ["run", "default", "--prompt", "hi", *extra], named, "an LLM", "it continues --prompt TEXT")


def test_plan_refuses_the_other_kinds_flags(smollm, digit_bundles, capsys) -> None:
    _refused(capsys, ["plan", "default", "--batch", "4"], "--batch does not apply to", "an LLM")
    _refused(capsys, ["plan", str(digit_bundles["tflite"]), "--ctx", "512"], "--ctx does not apply to", "a vision model")
    assert cli(["plan", str(digit_bundles["tflite"]), "--batch", "4", "--json"]) == 0
    capsys.readouterr()


def test_a_file_name_that_is_not_utf8_is_printed_as_its_bytes(digit_bundles, digits, tmp_path) -> None:
    name = os.fsencode(tmp_path) + b"/digit-\xff.png"  # a legal POSIX file name, not UTF-8
    Path(os.fsdecode(name)).write_bytes(Path(digits.test_images[0]).read_bytes())
    done = _edgerun([b"run", os.fsencode(digit_bundles["tflite"]), b"--input", name, b"--top", b"1"])
    assert done.returncode == 0, done.stderr.decode()
    assert done.stdout.splitlines()[0] == name  # the same bytes back, no UnicodeEncodeError
