"""Serial link benchmark: result -> ACK round trip (p50/p99) and throughput in results/s.

Both ends are real ptys joined by devices.link.nullmodem; "115200" paces the
cable at 115200 baud 8N1 (10 bits per byte), as a USB-serial adapter to a PLC
would; "unpaced" shows the protocol's own ceiling. The journal runs with its
default durability (fsync per result). Prints a table; writes
bench/results/serial.json.

    python bench/serial.py [--samples 200] [--results 2000]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time

# Run as a script, this file's folder comes first on sys.path and this module named
# "serial" would shadow pyserial; put the repository root there instead.
_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != _HERE]
sys.path.insert(0, os.path.dirname(_HERE))

from devices.link.journal import Journal  # noqa: E402
from devices.link.nullmodem import NullModem, PtyEnd  # noqa: E402
from devices.link.peer import ReferencePeer  # noqa: E402
from devices.link.sender import LinkConfig, ResultLink  # noqa: E402

PAYLOAD = b'{"decision":"accept","score":0.973}'  # a typical kiosk result, 35 bytes


def run(baud: int | None, samples: int, results: int) -> dict[str, object]:
    with tempfile.TemporaryDirectory() as tmp:
        a, b = PtyEnd(os.path.join(tmp, "a")), PtyEnd(os.path.join(tmp, "b"))
        with NullModem(a, b, baud=baud), Journal(os.path.join(tmp, "j.db")) as journal, ReferencePeer(b.url, None) as peer:
            peer.start()
            with ResultLink(LinkConfig(a.url), journal) as link:
                link.wait_connected(10)
                latencies = []
                for _ in range(samples):
                    start = time.perf_counter()
                    link.submit(PAYLOAD)
                    if not link.drain(10):
                        raise RuntimeError("no ACK within 10 s")
                    latencies.append((time.perf_counter() - start) * 1e3)
                start = time.perf_counter()
                for _ in range(results):
                    link.submit(PAYLOAD)
                if not link.drain(120):
                    raise RuntimeError("throughput run did not drain")
                elapsed = time.perf_counter() - start
            peer.stop()
    latencies.sort()
    return {
        "line": f"{baud} baud" if baud else "unpaced pty",
        "samples": samples,
        "p50_ms": round(statistics.median(latencies), 3),
        "p99_ms": round(latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))], 3),
        "results": results,
        "results_per_s": round(results / elapsed, 1),
        "wire_bytes_per_result": 11 + len(PAYLOAD),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=200)
    parser.add_argument("--results", type=int, default=2000)
    args = parser.parse_args()
    rows = [run(115200, args.samples, args.results), run(None, args.samples, args.results)]
    load = os.getloadavg()
    print(f"{'line':<14} {'p50 ms':>8} {'p99 ms':>8} {'results/s':>10}")
    for r in rows:
        print(f"{r['line']:<14} {r['p50_ms']:>8.2f} {r['p99_ms']:>8.2f} {r['results_per_s']:>10.1f}")
    print(f"(load average before/after: {load[0]:.2f}; {os.cpu_count()} CPUs; journal fsync per result)")
    out = {
        "rows": rows,
        "machine": {"python": platform.python_version(), "cpus": os.cpu_count(), "load_avg_1m": round(load[0], 2)},
        "when": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "serial.json")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as fh:
        json.dump(out, fh, indent=2)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
