"""`edgerun serve` as users run it: the command in its own process, the default model, the openai client."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from openai import OpenAI

from apps.cli.serve_cmd import model_entry
from runtime.errors import BadInput

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_edgerun_serve_default_model_streams_a_chat(smollm, shared_home: Path, tmp_path: Path) -> None:
    log = tmp_path / "serve.log"
    env = {**os.environ, "EDGERUN_HOME": str(shared_home), "OMP_NUM_THREADS": "1"}
    with log.open("w") as err:
        proc = subprocess.Popen([sys.executable, "-m", "apps", "serve", "--port", "0", "--slots", "2", "--memory", "1G"],
                                cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=err)
    try:
        deadline = time.monotonic() + 120
        while not (found := re.search(r"serving default on (http://127\.0\.0\.1:\d+)/v1", log.read_text())):
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.1)
        url = found.group(1)
        while True:
            try:
                with urllib.request.urlopen(url + "/readyz", timeout=5):
                    break
            except OSError:
                assert proc.poll() is None and time.monotonic() < deadline, log.read_text()
                time.sleep(0.2)
        client = OpenAI(base_url=url + "/v1", api_key="none", max_retries=0)
        assert [m.id for m in client.models.list().data] == ["default"]
        stream = client.chat.completions.create(model="default", messages=[{"role": "user", "content": "Hi!"}],
                                                max_tokens=8, stream=True)
        text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
        assert text.strip()
    finally:
        proc.send_signal(signal.SIGTERM)  # a service manager's stop: graceful, exit 0
        assert proc.wait(30) == 0, log.read_text()
    assert "Traceback" not in log.read_text() and log.read_text().endswith("edgerun: server stopped\n")


@pytest.mark.parametrize("text, name, ref", [
    ("default", "default", "default"),
    ("chat=default", "chat", "default"),
    ("smollm2-135m-instruct@q4_1-0.1.2", "smollm2-135m-instruct", "smollm2-135m-instruct@q4_1-0.1.2"),
    ("./models/My Model.gguf", "my-model", "./models/My Model.gguf"),
    ("/srv/bundles/digits-int8/", "digits-int8", "/srv/bundles/digits-int8/"),
    ("tiny.gguf", "tiny", "tiny.gguf"),  # a file in the current folder
])
def test_model_arguments(text: str, name: str, ref: str) -> None:
    entry = model_entry(text)
    assert (entry.name, entry.ref, entry.pinned) == (name, ref, True)


@pytest.mark.parametrize("text", ["../x=default", "=default", "a/b=default"])
def test_bad_model_names_are_refused(text: str) -> None:
    with pytest.raises(BadInput, match="model name"):
        model_entry(text)


@pytest.mark.parametrize("model, why", [("no-such-model", "unknown model"), ("./nothing.gguf", "no such file")])
def test_a_bad_model_is_one_line_before_listening(model: str, why: str, capsys: pytest.CaptureFixture[str]) -> None:
    from apps.cli import main as edgerun

    assert edgerun(["serve", model, "--port", "0"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and why in err and "serving" not in err
