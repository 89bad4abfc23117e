"""``edgerun kiosk --source camera:0|FILE.mp4|DIR --model BUNDLE --plc URL ...``: run the inspection kiosk.

Every captured part gets exactly one decision: to the PLC (journaled until acknowledged), into the audit trail
and onto the dashboard (http://127.0.0.1:8080/ unless --no-dashboard). Flags override kiosk.toml (--config;
apps/kiosk/config.py documents it). Runs until the source ends, --max-parts parts, or SIGINT/SIGTERM; SIGHUP
reloads kiosk.toml's [model] ref (a new version switched between parts, or canaried). Prints one summary line
(--json: the whole summary).

Exit codes: 0 every captured part was decided; 2 a bad flag, config, source, model or PLC URL (one line, nothing
started); 3 the model does not fit the memory budget; 4 a missing package; 6 the backend failed to load the
model; 1 capture broke or a part was left without a decision (a bug: the summary says which).
"""

from __future__ import annotations

import argparse
import signal
import sys
from pathlib import Path

from apps.cli.flags import integer, number

HELP = "run the inspection kiosk: camera/video/folder -> model -> PLC, audit trail and live dashboard"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--source", metavar="camera:N|FILE.mp4|DIR", help="where parts come from")
    parser.add_argument("--model", metavar="BUNDLE", help="a vision or anomaly bundle (dir, .edgerun or installed name)")
    parser.add_argument("--plc", metavar="URL", help="serial:///dev/ttyX?baud=N, a tty path, modbus:///dev/ttyX?unit=N, "
                        "socket://HOST:PORT")
    parser.add_argument("--deadline-ms", type=number(1, 3.6e6, "milliseconds"), metavar="MS",
                        help="a part without a decision this long after capture is rejected, fail-safe (default 150)")
    parser.add_argument("--port", type=integer(0, 65535), help="dashboard port (default 8080; 0: any free port)")
    parser.add_argument("--config", type=Path, metavar="kiosk.toml", help="settings file; flags override it")
    parser.add_argument("--max-parts", type=integer(1, 1 << 40), metavar="N", help="stop after N parts")
    parser.add_argument("--rate", type=number(0, 10_000, "parts/s"), metavar="N",
                        help="replay a FILE or DIR at N parts/s (default 20; 0: as fast as read)")
    parser.add_argument("--watch", action="store_true", default=None, help="DIR: keep picking up new images")
    parser.add_argument("--no-dashboard", action="store_true", help="do not serve the dashboard")
    parser.add_argument("--audit-db", type=Path, metavar="PATH", help="audit trail database (default $EDGERUN_HOME/kiosk/audit.db)")
    parser.add_argument("--plc-journal", type=Path, metavar="PATH",
                        help="PLC outbox journal (default $EDGERUN_HOME/kiosk/plc-journal.db)")
    parser.add_argument("--json", action="store_true", help="print the summary as JSON")


def main(args: argparse.Namespace) -> int:
    from apps.cli.common import print_json
    from apps.kiosk.app import Kiosk, summary_line
    from apps.kiosk.config import KioskConfig, merged, read_config

    base = read_config(args.config) if args.config is not None else KioskConfig()
    config = merged(base, source=args.source, model=args.model, plc=args.plc, deadline_ms=args.deadline_ms,
                    port=args.port, max_parts=args.max_parts, rate=args.rate, watch=args.watch,
                    dashboard=False if args.no_dashboard else None, audit_db=args.audit_db, plc_journal=args.plc_journal)
    kiosk = Kiosk(config)
    handlers = {}
    for sig, handler in ((signal.SIGINT, lambda *_: kiosk.stop()), (signal.SIGTERM, lambda *_: kiosk.stop()),
                         (signal.SIGHUP, lambda *_: kiosk.request_reload())):
        handlers[sig] = signal.signal(sig, handler)
    try:
        kiosk.start()
        print(f"edgerun: kiosk {plan_line(kiosk.residency.stats())}", file=sys.stderr, flush=True)
        if kiosk.dashboard is not None:
            print(f"edgerun: kiosk dashboard on {kiosk.dashboard.url}", file=sys.stderr, flush=True)
        try:
            kiosk.wait()
        finally:
            kiosk.close()
        summary = kiosk.summary()
    finally:
        for sig, old in handlers.items():
            signal.signal(sig, old)
    if args.json:
        print_json(summary)
    else:
        print(summary_line(summary))
    bad = summary["undecided"] or summary["twice"] or summary["capture_error"]
    return 1 if bad else 0


def plan_line(stats: dict[str, int]) -> str:
    """The memory plan of a started kiosk: its residency manager's (the models' plans and the reserve, within the
    model budget) and the kiosk process's own term (:data:`apps.kiosk.app.PROCESS_BYTES`)."""
    from apps.kiosk.app import PROCESS_BYTES

    models, reserve, mib = stats["used_bytes"], stats["reserve_bytes"], 2**20
    planned = models + reserve + PROCESS_BYTES
    return (f"memory plan {planned / mib:.1f} MiB planned of a {(stats['budget_bytes'] + PROCESS_BYTES) / mib:.1f} MiB "
            f"total: models {models / mib:.1f} + reserve {reserve / mib:.1f} of the {stats['budget_bytes'] / mib:.1f} "
            f"MiB model budget, and the kiosk process {PROCESS_BYTES / mib:.0f}")
