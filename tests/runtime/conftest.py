"""Session fixtures shared by the classifier tests: the digits CNN and its converted bundles, built once."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.converters.vision.conftest import session_bundles, session_digits
from tests.converters.vision.digits import Digits


@pytest.fixture(scope="session")
def digits(tmp_path_factory: pytest.TempPathFactory) -> Digits:
    return session_digits(tmp_path_factory)


@pytest.fixture(scope="session")
def digit_bundles(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return session_bundles(tmp_path_factory)
