"""``kiosk.toml``: the kiosk's settings, merged with the command line's flags (a flag wins over the file).

    [source]
    spec = "camera:0"             # camera:N | FILE.mp4 | DIR of images
    watch = false                 # DIR: keep picking up new files
    rate = 20                     # FILE/DIR: parts/s the line is replayed at (0: as fast as they are read);
                                  # a camera paces itself
    max_parts = 0                 # stop after this many parts (0: run until the source ends or a signal)

    [model]
    ref = "parts-anomaly"         # a bundle dir, NAME.edgerun or installed name[@version] (vision or anomaly)
    canary = 0.0                  # on a reload (SIGHUP): the fraction of parts the new ref also decides first
    threads = 1                   # the model's CPU threads (default: placement's choice, one core left for capture)
    batch = 8                     # parts per model call at most
    target = "auto"
    memory = "512M"               # the residency budget for the model (and a second version during a swap)
    deadline_ms = 150             # a part without a decision this long after capture is rejected (fail-safe)
    max_queue = 32                # parts waiting for the model; beyond it the box is saturated (fail-safe)
    max_wait_ms = 5               # how long a batch waits to fill

    [policy]                      # apps/kiosk/policy.py: good, threshold(s), band, uncertain, anomaly_threshold...

    [plc]
    url = "serial:///dev/ttyUSB0?baud=115200"   # or a tty path, modbus:///dev/ttyX?unit=1, socket://HOST:PORT
    journal = "plc-journal.db"    # default $EDGERUN_HOME/kiosk/plc-journal.db

    [audit]
    db = "audit.db"               # default $EDGERUN_HOME/kiosk/audit.db
    quota = "512M"                # disk for reject/review pictures and the pass sample, oldest deleted first
    pass_sample = 0.02
    max_age_days = 0              # rows (and their pictures) older than this are deleted, oldest first (0: any age)
    db_quota = "2G"               # database pages in use at most; past it the oldest rows go
    min_free = "256M"             # free space kept on the audit trail's disk: under it the oldest pictures, then
                                  # rows, go and new pictures are not kept (a row is still written)

    [dashboard]
    enabled = true
    host = "127.0.0.1"            # another address needs token_file
    port = 8080
    token_file = "token.txt"

Every key is checked: an unknown one or a wrong type is one line naming it and what is valid. Relative paths
are relative to the file's folder.
"""

from __future__ import annotations

import math
import tomllib
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from apps.config_fields import integer as _int
from apps.config_fields import number as _number
from apps.config_fields import size as _size
from apps.config_fields import table as _table
from apps.config_fields import typed as _typed
from runtime.errors import BadInput

MAX_CONFIG_BYTES = 1 << 20
SECTIONS = ("source", "model", "policy", "plc", "audit", "dashboard")
KEYS = {
    "source": ("spec", "watch", "rate", "max_parts"),
    "model": ("ref", "canary", "threads", "batch", "target", "memory", "deadline_ms", "max_queue", "max_wait_ms"),
    "plc": ("url", "journal"),
    "audit": ("db", "quota", "pass_sample", "max_age_days", "db_quota", "min_free"),
    "dashboard": ("enabled", "host", "port", "token_file"),
}
TARGETS = ("auto", "cpu", "gpu", "npu")
DEFAULT_RATE = 20.0  # parts/s a file or folder is replayed at: the line speed the kiosk is built for
MIN_DB_QUOTA = 64 << 10  # bytes: a few pages of SQLite; less could not hold the schema


@dataclass(frozen=True)
class KioskConfig:
    source: str = ""
    watch: bool = False
    rate: float = DEFAULT_RATE
    max_parts: int = 0
    model: str = ""
    canary: float = 0.0
    threads: int | None = None
    batch: int = 8
    target: str = "auto"
    memory: int | None = None
    deadline_ms: float = 150.0
    max_queue: int = 32
    max_wait_ms: float = 5.0
    policy: dict[str, Any] = field(default_factory=dict)
    plc: str = ""
    plc_journal: Path | None = None
    audit_db: Path | None = None
    audit_quota: int = 512 << 20
    pass_sample: float = 0.02
    audit_max_age_days: float = 0.0  # 0: rows of any age are kept (the quotas still bound them)
    audit_db_quota: int = 2 << 30  # bytes of database pages in use
    audit_min_free: int = 256 << 20  # bytes left free on the audit trail's file system
    dashboard: bool = True
    host: str = "127.0.0.1"
    port: int = 8080
    token_file: Path | None = None
    path: Path | None = None  # the kiosk.toml it was read from (a reload reads it again)

    def checked(self) -> KioskConfig:
        """The whole configuration is usable (the things a file or a flag could not check alone); BadInput else."""
        if not self.source:
            raise BadInput("no source: give --source camera:N|FILE.mp4|DIR or [source] spec in kiosk.toml")
        if not self.model:
            raise BadInput("no model: give --model BUNDLE or [model] ref in kiosk.toml")
        if not self.plc:
            raise BadInput("no PLC: give --plc URL (serial:///dev/ttyX?baud=N, a tty path, modbus:///dev/ttyX?unit=N) "
                           "or [plc] url in kiosk.toml")
        if not (math.isfinite(self.deadline_ms) and 1 <= self.deadline_ms <= 3.6e6):
            raise BadInput(f"deadline_ms {self.deadline_ms:g} is out of range: use 1 to 3600000 ms")
        if self.dashboard and self.token_file is None:
            from apps.kiosk.dashboard import check_bind

            check_bind(self.host, None)
        return self


