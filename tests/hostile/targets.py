"""The real servers the hostile suite attacks, each as its own process on a loopback port, with its log captured.

A target records what the table in docs/trust.md reports beside the per-case verdicts: tracebacks in the process's
log, its peak RSS (``VmHWM``) and the memory plan it announced. Each target ends its process on exit (terminate,
then kill), so no test leaves one behind.
"""

from __future__ import annotations

import contextlib
import os
import re
import resource
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


FD_LIMIT = 1024  # a Raspberry Pi OS user's default soft limit on open files


def _pi_fd_limit() -> None:
    """In the child: the open-file limit a Pi gives a user's process (floods are measured against it)."""
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(FD_LIMIT, hard), hard))


def status_kib(pid: int, field: str) -> int | None:
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    m = re.search(rf"^{field}:\s+(\d+) kB", text, re.M)
    return int(m.group(1)) if m else None


@dataclass
class Target:
    name: str
    proc: subprocess.Popen
    port: int
    log: Path
    plan_bytes: int | None = None

    def alive(self) -> bool:
        return self.proc.poll() is None

    def tracebacks(self) -> int:
        return self.log.read_text(errors="replace").count("Traceback (most recent call last)")

    def peak_rss(self) -> int | None:
        kib = status_kib(self.proc.pid, "VmHWM")
        return None if kib is None else kib * 1024


@contextlib.contextmanager
def _process(name: str, argv: list[str], log: Path, port: int, ready, start_s: float, env: dict | None = None
             ) -> Iterator[Target]:
    with log.open("wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "apps", *argv], cwd=ROOT, stdout=out, stderr=subprocess.STDOUT,
                                env={**os.environ, **(env or {})}, preexec_fn=_pi_fd_limit)
    target = Target(name, proc, port, log)
    try:
        deadline = time.monotonic() + start_s
        while not ready(target):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"{name} did not start (exit {proc.poll()}): {log.read_text(errors='replace')[-3000:]}")
            time.sleep(0.5)
        yield target
    finally:
        proc.terminate()
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


def _metric_sum(base: str, name: str, **labels: str) -> float | None:
    text = httpx.get(base + "/metrics", timeout=10, trust_env=False).text
    total = None
    for line in text.splitlines():
        series, _, value = line.rpartition(" ")
        metric, _, rest = series.partition("{")
        if line.startswith("#") or metric != name:
            continue
        if all(f'{k}="{v}"' in rest for k, v in labels.items()):
            total = (total or 0.0) + float(value)
    return total


def small_vision_bundle(directory: Path) -> Path:
    """A real ONNX vision bundle of a few KB (the kiosk tests' colour-block classifier, random weights): what the
    suite needs is the server's image path, not a good classifier."""
    import numpy as np

    from tests.apps.kiosk.kiosk_e2e_data import GRID, write_bundle

    rng = np.random.default_rng(0)
    return write_bundle(directory, "1", rng.normal(size=(3 * GRID * GRID, 2)), np.zeros(2))


@contextlib.contextmanager
def serve(folder: Path, *, home: Path, vision_bundle: Path | None = None, memory: str = "1G") -> Iterator[Target]:
    """``edgerun serve`` with the default LLM (and a vision model named ``vision`` when a bundle is given)."""
    port = free_port()
    config = folder / "serve.toml"
    models = '[[models]]\nname = "default"\nref = "default"\npinned = true\nkeep_alive = -1\n'
    if vision_bundle is not None:
        models += f'\n[[models]]\nname = "vision"\nref = "{vision_bundle}"\npinned = true\n'
    config.write_text(f'memory = "{memory}"\nslots = 2\n\n[limits]\nmax_queued = 8\ndeadline_ms = 20000\n\n{models}')
    base = f"http://127.0.0.1:{port}"

    def ready(_: Target) -> bool:
        try:
            return httpx.get(base + "/readyz", timeout=2, trust_env=False).status_code == 200
        except httpx.HTTPError:
            return False

    with _process("edgerun serve", ["serve", "--config", str(config), "--port", str(port)], folder / "serve.log",
                  port, ready, 240, {"EDGERUN_HOME": str(home)}) as target:
        used = _metric_sum(base, "edgerun_memory_plan_bytes", part="used")
        reserve = _metric_sum(base, "edgerun_memory_plan_bytes", part="reserve")
        target.plan_bytes = int(used + reserve) if used is not None and reserve is not None else None
        yield target


@contextlib.contextmanager
def wyoming(folder: Path, *, home: Path, memory: str = "1G") -> Iterator[Target]:
    """``edgerun wyoming`` with its default models (wake word, Whisper tiny.en, Piper or espeak-ng, the LLM)."""
    from tests.hostile.wyoming_cases import describes

    port = free_port()
    with _process("edgerun wyoming", ["wyoming", "--uri", f"tcp://127.0.0.1:{port}", "--memory", memory],
                  folder / "wyoming.log", port, lambda t: describes(t.port, 2.0), 300, {"EDGERUN_HOME": str(home)}) as t:
        t.plan_bytes = _planned(t.log)  # "serving Wyoming on URI (...; 694.0 MiB planned of a 1.0 GiB budget)"
        yield t


def _planned(log: Path) -> int | None:
    """The plan a server's log announced ("N MiB planned of a" ...), in bytes; None when it announced none."""
    m = re.search(r"([\d.]+) (MiB|GiB) planned of a", log.read_text(errors="replace"))
    return int(float(m.group(1)) * 2 ** (20 if m.group(2) == "MiB" else 30)) if m else None


@contextlib.contextmanager
def kiosk(folder: Path, *, home: Path) -> Iterator[Target]:
    """``edgerun kiosk`` watching a folder of generated parts through a small real ONNX bundle, its dashboard on
    loopback, and the reference PLC peer on the other end of a pty null-modem."""
    from devices.link.nullmodem import NullModem, PtyEnd
    from devices.link.peer import ReferencePeer
    from tests.apps.kiosk.kiosk_e2e_data import make_data

    data = make_data(folder / "parts")
    kiosk_end, plc_end = PtyEnd(str(folder / "tty-kiosk")), PtyEnd(str(folder / "tty-plc"))
    cable = NullModem(kiosk_end, plc_end).start()
    peer = ReferencePeer(plc_end.url, str(folder / "peer.db"))
    peer.start()
    bundle = small_vision_bundle(folder / "bundle")
    port = free_port()
    base = f"http://127.0.0.1:{port}"

    def ready(t: Target) -> bool:  # the dashboard answers, and the plan line (printed after it started) is out
        try:
            return httpx.get(base + "/api/state", timeout=2, trust_env=False).status_code == 200 and _planned(t.log) is not None
        except httpx.HTTPError:
            return False

    config = folder / "kiosk.toml"
    config.write_text('[model]\nmemory = "512M"  # a Pi\'s share for the model, as the kiosk\'s default config has it\n')
    argv = ["kiosk", "--config", str(config), "--source", str(data / "teach" / "good"), "--watch", "--model", str(bundle),
            "--port", str(port), "--audit-db", str(folder / "audit.db"), "--plc", kiosk_end.url,
            "--plc-journal", str(folder / "journal.db")]
    try:
        with _process("edgerun kiosk", argv, folder / "kiosk.log", port, ready, 180, {"EDGERUN_HOME": str(home)}) as t:
            t.plan_bytes = _planned(t.log)  # "kiosk memory plan 42.0 MiB planned of a 1024.0 MiB budget"
            yield t
    finally:
        peer.stop()
        cable.close()
