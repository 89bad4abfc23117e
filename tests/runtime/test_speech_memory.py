"""The speech models' plan terms against what they add to a fresh process's RSS (scripts/speech_memory.py)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_each_speech_model_stays_within_its_plan(tmp_path: Path) -> None:
    out = tmp_path / "memory.json"
    subprocess.run([sys.executable, str(ROOT / "scripts" / "speech_memory.py"), "--threads", "2", "--json", str(out)],
                   check=True, cwd=ROOT, capture_output=True, timeout=300)
    for row in json.loads(out.read_text()):
        added, planned = row["peak"] - row["base"], row["plan"]["total_bytes"]
        # the plan covers the peak (the assistant refuses what does not fit), and not by more than a quarter
        assert 0.75 * planned <= added <= planned, (row["kind"], row["adds_mib"], row["plan_mib"])
        assert row["rtf"] < 0.5, row  # every model runs well faster than real time on two threads
