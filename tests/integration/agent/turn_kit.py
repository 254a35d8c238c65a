"""Shared pieces of the turn tests: a private server, the agent mounted in the test's loop (or as
processes), a gateway stand-in that appends `TurnRequested` itself, and log readers.

Each test gets its own nats-server: the turn consumers are durable and shared by every agent on
a server, so a turn a previous test left held would otherwise land in this test's agent.
"""

import contextlib
import logging
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from nats.aio.client import Client
from nats.errors import NoRespondersError
from nats.errors import TimeoutError as NatsTimeout
from nats.js import JetStreamContext
from nats.js.api import ConsumerInfo

from fleet_agent.config import AgentSettings
from fleet_events import Actor, Envelope, Event, bus, new_id, streams, utc_now
from fleet_events.bus import Ping
from fleet_events.codec import Codec, CodecError
from fleet_events.session import (
    CancelRequested,
    TurnCancelled,
    TurnCompleted,
    TurnFailed,
    TurnRequested,
    log_subject,
)
from fleet_harness import agent_fakes
from fleet_harness.procs import Launcher, Replica
from fleet_harness.waits import eventually
from fleet_mesh import rpc
from fleet_mesh.blobs import JetStreamBlobs
from fleet_mesh.bootstrap import bootstrap
from fleet_mesh.connection import connect
from fleet_mesh.natsserver import NatsServer
from fleet_mesh.service import ServiceContext
from fleet_mesh.store import AppendConflict, EventStore, StoredEvent, open_store

GATEWAY = Actor(service="gateway", replica="test")
TERMINAL = (TurnCompleted, TurnFailed, TurnCancelled)


@pytest.fixture
def server(tmp_path: Path) -> Iterator[NatsServer]:
    """A server of this test's own (the agent's consumers are shared by everything on one)."""
    nats = NatsServer(
        store_dir=tmp_path / "store", sync_interval="2m", log_path=tmp_path / "nats.log"
    ).start()
    yield nats
    nats.stop()


@dataclass
class Mesh:
    nc: Client
    js: JetStreamContext
    store: EventStore
    codec: Codec
    barriers: Path

    async def request(
        self, tenant: str, session: str, message: str, turn: str | None = None
    ) -> str:
        """What the gateway does: append a `TurnRequested` to the session's log (reloading the
        head when another writer got there first)."""
        turn = turn or new_id()
        await self.append(tenant, session, turn, TurnRequested(message=message))
        return turn

    async def cancel(self, tenant: str, session: str, turn: str, reason: str = "user") -> None:
        await self.append(tenant, session, turn, CancelRequested(reason=reason))

    async def append(self, tenant: str, session: str, turn: str | None, event: Event) -> int:
        envelope = Envelope(
            id=new_id(), tenant=tenant, session=session, turn=turn,
            actor=GATEWAY, ts=utc_now(), data=event,
        )  # fmt: skip
        for _ in range(50):
            try:
                return (await self.store.append(log_subject(tenant, session), envelope)).seq
            except AppendConflict:
                continue
        raise AssertionError("the log kept moving")

    async def events(self, tenant: str, session: str) -> list[StoredEvent]:
        """The log, skipping what this version cannot decode (a newer replica's types)."""
        found = []
        async for raw in self.store.read_raw(log_subject(tenant, session)):
            try:
                envelope = await self.codec.decode(raw.data, tenant=tenant)
            except CodecError:
                continue
            found.append(StoredEvent(raw.subject, raw.seq, envelope, "", ""))
        return found

    async def of_turn(self, tenant: str, session: str, turn: str) -> list[Event]:
        return [
            e.envelope.data for e in await self.events(tenant, session) if e.envelope.turn == turn
        ]

    async def ended(self, tenant: str, session: str, turn: str) -> Event | None:
        """The turn's terminal event, once there is one (for `eventually`)."""
        for event in await self.of_turn(tenant, session, turn):
            if isinstance(event, TERMINAL):
                return event
        return None

    async def wait_ended(
        self, tenant: str, session: str, turn: str, timeout: float = 20.0
    ) -> Event:
        async def probe() -> Event | None:
            return await self.ended(tenant, session, turn)

        return await eventually(probe, timeout=timeout, what=f"turn {turn} to end")

    def release(self, name: str) -> None:
        (self.barriers / name).write_text("go")

    async def reached(self, name: str, attempt: int = 1, timeout: float = 20.0) -> str:
        """The replica holding barrier `name` at `attempt` (the scripted fake writes it)."""
        marker = self.barriers / f"{name}.reached.{attempt}"

        def holder() -> str | None:
            return marker.read_text() if marker.exists() else None

        return await eventually(
            holder,
            timeout=timeout, what=f"barrier {name} (attempt {attempt}) to be reached",
        )  # fmt: skip

    async def turn_consumer(self) -> ConsumerInfo:
        info: ConsumerInfo = await self.js.consumer_info(
            streams.WORK.name, streams.TURN_WORKERS.durable
        )
        return info


