"""Issue 27 item 4: slow-loris clients are dropped. Each byte a client sends cancels uvicorn's
keep-alive timer and nothing re-arms it until a response completes, so connections trickling
one header line at a time were held forever (3,000 held in the hostile-tenant test). Replayed
against the gateway's own HTTP server (`app.serve_http`) on a real socket: 40 such
connections are closed by the head deadline (1 s here), while a client that sends its request
gets its answers on the same server, request after request on one kept-alive connection."""

import asyncio
import contextlib
from pathlib import Path

import httpx

from fleet_gateway.app import create_app, serve_http
from fleet_gateway.config import GatewaySettings
from fleet_mesh.natsserver import NatsServer, free_port

SLOW = 40
HEAD = b"GET /health HTTP/1.1\r\nHost: gateway\r\n"


async def trickle(port: int, closed: list[float]) -> None:
    """A header line every 200 ms, never the blank line that ends the head, until the server
    closes the connection (EOF, or a reset on the next write)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    started = asyncio.get_running_loop().time()
    writer.write(HEAD)
    try:
        for n in range(100):
            await writer.drain()
            with contextlib.suppress(TimeoutError):
                if await asyncio.wait_for(reader.read(1024), 0.2) == b"":
                    break
            writer.write(f"X-Slow-{n}: 1\r\n".encode())
    except ConnectionError:
        pass
    else:
        if not reader.at_eof():
            return  # still held after 20 s: not appended, the test's count fails
    closed.append(asyncio.get_running_loop().time() - started)
    writer.close()


async def test_slow_loris_connections_are_closed_and_real_clients_served(
    nats_server: NatsServer, tmp_path: Path
) -> None:
    port = free_port()
    settings = GatewaySettings(data_dir=tmp_path / "gw", port=port, header_timeout_s=1.0)
    app = create_app(settings, replica="gateway-slow", nats_url=nats_server.url)
    async with app.router.lifespan_context(app):
        stop = await serve_http(app, settings)
        try:
            closed: list[float] = []
            slow = [asyncio.create_task(trickle(port, closed)) for _ in range(SLOW)]
            async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as client:
                for _ in range(3):  # one kept-alive connection: the deadline re-arms per request
                    assert (await client.get("/health")).status_code == 200
            await asyncio.gather(*slow)
            assert len(closed) == SLOW, f"{SLOW - len(closed)} slow connections still held"
            assert max(closed) < 10, closed  # the deadline, not the 20 s the clients would last
        finally:
            await stop()
