"""A mesh for recursive-engine tests: a server of the module's own, a real sandbox broker, a
real budget service and agent replicas (`FLEET_AGENT_RUNNER=rlm`) as processes, and the
scripted LM (a FAKE model server, in this process on loopback) behind each tenant's profiles.

The agent's turn consumers are durable and shared by every agent on a server, so the module
has its own server: no other test's turn lands on these replicas.
"""

import contextlib
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from nats.aio.client import Client

from fleet_agent.engine import root_run_id, tree_id
from fleet_events import Actor, Envelope, Event, bus, new_id, streams, utc_now
from fleet_events import sandbox as sb
from fleet_events.budget import GetStatus, TreeStatus
from fleet_events.codec import Codec, CodecError
from fleet_events.llm import LlmProfile
from fleet_events.sandbox import sandbox_subject
from fleet_events.session import (
    SandboxAttached,
    TurnCancelled,
    TurnCompleted,
    TurnFailed,
    TurnRequested,
    log_subject,
    run_subject,
)
from fleet_harness.procs import Replica, start_answering
from fleet_harness.scripted_lm import ScriptedLM
from fleet_harness.waits import eventually
from fleet_mesh import rpc
from fleet_mesh.blobs import JetStreamBlobs
from fleet_mesh.bootstrap import bootstrap
from fleet_mesh.connection import connect
from fleet_mesh.natsserver import NatsServer
from fleet_mesh.runtime_config import LlmConfig
from fleet_mesh.secrets import ensure_keypair
from fleet_mesh.store import AppendConflict, EventStore, open_store

GATEWAY = Actor(service="gateway", replica="test")
TERMINAL = (TurnCompleted, TurnFailed, TurnCancelled)


def fields(**values: object) -> str:
    """A reply in dspy's ChatAdapter format (what RLM's action step parses)."""
    body = "".join(f"[[ ## {name} ## ]]\n{value}\n\n" for name, value in values.items())
    return body + "[[ ## completed ## ]]\n"


def step(code: str, reasoning: str = "next") -> str:
    return fields(reasoning=reasoning, code=f"```python\n{code}\n```")


@dataclass
class Processes:
    server: NatsServer
    sandboxes: Path
    replicas: list[Replica] = field(default_factory=list)


def start_mesh(
    root: Path,
    agent_env: dict[str, str],
    broker_env: dict[str, str] | None = None,
    agents: int = 1,
    budget_env: dict[str, str] | None = None,
    sync_interval: str = "2m",
) -> Processes:
    """`sync_interval`: the server's fsync interval ("always" for a test that kills it: what
    was acknowledged and not synced would be lost, as on a crash of a real node)."""
    server = NatsServer(
        store_dir=root / "store", sync_interval=sync_interval, log_path=root / "nats.log"
    ).start()
    keys = ensure_keypair(root / "secrets")
    sandboxes = root / "sandboxes"
    running = Processes(server, sandboxes)
    try:
        running.replicas.append(
            start_answering(
                "sandbox-broker", server.url, root / "broker.log",
                {
                    "FLEET_SANDBOX_ROOT": str(sandboxes), "FLEET_SANDBOX_UID_BASE": "340000",
                    "FLEET_SANDBOX_UID_COUNT": "512", **(broker_env or {}),
                },
            )
        )  # fmt: skip
        running.replicas.append(
            start_answering("budget", server.url, root / "budget.log", budget_env or {})
        )
        env = {
            "FLEET_AGENT_RUNNER": "rlm",
            "FLEET_SECRETS_KEY": str(keys.private),
            "LITELLM_LOCAL_MODEL_COST_MAP": "True",
            **agent_env,
        }
        for index in range(agents):
            log = root / f"agent-{index}.log"
            running.replicas.append(start_answering("agent", server.url, log, env))
    except BaseException:
        stop_mesh(running)
        raise
    return running


def stop_mesh(running: Processes) -> None:
    for replica in reversed(running.replicas):
        replica.stop()
    running.server.stop()


@pytest.fixture(scope="module")
def processes(
    tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest
) -> Iterator[Processes]:
    env: dict[str, str] = getattr(request.module, "AGENT_ENV", {})
    broker: dict[str, str] = getattr(request.module, "BROKER_ENV", {})
    agents: int = getattr(request.module, "AGENTS", 1)
    budget: dict[str, str] = getattr(request.module, "BUDGET_ENV", {})
    sync: str = getattr(request.module, "NATS_SYNC", "2m")
    running = start_mesh(tmp_path_factory.mktemp("rlm-mesh"), env, broker, agents, budget, sync)
    yield running
    stop_mesh(running)


