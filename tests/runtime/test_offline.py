"""Offline is a guarantee: loading and generating makes no network call, not even a DNS lookup."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

PROBE = Path(__file__).with_name("offline_probe.py")


def test_load_and_generate_open_no_connection(smollm) -> None:
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[2])}
    out = subprocess.run([sys.executable, str(PROBE), "default"], capture_output=True, text=True, env=env, timeout=120, check=True)
    report = json.loads(out.stdout.strip().splitlines()[-1])
    assert report["text"] and report["chat"]  # it really ran
    assert report["events"] == []
    assert report["hub_modules"] == []


# One deliberate action per watched event (loopback or a path that does not exist: nothing leaves the machine).
# The expected event is named here, independently of the probe's WATCH: dropping an event from WATCH fails the test.
ACTIONS = [
    ("socket.connect", "s = socket.socket(); s.settimeout(1); s.connect(('127.0.0.1', 9))"),
    ("socket.sendto", "socket.socket(socket.AF_INET, socket.SOCK_DGRAM).sendto(b'x', ('127.0.0.1', 9))"),
    ("socket.sendmsg", "socket.socket(socket.AF_INET, socket.SOCK_DGRAM).sendmsg([b'x'], [], 0, ('127.0.0.1', 9))"),
    ("socket.getaddrinfo", "socket.getaddrinfo('localhost', 80)"),
    ("socket.gethostbyname", "socket.gethostbyname('localhost')"),
    ("socket.gethostbyname", "socket.gethostbyname_ex('localhost')"),
    ("socket.gethostbyaddr", "socket.gethostbyaddr('127.0.0.1')"),
    ("socket.getnameinfo", "socket.getnameinfo(('127.0.0.1', 80), 0)"),
    ("urllib.Request", "urllib.request.urlopen('http://127.0.0.1:9/', timeout=1)"),
    ("subprocess.Popen", "subprocess.run(['/nonexistent/curl', '--version'])"),
    ("subprocess.Popen", "subprocess.run('/nonexistent/wget --version', shell=True, capture_output=True)"),  # via a shell
    ("os.system", "os.system('/nonexistent/git --version 2>/dev/null')"),
    ("os.exec", "os.execv('/nonexistent/ssh', ['ssh', 'host'])"),  # fails: the process is not replaced
    ("os.posix_spawn", "os.posix_spawn('/nonexistent/pip', ['pip', 'download', 'x'], dict(os.environ))"),
    (None, "subprocess.run(['true'])"),  # a local program: not a network call, not recorded
]
SELF_TEST = """
import json, os, socket, subprocess, sys, urllib.request
sys.path.insert(0, {folder!r})
import offline_probe as probe
sys.addaudithook(probe.hook)
seen = []
for code in {codes!r}:
    probe.EVENTS.clear()
    try:
        exec(code)
    except Exception:
        pass
    seen.append(sorted({{event for event, _ in probe.EVENTS}}))
print(json.dumps(seen))
"""


def test_the_probe_sees_each_thing_it_watches(tmp_path: Path) -> None:
    """The probe's own hook records every watched kind of network call (so [] above means something)."""
    from tests.runtime.offline_probe import WATCH

    assert set(WATCH) == {event for event, _ in ACTIONS if event}, "every watched event needs an action here"
    script = tmp_path / "self_test.py"
    script.write_text(SELF_TEST.format(folder=str(PROBE.parent), codes=[code for _, code in ACTIONS]))
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60, check=True)
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    for (event, code), events in zip(ACTIONS, seen, strict=True):
        if event is None:
            assert events == [], (code, events)
        else:
            assert event in events, (code, events)
