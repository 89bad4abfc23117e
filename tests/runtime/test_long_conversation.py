"""A 20,000-token conversation runs to the end with peak RSS inside the budget (slow tier)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).with_name("long_conversation.py")


@pytest.mark.slow
def test_twenty_thousand_token_conversation_stays_in_budget(smollm) -> None:
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[2])}
    out = subprocess.run([sys.executable, str(SCRIPT), "default", "250M", "20000", "f16"], capture_output=True, text=True,
                         env=env, timeout=900, check=True)
    report = json.loads(out.stdout.strip().splitlines()[-1])
    assert report["tokens"] >= 20_000
    assert report["max_kv_tokens"] <= report["n_ctx"] < 20_000  # it had to drop turns to get there
    assert report["truncations"] >= 1  # and said so
    assert report["planned_bytes"] <= report["budget_bytes"]
    assert report["peak_rss_bytes"] <= report["budget_bytes"], report
