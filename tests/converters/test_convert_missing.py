"""``edgerun convert KIND`` when KIND's converter cannot be imported: exit 4 with the pip line, whatever the
arguments, never argparse's "invalid choice" (exit 2) or a traceback; the other converters still work.

A missing package is simulated by sys.modules patching: None there makes the import fail as an absent module does.
"""

from __future__ import annotations

import sys

import pytest

from apps.cli import main as edgerun

CONVERTER_MODULES = ("apps.cli.convert_vision", "apps.cli.convert_audio", "converters.vision.gate")


def _drop_converters(monkeypatch: pytest.MonkeyPatch) -> None:
    """Forget the imported converter modules (in sys.modules and as their package's attributes, which
    ``from package import module`` reads first), so that the command imports them again under the patched sys.modules."""
    for name in CONVERTER_MODULES:
        monkeypatch.delitem(sys.modules, name, raising=False)
        parent, _, child = name.rpartition(".")
        if parent in sys.modules:
            monkeypatch.delattr(sys.modules[parent], child, raising=False)


@pytest.mark.parametrize(
    "missing, words",
    [
        ("apps.cli.convert_vision", "its module 'apps.cli.convert_vision' is not part of this install"),  # the converter itself
        ("numpy", "the Python package 'numpy' is not installed"),  # a package its modules import
    ],
)
@pytest.mark.parametrize(
    "argv",
    [
        ["vision", "--out", "b", "model.pt"],  # options first: no option is known to the stand-in, none refused
        ["vision", "model.pt", "--calib", "c", "--quant", "int8"],
        ["vision"],
        ["vision", "--help"],  # its help is the pip line too
    ],
    ids=["options-first", "model-first", "bare", "help"],
)
def test_a_converter_that_cannot_be_imported_exits_4_with_the_pip_line(monkeypatch, capsys, missing: str, words: str,
                                                                     argv: list[str]) -> None:
    _drop_converters(monkeypatch)
    monkeypatch.setitem(sys.modules, missing, None)
    code = edgerun(["convert", *argv])
    err = capsys.readouterr().err
    assert code == 4, err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert f"the vision converter cannot be imported: {words}" in err
    assert "install it with: pip install 'edgerun[convert-vision]'" in err


def test_the_other_converters_stay_usable_and_the_list_says_which_is_not(monkeypatch, capsys) -> None:
    _drop_converters(monkeypatch)
    monkeypatch.setitem(sys.modules, "apps.cli.convert_vision", None)
    assert edgerun(["convert", "--help"]) == 0
    listing = capsys.readouterr().out
    assert "(not available: the vision converter cannot be imported" in listing  # vision: the pip line in the list
    assert "(not available: the audio converter" in listing  # audio's CLI builds on vision's
    assert edgerun(["convert", "llm", "--help"]) == 0
    assert "--quant" in capsys.readouterr().out
    assert edgerun(["convert", "audio", "zoo:openwakeword-alexa"]) == 4
    assert "pip install 'edgerun[convert-vision,audio]'" in capsys.readouterr().err
