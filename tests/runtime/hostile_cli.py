"""`edgerun` in a child process with bounded time and address space, and the checks every hostile input shares.

A hostile file may hang a native runtime or ask it for terabytes, which an in-process test could not survive;
the child gets CHILD_SECONDS and an address space of CHILD_ADDRESS_BYTES (what a small board has, whatever this
machine's memory and overcommit policy), so a huge allocation fails at once instead of being granted and touched.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CHILD_SECONDS = 120  # a load is 2-5 s here; a loaded 2-core machine may take several times that
CHILD_ADDRESS_BYTES = 16 << 30
_MAIN = "import sys; from apps.cli import main; sys.exit(main(sys.argv[1:]))"


def _capped() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (CHILD_ADDRESS_BYTES, resource.getrlimit(resource.RLIMIT_AS)[1]))


def edgerun_child(*args: str | Path) -> subprocess.CompletedProcess[str]:
    """``edgerun ARGS`` in a child process; raises subprocess.TimeoutExpired (the child killed) past CHILD_SECONDS."""
    return subprocess.run([sys.executable, "-c", _MAIN, *map(str, args)], capture_output=True, text=True, cwd=ROOT,
                          timeout=CHILD_SECONDS, preexec_fn=_capped, env={**os.environ, "OMP_NUM_THREADS": "1"})


def assert_refused(done: subprocess.CompletedProcess[str], code: int, *needles: str) -> str:
    """The child exited ``code`` with one line on stderr, ``edgerun: ...`` holding every needle, and no traceback."""
    lines = done.stderr.strip().splitlines()
    assert done.returncode == code and len(lines) == 1, (done.returncode, done.stderr[-3000:])
    assert lines[0].startswith("edgerun: ") and "Traceback" not in done.stderr, done.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


def assert_ran(done: subprocess.CompletedProcess[str]) -> list[dict]:
    """The child exited 0 with predictions as JSON (``run --json``), and no traceback."""
    assert done.returncode == 0 and "Traceback" not in done.stderr, (done.returncode, done.stderr[-3000:])
    return json.loads(done.stdout)["predictions"]


def bundle_around(directory: Path, model: Path, section: dict, kind: str = "vision", labels: int = 10) -> Path:
    """A bundle folder holding ``model`` (its backend and format from the suffix), ``labels`` labels and the
    manifest ``section`` for ``kind``; checksums are the files' own, so only the model itself is hostile."""
    from runtime.files import sha256_file

    fmt = model.suffix.lstrip(".")
    (directory / "labels.txt").write_text("".join(f"class-{i}\n" for i in range(labels)))
    files = [{"path": f.name, "sha256": sha256_file(f)[0], "size": f.stat().st_size, "role": role}
             for f, role in ((model, "weights"), (directory / "labels.txt", "labels"))]
    manifest = {"format": "edgerun.bundle", "schema_version": 1, "kind": kind,
                "backend": {"tflite": "litert", "onnx": "ort", "null": "null"}[fmt], "model_format": fmt,
                "name": f"hostile-{fmt}", "version": "1", "files": files, kind: {**section, "labels": "labels.txt"}}
    (directory / "manifest.json").write_text(json.dumps(manifest))
    return directory
