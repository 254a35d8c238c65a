"""The gateway app served by real uvicorn in the test's loop (real sockets, so a client that
stops reading really backs the server up), tokens and tickets for a tenant, a WebSocket
client, and a writer that appends to a session's log the way another service would."""

import asyncio
import contextlib
import json
import socket
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import uvicorn
from nats.js import JetStreamContext
from websockets.asyncio.client import ClientConnection, connect
from websockets.client import ClientProtocol
from websockets.exceptions import ConnectionClosed
from websockets.frames import Frame, Opcode
from websockets.uri import parse_uri

from fleet_events import Actor, Envelope, Event, new_id, streams, utc_now
from fleet_events.session import log_subject
from fleet_gateway.app import create_app
from fleet_gateway.config import GatewaySettings
from fleet_harness.waits import eventually
from fleet_mesh.natsserver import free_port
from fleet_mesh.store import AppendConflict, EventStore, open_store
from fleet_mesh.tokens import issue_token, signing_secret

OTHER = Actor(service="agent", replica="test")


class _Server(uvicorn.Server):
    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:  # the test runner owns the signals
        yield


@dataclass
class Gateway:
    url: str
    data_dir: Path

    @property
    def ws_url(self) -> str:
        return self.url.replace("http://", "ws://")

    def token(self, tenant: str, user: str = "u") -> str:
        return issue_token(signing_secret(self.data_dir), tenant=tenant, user=user)

    async def ticket(self, tenant: str, user: str = "u") -> str:
        async with httpx.AsyncClient(base_url=self.url) as client:
            response = await client.post(
                "/api/v1/auth/ws-ticket",
                headers={"Authorization": f"Bearer {self.token(tenant, user)}"},
            )
        assert response.status_code == 200, response.text
        return str(response.json()["ticket"])

    def client(self, tenant: str) -> httpx.AsyncClient:
        return httpx.AsyncClient(
            base_url=self.url, headers={"Authorization": f"Bearer {self.token(tenant)}"},
            timeout=30,
        )  # fmt: skip

    async def socket(
        self, tenant: str, path: str = "/api/v1/ws/execution", **query: Any
    ) -> ClientConnection:
        params = {"ticket": await self.ticket(tenant), **{k: str(v) for k, v in query.items()}}
        qs = "&".join(f"{k}={v}" for k, v in params.items())
        return await connect(f"{self.ws_url}{path}?{qs}", max_size=None)


@contextlib.asynccontextmanager
async def serve(
    nats_url: str, data_dir: Path, replica: str = "gateway-0", **settings: Any
) -> AsyncIterator[Gateway]:
    """One gateway replica on a free port; replicas sharing `data_dir` share the signing
    secret (as `fleet up`'s do) and each keeps its own read models."""
    port = free_port()
    app = create_app(
        GatewaySettings(data_dir=data_dir, port=port, **settings),
        replica=replica, nats_url=nats_url,
    )  # fmt: skip
    config = uvicorn.Config(app, host="127.0.0.1", port=port, log_config=None, lifespan="on")
    server = _Server(config)
    task = asyncio.create_task(server.serve())
    await eventually(lambda: server.started or task.done(), timeout=30, what="gateway to listen")
    if task.done():
        await task
    try:
        yield Gateway(url=f"http://127.0.0.1:{port}", data_dir=data_dir)
    finally:
        server.should_exit = True
        await asyncio.wait_for(task, 30)


@dataclass
class Writer:
    """Appends to a session's log as another service would (not through the gateway)."""

    store: EventStore

    async def append(self, tenant: str, session: str, data: Event, turn: str | None = None) -> int:
        envelope = Envelope(
            id=new_id(), tenant=tenant, session=session, turn=turn, actor=OTHER, ts=utc_now(),
            data=data,
        )  # fmt: skip
        for _ in range(50):
            try:
                return (await self.store.append(log_subject(tenant, session), envelope)).seq
            except AppendConflict:
                continue
        raise AssertionError("the log kept moving")


async def writer(js: JetStreamContext) -> Writer:
    return Writer(await open_store(js, streams.SESSIONS))


async def frames_until(
    ws: ClientConnection, done: Any, *, timeout: float = 20.0
) -> list[dict[str, Any]]:
    """Frames read until `done(frames)` is true (bounded)."""
    got: list[dict[str, Any]] = []

    async def read() -> None:
        while not done(got):
            got.append(json.loads(await ws.recv()))

    try:
        await asyncio.wait_for(read(), timeout)
    except TimeoutError:
        raise AssertionError(f"timed out after {timeout}s; frames so far: {got}"[:3000]) from None
    return got


def seqs(frames: list[dict[str, Any]]) -> list[int]:
    return [f["seq"] for f in frames if f["type"] == "event"]


class StalledClient:
    """A WebSocket client that reads nothing until told to: a tiny receive window and a
    4 KiB stream buffer, so the server's socket backs up for real (the `websockets` client
    keeps reading into its own buffers even with `max_queue=1`)."""

    def __init__(self, url: str) -> None:
        self.uri = parse_uri(url)
        self.proto = ClientProtocol(self.uri, max_size=None)
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def open(self) -> None:
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.connect((self.uri.host, self.uri.port))
        sock.setblocking(False)
        self.reader, self.writer = await asyncio.open_connection(sock=sock, limit=4096)
        self.proto.send_request(self.proto.connect())
        self.writer.write(b"".join(self.proto.data_to_send()))
        await self.writer.drain()

    async def read_all(self, timeout: float = 30.0) -> tuple[list[dict[str, Any]], int, str]:
        """Every text frame until the server's close: (frames, close code, close reason)."""
        assert self.reader is not None
        assert self.writer is not None
        frames: list[dict[str, Any]] = []

        async def read() -> None:
            assert self.reader is not None
            while self.proto.close_rcvd is None:
                data = await self.reader.read(65536)
                if not data:
                    return
                self.proto.receive_data(data)
                for event in self.proto.events_received():
                    if isinstance(event, Frame) and event.opcode is Opcode.TEXT:
                        frames.append(json.loads(bytes(event.data)))

        await asyncio.wait_for(read(), timeout)
        self.writer.close()
        close = self.proto.close_rcvd
        return frames, (close.code if close else 1006), (close.reason if close else "")


async def read_or_closed(
    ws: ClientConnection, done: Any, *, timeout: float = 20.0
) -> tuple[list[dict[str, Any]], int | None]:
    """Frames read until `done(frames)` or the server closes: (frames, its close code)."""
    got: list[dict[str, Any]] = []
    code: int | None = None

    async def read() -> None:
        nonlocal code
        try:
            while not done(got):
                got.append(json.loads(await ws.recv()))
        except ConnectionClosed as exc:
            code = exc.rcvd.code if exc.rcvd is not None else 1006

    await asyncio.wait_for(read(), timeout)
    return got, code
