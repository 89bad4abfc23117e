"""The edgerun side of the soak as its own process, so the soak can SIGKILL it mid-stream.

``python -m tests.devices.soak_sender JOURNAL URL N``: submits results r<seq> until
the journal has assigned N sequence numbers (continuing where a killed run
stopped: a result that was never journaled never existed), then drains and exits 0.
"""

from __future__ import annotations

import sys

from devices.link.journal import Journal
from devices.link.sender import LinkConfig, ResultLink


def main(journal_path: str, url: str, total: int) -> int:
    with Journal(journal_path) as journal:
        with ResultLink(LinkConfig(url, ack_timeout_s=0.1), journal) as link:
            while (seq := journal.next_seq()) <= total:
                link.submit(f"r{seq}".encode())
            return 0 if link.drain(600) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2], int(sys.argv[3])))
