"""One exit code per failure class, the same in runtime.errors, in what the converters raise, and in the README."""

from __future__ import annotations

import re
from pathlib import Path

from runtime import errors

README = Path(__file__).resolve().parents[2] / "README.md"


def _classes() -> dict[int, type[errors.EdgerunError]]:
    found = {cls.exit_code: cls for cls in vars(errors).values()
             if isinstance(cls, type) and issubclass(cls, errors.EdgerunError) and cls is not errors.EdgerunError}
    assert len(found) == len([c for c in vars(errors).values() if isinstance(c, type) and issubclass(c, errors.EdgerunError)]) - 1, \
        "two failure classes share an exit code"
    return found


def test_every_failure_class_has_its_own_code_and_the_readme_lists_it() -> None:
    text = " ".join(README.read_text(encoding="utf-8").split())
    listed = re.search(r"Exit codes: (.*?)\. Errors are one line", text)
    assert listed, "README: the 'Exit codes: ...' paragraph is missing"
    codes = {int(m) for m in re.findall(r"(?:^|, )(\d+) ", listed.group(1))}
    assert codes == {0, *_classes(), 130}, (codes, sorted(_classes()))  # 130: the dispatcher's KeyboardInterrupt
    assert "7 a conversion failed its quality gate" in listed.group(1)


def test_every_converter_gate_raises_the_one_gate_failure() -> None:
    from converters.classifier import core as classifier  # vision's and audio's gate
    from converters.llm import QualityGateFailed as LLMGate

    assert LLMGate is errors.QualityGateFailed and errors.QualityGateFailed.exit_code == 7
    assert classifier.QualityGateFailed is errors.QualityGateFailed
