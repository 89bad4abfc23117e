"""uvicorn's Server with a shutdown that ends in-flight answers cleanly.

uvicorn stops accepting, waits ``timeout_graceful_shutdown`` seconds for the answers in flight, then cancels their
tasks: a whole answer became a bare text/plain 500 and a stream stopped mid-event, without an error or ``[DONE]``.
Here the answers still running a moment before that grace ends are stopped through their engine handles, so each
ends as the API says: a 503 ``shutting_down`` error, or a stream's error event and ``[DONE]``.
"""

from __future__ import annotations

import asyncio
import socket

import uvicorn

from apps.server.state import ServerState

STOP_MARGIN_S = 1.0  # before the grace ends: time for the stopped answers to send their last bytes


class DrainingServer(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, state: ServerState) -> None:
        super().__init__(config)
        self.state = state

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        grace = self.config.timeout_graceful_shutdown
        if grace is not None:
            asyncio.get_running_loop().call_later(max(0.0, grace - STOP_MARGIN_S), self.state.stop_generations)
        await super().shutdown(sockets)


def listen(host: str, port: int) -> socket.socket:
    """A listening socket on ``host:port``; one line when it cannot be had."""
    from runtime.errors import BadInput

    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
        family, kind, proto, _, address = infos[0]
        sock = socket.socket(family, kind, proto)
    except OSError as exc:
        raise BadInput(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(128)
    except OSError as exc:
        sock.close()
        raise BadInput(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    return sock
