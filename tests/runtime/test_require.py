"""runtime.errors.require: one helper for every optional import."""

from __future__ import annotations

import sys

import pytest

from runtime.errors import MissingDependency, require


def test_require_returns_the_module() -> None:
    assert require("json", "pip install nothing") is sys.modules["json"]


def test_a_missing_package_is_one_line_with_the_pip_line() -> None:
    with pytest.raises(MissingDependency) as err:
        require("edgerun_no_such_pkg.sub", "pip install edgerun-no-such-pkg==1.0", purpose="the test route")
    message = str(err.value)
    assert "\n" not in message
    assert message == ("the test route needs 'edgerun_no_such_pkg.sub', which is not installed; "
                       "install it with: pip install edgerun-no-such-pkg==1.0")


def test_a_dependency_of_the_package_that_is_missing_is_named(tmp_path, monkeypatch) -> None:
    (tmp_path / "edgerun_wrapper_pkg.py").write_text("import edgerun_inner_missing_pkg\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(MissingDependency, match="it imports 'edgerun_inner_missing_pkg', which is missing"):
        require("edgerun_wrapper_pkg", "pip install wrapper")

