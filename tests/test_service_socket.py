"""The HTTP socket `ens serve` binds itself (to report a busy port before start-up)."""

from __future__ import annotations

import asyncio
import socket

from adapters.service.server import listen


def test_connections_of_the_http_socket_send_without_delay() -> None:
    """asyncio sets TCP_NODELAY only on connections of an IPPROTO_TCP socket; without it a
    keep-alive client (a gateway posting event by event) waited ~40 ms per request for the
    delayed ACK that lets Nagle's algorithm send the response's second segment."""
    sock = listen("127.0.0.1", 0)
    port = sock.getsockname()[1]

    async def accepted_nodelay() -> int:
        seen: dict[str, int] = {}

        async def on_conn(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            seen["nodelay"] = writer.get_extra_info("socket").getsockopt(
                socket.IPPROTO_TCP, socket.TCP_NODELAY
            )
            writer.close()

        server = await asyncio.start_server(on_conn, sock=sock)
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        await reader.read()  # until the server closes it
        writer.close()
        server.close()
        await server.wait_closed()
        return seen["nodelay"]

    assert asyncio.run(accepted_nodelay()) != 0
