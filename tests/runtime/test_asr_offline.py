"""runtime.speech.asr never lets a hub client reach out: faster-whisper's __init__ imports huggingface_hub, which runtime.speech.asr
switches offline before the import; a model that is not a local folder or recipe is refused in one line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from runtime.speech.asr import OFFLINE_ENV

pytest.importorskip("faster_whisper")
ROOT = Path(__file__).resolve().parents[2]

CHILD = """
import json, os, sys
NETWORK = ("socket.connect", "socket.sendto", "socket.sendmsg", "socket.getaddrinfo", "socket.gethostbyname",
           "socket.gethostbyname_ex", "socket.gethostbyaddr", "urllib.Request")
seen = []
def hook(event, args):
    if event in NETWORK:
        seen.append(event)
        raise ConnectionRefusedError("the test forbids the network: " + event)
sys.addaudithook(hook)
from runtime.speech.asr import ASR, import_faster_whisper
from runtime.errors import BadInput
fw = import_faster_whisper()
import huggingface_hub.constants as hub
out = {"env": {k: os.environ.get(k) for k in %(keys)r}, "hub_offline": hub.is_offline_mode()}
try:  # the download helper faster-whisper would call for a model name: refused before any request
    fw.download_model("tiny.en", cache_dir=sys.argv[1])
    out["download"] = "returned"
except Exception as exc:
    out["download"] = type(exc).__name__
try:
    ASR.load("Systran/faster-whisper-tiny.en")
    out["load"] = "loaded"
except BadInput as exc:
    out["load"] = str(exc)
out["network"] = seen
print(json.dumps(out))
"""


@pytest.mark.parametrize("hub_first", [False, True], ids=["fresh", "hub-imported-before"])
def test_no_hub_request_can_leave_and_a_hub_name_is_refused(tmp_path: Path, hub_first: bool) -> None:
    # The caller's environment is not what makes it offline: the switches are cleared for the child.
    env = {k: v for k, v in os.environ.items() if k not in OFFLINE_ENV}
    env["PYTHONPATH"] = str(ROOT)
    child = CHILD % {"keys": tuple(OFFLINE_ENV)}
    if hub_first:  # something imported huggingface_hub before runtime.speech.asr: it read its switches already
        child = child.replace("sys.addaudithook(hook)", "import huggingface_hub.constants\nsys.addaudithook(hook)")
    run = subprocess.run([sys.executable, "-c", child, str(tmp_path / "cache")], capture_output=True, text=True,
                         env=env, cwd=ROOT, timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]
    out = json.loads(run.stdout.strip().splitlines()[-1])
    assert out["network"] == [], out  # not a single lookup or connection was attempted
    assert out["env"] == OFFLINE_ENV and out["hub_offline"] is True, out
    assert out["download"] in ("LocalEntryNotFoundError", "OfflineModeIsEnabled"), out
    assert "\n" not in out["load"] and "Systran/faster-whisper-tiny.en" in out["load"], out
    assert "not a asr recipe" in out["load"] or "not an asr recipe" in out["load"], out