def read_config(path: str | Path) -> KioskConfig:
    """A KioskConfig from ``kiosk.toml``; one-line BadInput for an unreadable file, bad TOML or a bad key."""
    path = Path(path)
    try:
        if path.stat().st_size > MAX_CONFIG_BYTES:
            raise BadInput(f"{path}: {path.stat().st_size} bytes is too large for a kiosk.toml (at most 1 MiB)")
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise BadInput(f"{path}: no such kiosk config file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise BadInput(f"{path}: cannot read the kiosk config ({getattr(exc, 'strerror', None) or exc})") from None
    except tomllib.TOMLDecodeError as exc:
        raise BadInput(f"{path}: not valid TOML ({exc})") from None
    return replace(parse_config(data, path.parent), path=path)


def parse_config(data: dict[str, Any], base: Path = Path(".")) -> KioskConfig:
    top = _table("kiosk.toml", data, SECTIONS)
    sec = {name: _table(f"[{name}]", top.get(name, {}), KEYS.get(name, tuple(top.get(name, {})))) for name in SECTIONS}
    out: dict[str, Any] = {}
    s, m, p, a, d = sec["source"], sec["model"], sec["plc"], sec["audit"], sec["dashboard"]
    if "spec" in s:
        out["source"] = _typed("[source] spec", s["spec"], str, "camera:N, a video FILE or a DIR")
    if "watch" in s:
        out["watch"] = _typed("[source] watch", s["watch"], bool, "true or false")
    if "rate" in s:
        out["rate"] = _number("[source] rate", s["rate"], 0, 10_000)
    if "max_parts" in s:
        out["max_parts"] = _int("[source] max_parts", s["max_parts"], 0, 1 << 40)
    if "ref" in m:
        out["model"] = _typed("[model] ref", m["ref"], str, "a bundle or installed model name")
    if "canary" in m:
        out["canary"] = _number("[model] canary", m["canary"], 0, 1)
    if "threads" in m:
        out["threads"] = _int("[model] threads", m["threads"], 1, 256)
    if "batch" in m:
        out["batch"] = _int("[model] batch", m["batch"], 1, 256)
    if "target" in m:
        out["target"] = _typed("[model] target", m["target"], str, f"one of {', '.join(TARGETS)}")
        if out["target"] not in TARGETS:
            raise BadInput(f"[model] target {out['target']!r} is not valid: use one of {', '.join(TARGETS)}")
    if "memory" in m:
        out["memory"] = _size("[model] memory", m["memory"], minimum=1)
    if "deadline_ms" in m:
        out["deadline_ms"] = _number("[model] deadline_ms", m["deadline_ms"], 1, 3.6e6)
    if "max_queue" in m:
        out["max_queue"] = _int("[model] max_queue", m["max_queue"], 1, 1 << 20)
    if "max_wait_ms" in m:
        out["max_wait_ms"] = _number("[model] max_wait_ms", m["max_wait_ms"], 0, 10_000)
    out["policy"] = dict(sec["policy"])
    if "url" in p:
        out["plc"] = _typed("[plc] url", p["url"], str, "a PLC URL")
    if "journal" in p:
        out["plc_journal"] = base / _typed("[plc] journal", p["journal"], str, "a file path")
    if "db" in a:
        out["audit_db"] = base / _typed("[audit] db", a["db"], str, "a file path")
    if "quota" in a:
        out["audit_quota"] = _size("[audit] quota", a["quota"], minimum=0)
    if "pass_sample" in a:
        out["pass_sample"] = _number("[audit] pass_sample", a["pass_sample"], 0, 1)
    if "max_age_days" in a:
        out["audit_max_age_days"] = _number("[audit] max_age_days", a["max_age_days"], 0, 36_500)
    if "db_quota" in a:
        out["audit_db_quota"] = _size("[audit] db_quota", a["db_quota"], minimum=MIN_DB_QUOTA)
    if "min_free" in a:
        out["audit_min_free"] = _size("[audit] min_free", a["min_free"], minimum=0)
    if "enabled" in d:
        out["dashboard"] = _typed("[dashboard] enabled", d["enabled"], bool, "true or false")
    if "host" in d:
        out["host"] = _typed("[dashboard] host", d["host"], str, "a host name or address")
    if "port" in d:
        out["port"] = _int("[dashboard] port", d["port"], 0, 65535)
    if "token_file" in d:
        out["token_file"] = base / _typed("[dashboard] token_file", d["token_file"], str, "a file path")
    return KioskConfig(**out)


def merged(config: KioskConfig, **flags: Any) -> KioskConfig:
    """``config`` with every flag that was given (not None) in its place."""
    return replace(config, **{k: v for k, v in flags.items() if v is not None})
