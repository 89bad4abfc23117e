"""``edgerun serial-peer URL``: the reference PLC side of a serial link, for bench tests and demos.

With the edgerun frame protocol it applies each result once (durably with
``--store``), prints it as one JSON line on stdout and acknowledges it. With
``--protocol modbus`` it is a Modbus RTU server that prints every write.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
import time

from apps.cli.flags import INT32_MAX, integer, seconds
from devices.link.transport import SerialURL

HELP = "run the reference PLC side of a serial link (edgerun frames or Modbus RTU) on URL"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("url", help="serial URL: /dev/ttyUSB0?baud=115200, a pty path, socket://HOST:PORT, rfc2217://HOST:PORT")
    parser.add_argument("--protocol", choices=("edgerun", "modbus"), default="edgerun", help="link protocol (default: edgerun frames)")
    parser.add_argument("--store", help="SQLite file for applied results; makes a restarted peer skip what it already applied")
    parser.add_argument("--count", type=integer(0, INT32_MAX), default=0, metavar="N",
                        help="exit after applying this many results (0: run until interrupted)")
    parser.add_argument("--trigger-every", type=seconds(86400), default=0.0, metavar="SECONDS",
                        help="send a 'trigger' COMMAND this often, at most once a day (0: never)")
    parser.add_argument("--quiet", action="store_true", help="do not print applied results")


def main(args: argparse.Namespace) -> int:
    SerialURL.parse(args.url)  # BadInput with the valid schemes, before anything opens
    stop = threading.Event()
    if threading.current_thread() is threading.main_thread():  # signals reach only the main thread
        signal.signal(signal.SIGTERM, lambda *_: stop.set())
    if args.protocol == "modbus":
        return _modbus(args, stop)
    return _frames(args, stop)


def _emit(record: dict[str, object], quiet: bool) -> None:
    if not quiet:
        sys.stdout.write(json.dumps(record) + "\n")
        sys.stdout.flush()


def _frames(args: argparse.Namespace, stop: threading.Event) -> int:
    from devices.link.peer import Applied, ReferencePeer

    applied = 0
    done = threading.Event()

    def on_apply(result: Applied) -> None:
        nonlocal applied
        applied += 1
        text = result.payload.decode("utf-8", errors="replace")
        _emit({"stream": result.stream.hex(), "seq": result.seq, "type": result.type.name, "payload": text}, args.quiet)
        if args.count and applied >= args.count:
            done.set()

    with ReferencePeer(args.url, args.store, on_apply=on_apply) as peer:
        peer.start()
        next_trigger = time.monotonic() + args.trigger_every
        try:
            while not stop.is_set() and not done.is_set():
                if args.trigger_every and time.monotonic() >= next_trigger:
                    peer.send_command(b"trigger")
                    next_trigger += args.trigger_every
                stop.wait(0.05)
        finally:
            peer.stop()
            print(json.dumps({"peer_stats": peer.stats.to_dict(), "decoder": peer.decoder_stats.to_dict()}), file=sys.stderr)
    return 0


def _modbus(args: argparse.Namespace, stop: threading.Event) -> int:
    from devices.link.modbus import PlcSimulator

    seen = 0
    with PlcSimulator(args.url) as plc:
        while not stop.is_set() and not (args.count and seen >= args.count):
            for fc, address, values in plc.writes[seen:]:
                _emit({"function": fc, "address": address, "values": values}, args.quiet)
                seen += 1
            stop.wait(0.05)
    return 0