@dataclass
class Session:
    """One tenant and session of a test's own, with a gateway stand-in that appends turns."""

    nc: Client
    store: EventStore
    codec: Codec
    tenant: str
    session: str

    async def use_model(
        self, fake: ScriptedLM, roles: tuple[str, ...] = ("planner", "delegate"), **fields: Any
    ) -> None:
        config = await LlmConfig.open(self.nc.jetstream())
        profile = LlmProfile(
            name="scripted", model="openai/scripted", api_base=fake.base_url, **fields
        )
        await config.put_profile(profile, tenant=self.tenant)
        for role in roles:
            await config.set_role(role, profile.name, tenant=self.tenant)

    async def ask(self, message: str) -> str:
        turn = new_id()
        await self.append(turn, TurnRequested(message=message))
        return turn

    async def append(self, turn: str | None, event: Event) -> None:
        subject = log_subject(self.tenant, self.session)
        for _ in range(50):
            envelope = Envelope(
                id=new_id(), tenant=self.tenant, session=self.session, turn=turn,
                actor=GATEWAY, ts=utc_now(), data=event,
            )  # fmt: skip
            try:
                await self.store.append(subject, envelope)
                return
            except AppendConflict:
                continue
        raise AssertionError("the log kept moving")

    async def read(self, subject: str) -> list[Envelope[Any]]:
        found = []
        async for raw in self.store.read_raw(subject):
            with contextlib.suppress(CodecError):
                found.append(await self.codec.decode(raw.data, tenant=self.tenant))
        return found

    async def log(self) -> list[Event]:
        return [e.data for e in await self.read(log_subject(self.tenant, self.session))]

    async def run_events(self, turn: str) -> list[Event]:
        return await self.events_of(root_run_id(self.tenant, self.session, turn))

    async def events_of(self, run: str) -> list[Event]:
        return [e.data for e in await self.read(run_subject(self.tenant, self.session, run))]

    async def head_of(self, run: str) -> str:
        last = await self.store.last(run_subject(self.tenant, self.session, run))
        assert last is not None, f"run {run} has no events"
        return last.hash

    async def sandbox_events(self, sandbox: str) -> list[Event]:
        js = self.nc.jetstream()
        store = EventStore(js, streams.SANDBOXES, self.codec)
        return [s.envelope.data async for s in store.replay(sandbox_subject(self.tenant, sandbox))]

    async def ended(self, turn: str, timeout: float = 60.0) -> Event:
        async def probe() -> Event | None:
            for envelope in await self.read(log_subject(self.tenant, self.session)):
                if envelope.turn == turn and isinstance(envelope.data, TERMINAL):
                    return envelope.data
            return None

        return await eventually(probe, timeout=timeout, what=f"turn {turn} to end")

    async def tree(self, turn: str) -> TreeStatus:
        query = GetStatus(tree=tree_id(self.tenant, self.session, turn))
        return await rpc.call_verb(self.nc, bus.TREE_STATUS, query, timeout=5)

    async def workspace(self) -> Path:
        """The session sandbox's workspace on the host, as its broker knows it (the session's
        record names the sandbox, never a host path)."""
        for event in await self.log():
            if isinstance(event, SandboxAttached) and event.interpreter.sandbox:
                sandbox = event.interpreter.sandbox
                ask = sb.GetSandbox(request_id=new_id(), tenant=self.tenant, sandbox=sandbox)
                info = await rpc.call_verb(
                    self.nc, bus.GET_SANDBOX, ask, target=sandbox, timeout=10
                )
                return Path(info.workspace)
        raise AssertionError("no sandbox attached to the session")


@contextlib.asynccontextmanager
async def session(processes: Processes) -> AsyncIterator[Session]:
    nc = await connect(processes.server.url, name="rlm-test")
    try:
        js = nc.jetstream()
        await bootstrap(js, env={})
        yield Session(
            nc, await open_store(js, streams.SESSIONS), Codec(await JetStreamBlobs.open(js)),
            tenant=f"t{new_id()[:10]}", session=new_id(),
        )  # fmt: skip
    finally:
        await nc.close()


def of_type(events: list[Event], kind: type[Any]) -> list[Any]:
    return [e for e in events if isinstance(e, kind)]
