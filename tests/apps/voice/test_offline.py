"""Offline (issue 19, item 8): the whole assistant answers a spoken question inside a network namespace with no
interfaces (``unshare -n``: only a loopback that is down), and, watched by the offline probe's audit hook
(tests/runtime/offline_probe.py), makes no network call of any kind on the way (no connect, no name lookup, no
network program, no hub client imported)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from scripts import make_voice_audio as mva
from tests.apps.voice.voice_audio import judge, voice_corpus, wake_bundle  # noqa: F401  (session fixtures)

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[3]
PROBE = ROOT / "tests" / "runtime" / "offline_probe.py"
IMPORTED_BY_FASTER_WHISPER = {"huggingface_hub"}
NAMESPACE_CHECK = """
import errno, json, socket
s = socket.socket(); s.settimeout(2)
try:
    s.connect(("127.0.0.1", 9)); reached = "connected"
except OSError as e:
    reached = errno.errorcode.get(e.errno, str(e.errno))
print(json.dumps({"interfaces": [name for _, name in socket.if_nameindex()], "loopback": reached}))
"""


def _unshare(*argv: str, env: dict[str, str] | None = None, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["unshare", "-n", *argv], capture_output=True, text=True, env=env, timeout=timeout, cwd=ROOT)


@pytest.fixture(scope="module")
def no_network() -> None:
    """``unshare -n`` works here (it needs root or CAP_SYS_ADMIN) and gives a namespace where even loopback is
    unreachable: anything that ran inside could not have reached a network."""
    if shutil.which("unshare") is None:
        pytest.skip("unshare (util-linux) is not installed")
    probe = _unshare(sys.executable, "-c", NAMESPACE_CHECK)
    if probe.returncode != 0 and "Operation not permitted" in probe.stderr:
        pytest.skip("unshare -n needs root or CAP_SYS_ADMIN: " + probe.stderr.strip().splitlines()[-1])
    assert probe.returncode == 0, probe.stderr
    seen = json.loads(probe.stdout)
    assert seen["interfaces"] == ["lo"] and seen["loopback"] == "ENETUNREACH", seen


def test_assistant_answers_with_no_network(no_network, voice_corpus: mva.Corpus, wake_bundle: Path,  # noqa: F811
                                           judge, smollm, shared_home: Path, tmp_path: Path) -> None:  # noqa: F811
    turn = next(c for c in voice_corpus.clips if c.id == "turn-q00-piper-joe")  # "What is the capital of France?"
    answer = tmp_path / "answer.wav"
    env = {**os.environ, "EDGERUN_HOME": str(shared_home), "PYTHONPATH": str(ROOT)}
    run = _unshare(sys.executable, str(PROBE), "--cli", "voice", "--input", str(voice_corpus.path(turn)), "--output",
                   str(answer), "--wake-word", str(wake_bundle), "--fast", "--memory", "2G", "--json",
                   env=env, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    report = json.loads(run.stdout.strip().splitlines()[-1])
    assert report["chat"] == "0", (report["chat"], run.stderr[-3000:])  # edgerun voice's exit code
    assert report["events"] == [], report
    # faster-whisper's package __init__ imports huggingface_hub (for its download helper, never called here: no
    # network event above, and no network to reach); no other hub or HTTP client comes in
    assert set(report["hub_modules"]) <= IMPORTED_BY_FASTER_WHISPER, report["hub_modules"]
    events = [json.loads(line) for line in report["text"].splitlines() if line.startswith("{")]
    assert [e["mark"] for e in events if e.get("mark") == "wake"] == ["wake"], events
    said = judge.transcribe(answer)
    assert mva.on_topic(said, turn.topic), said