@contextlib.asynccontextmanager
async def mesh(server: NatsServer, barriers: Path) -> AsyncIterator[Mesh]:
    nc = await connect(server.url, name="turn-test")
    js = nc.jetstream()
    await bootstrap(js, env={})
    try:
        codec = Codec(await JetStreamBlobs.open(js))
        yield Mesh(nc, js, await open_store(js, streams.SESSIONS), codec, barriers)
    finally:
        await nc.close()


def settings(barriers: Path, **overrides: Any) -> AgentSettings:
    values: dict[str, Any] = {"runner": "scripted", "barrier_dir": barriers, "turn_slots": 2}
    values.update(overrides)
    return AgentSettings(**values)


@contextlib.asynccontextmanager
async def agent(
    server: NatsServer, agent_settings: AgentSettings, replica: str = "agent-0"
) -> AsyncIterator[ServiceContext]:
    """The agent's composition root mounted in the test's own loop, as `main()` builds it."""
    nc = await connect(server.url, name=f"agent:{replica}")
    ctx = ServiceContext(
        name="agent", replica=replica, nc=nc, js=nc.jetstream(),
        log=logging.getLogger(f"fleet.agent.{replica}"),
    )  # fmt: skip
    try:
        await agent_fakes.setup(ctx, agent_settings)
        yield ctx
    finally:
        for hook in reversed(ctx.on_stop):
            await hook()
        await nc.close()


def agent_env(barriers: Path, **values: Any) -> dict[str, str]:
    env = {
        "FLEET_AGENT_RUNNER": "scripted",
        "FLEET_AGENT_BARRIER_DIR": str(barriers),
        "FLEET_AGENT_TURN_SLOTS": "1",
        "FLEET_AGENT_ACK_WAIT_S": "1",
    }
    env.update({f"FLEET_AGENT_{k.upper()}": str(v) for k, v in values.items()})
    return env


async def wait_ready(nc: Client, replicas: list[Replica]) -> None:
    """Ping is served after setup: a pong from a replica means its consumers are pulling."""
    wanted = {r.env["FLEET_REPLICA"] for r in replicas}
    seen: set[str] = set()

    async def all_seen() -> bool:
        with contextlib.suppress(NatsTimeout, NoRespondersError, TimeoutError):
            pong = await rpc.call_verb(nc, bus.ping("agent"), Ping(), timeout=0.5)
            seen.add(pong.replica)
        return wanted <= seen

    await eventually(all_seen, timeout=30, interval=0.0, what=f"agent replicas {sorted(wanted)}")


def launcher(server: NatsServer, tmp_path: Path) -> Launcher:
    logs = tmp_path / "logs"
    logs.mkdir(exist_ok=True)
    return Launcher(nats_url=server.url, log_dir=logs)
