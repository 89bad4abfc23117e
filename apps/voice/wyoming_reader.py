"""The reader a Wyoming connection's events come through: each header checked and each read bounded in size and time
before the ``wyoming`` package's reader sees it (apps/voice/wyoming_server.py)."""

from __future__ import annotations

import asyncio
import json
from typing import Any


class CheckedReader:
    """The connection's StreamReader, with each event's header checked and its sizes bounded before the wyoming
    package reads them (it would otherwise wait for, and hold, whatever length a header names), and each read given
    ``idle_s`` to complete (a client that sends nothing, or half an event, would otherwise hold its connection
    forever). A refused event raises ValueError, which the package's reader takes as the end of the stream;
    ``refused`` says why, ``code`` is the error event's code."""

    def __init__(self, reader: asyncio.StreamReader, max_bytes: int, idle_s: float) -> None:
        self._reader, self._max, self._idle = reader, max_bytes, idle_s
        self.refused: str | None = None
        self.code = "bad-event"

    async def readline(self) -> bytes:
        try:
            line = await asyncio.wait_for(self._reader.readline(), self._idle)
        except ValueError:  # asyncio's line limit (64 KiB)
            return self._refuse("an event header is longer than the 64 KiB line limit")
        except TimeoutError:
            self.code = "timeout"
            return self._refuse(f"no event for {self._idle:g} s (the idle limit, --idle-timeout): closing the connection")
        if line:
            self._check_header(line)
        return line

    def _check_header(self, line: bytes) -> None:
        try:
            header = json.loads(line)
        except ValueError:
            self._refuse(f"an event header is not JSON: {line[:60]!r}")
        if not isinstance(header, dict) or not isinstance(header.get("type"), str):
            self._refuse(f"an event header has no type: {line[:60]!r}")
        if "data" in header and not isinstance(header["data"], dict):
            self._refuse(f"{header['type']} event: its data is not an object")
        for key in ("data_length", "payload_length"):
            n = header.get(key)
            if n is not None and (isinstance(n, bool) or not isinstance(n, int) or n < 0):
                self._refuse(f"{header['type']} event: {key} {n!r} is not a byte count")
            if n is not None and n > self._max:
                self._refuse(f"{header['type']} event: {key} {n} is over the {self._max} byte limit")

    def _refuse(self, why: str) -> Any:
        self.refused = why
        raise ValueError(why)

    async def readexactly(self, n: int) -> bytes:
        try:
            return await asyncio.wait_for(self._reader.readexactly(n), self._idle)
        except TimeoutError:
            self.code = "timeout"
            return self._refuse(f"an event's {n} bytes of data or payload did not arrive within {self._idle:g} s (the "
                                "idle limit, --idle-timeout): closing the connection")

    def feed_eof(self) -> None:
        self._reader.feed_eof()
