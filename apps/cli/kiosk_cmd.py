"""``edgerun kiosk [ACTION] ...``: the inspection kiosk's commands, each imported only when it runs.

Without an action it runs the kiosk: ``edgerun kiosk --source ... --model ... --plc URL`` (apps/kiosk/run_cmd.py).

``teach`` builds an anomaly bundle from images of good parts (apps/kiosk/teach_cmd.py).
``report`` exports the audit trail since a time as CSV (apps/kiosk/report_cmd.py).
"""

from __future__ import annotations

import argparse
import importlib

from runtime.errors import BadInput

HELP = "the inspection kiosk: run it (--source, --model, --plc), teach an anomaly bundle (kiosk teach --help)"
ACTIONS = {
    "teach": "apps.kiosk.teach_cmd",
    "report": "apps.kiosk.report_cmd",
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from apps.kiosk import run_cmd

    run_cmd.add_arguments(parser)  # no action: run the kiosk
    sub = parser.add_subparsers(dest="action", metavar="ACTION", required=False)
    for action, module in ACTIONS.items():
        mod = importlib.import_module(module)
        mod.add_arguments(sub.add_parser(action, help=mod.HELP, description=mod.HELP))


def main(args: argparse.Namespace) -> int:
    if args.action is None:
        from apps.kiosk import run_cmd

        return int(run_cmd.main(args) or 0)
    if args.action not in ACTIONS:
        raise BadInput(f"unknown kiosk action {args.action!r}; valid: {', '.join(ACTIONS)}")
    return int(importlib.import_module(ACTIONS[args.action]).main(args) or 0)
