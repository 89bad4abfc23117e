"""runtime.errors: one wording of a missing package, one way to fold a message onto one line."""

from __future__ import annotations

import pytest

from runtime.errors import MissingDependency, missing, not_installed, one_line


def test_a_missing_package_has_one_wording() -> None:
    assert str(missing("cv2", "kiosk")) == "the Python package 'cv2' is not installed; install it with: pip install 'edgerun[kiosk]'"
    err = not_installed("onnxruntime", "pip install onnxruntime==1.32.0", purpose="the ONNX Runtime backend")
    assert isinstance(err, MissingDependency) and err.exit_code == 4
    assert str(err) == ("the ONNX Runtime backend needs 'onnxruntime', which is not installed; "
                        "install it with: pip install onnxruntime==1.32.0")
    assert str(not_installed("wrapper", "pip install wrapper", cause="inner")) == (
        "the Python package 'wrapper' is not installed (it imports 'inner', which is missing); install it with: pip install wrapper")


@pytest.mark.parametrize("what, kwargs, line", [
    # an exception's message: its words joined by one space, tabs and newlines included (native runtimes' messages)
    (RuntimeError("load failed:\n  line 3\tbad  token\n"), {}, "load failed: line 3 bad token"),
    (RuntimeError(""), {}, "RuntimeError"),  # no message: the type's name
    (RuntimeError("x" * 500), {}, "x" * 397 + "..."),
    (RuntimeError("x" * 500), {"limit": None}, "x" * 500),
    (ValueError("abcdef"), {"limit": 5}, "ab..."),
    # a text: the same folding, and no type name for an empty one
    ("", {}, ""),
    ("  a\r\nb  ", {}, "a b"),
    # escape (the CLI's dispatcher): control characters that are not whitespace made visible, never sent
    ("/nonexistent/a\nb\x1b[2J.gguf", {"escape": True}, "/nonexistent/a b\\x1b[2J.gguf"),
    ("bell\x07 nul\x00 del\x7f csi\x9b", {"escape": True}, "bell\\x07 nul\\x00 del\\x7f csi\\x9b"),
    ("bell\x07", {}, "bell\x07"),  # without escape the text is only folded
])
def test_one_line(what, kwargs: dict, line: str) -> None:
    assert one_line(what, **kwargs) == line
