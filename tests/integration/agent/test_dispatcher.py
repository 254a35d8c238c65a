"""The dispatcher against a real nats-server: a request stored while no agent runs still gets
its turn; a redelivered log message publishes no second work item; and the attacks: a turn id
reused by another tenant, a turn id that is not a subject token, a cancel sent from another
tenant's session, and an event type this replica does not know."""

import json
import logging
from pathlib import Path

import pytest
from nats.js.api import StreamInfo

from fleet_agent.dispatcher import Dispatcher
from fleet_agent.turn_log import TurnLog
from fleet_events import new_id, streams
from fleet_events.codec import Codec
from fleet_events.session import (
    TurnCompleted,
    TurnRefused,
    TurnRequested,
    TurnStarted,
    log_subject,
)
from fleet_harness.waits import eventually
from fleet_mesh.blobs import JetStreamBlobs
from fleet_mesh.natsserver import NatsServer
from fleet_mesh.store import EMPTY
from fleet_mesh.store.headers import append_headers
from fleet_mesh.work import Delivery, Settle

from .turn_kit import GATEWAY, Mesh, agent, mesh, settings
from .turn_kit import server as server

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def barriers(tmp_path: Path) -> Path:
    path = tmp_path / "barriers"
    path.mkdir()
    return path


def tenant() -> str:
    return f"t-{new_id()[:10]}"


async def work_items(m: Mesh) -> int:
    info: StreamInfo = await m.js.stream_info(streams.WORK.name)
    return info.state.messages


async def test_a_request_stored_while_no_agent_runs_is_run_when_one_starts(
    server: NatsServer, barriers: Path
) -> None:
    """The gateway may die right after its append: the request is the durable record."""
    async with mesh(server, barriers) as m:
        t = tenant()
        turn = await m.request(t, "s", "stored before any agent")
        async with agent(server, settings(barriers)):
            ended = await m.wait_ended(t, "s", turn)
        assert ended == TurnCompleted(answer="stored before any agent")


async def test_a_redelivered_request_publishes_no_second_work_item(
    server: NatsServer, barriers: Path
) -> None:
    async with mesh(server, barriers) as m:
        t = tenant()
        turn = await m.request(t, "s", "once")
        subject = log_subject(t, "s")
        (stored,) = [e async for e in m.store.replay(subject)]
        raw = [r async for r in m.store.read_raw(subject)].pop()
        codec = Codec(await JetStreamBlobs.open(m.js))
        dispatcher = Dispatcher(m.js, TurnLog(m.store, codec, GATEWAY), logging.getLogger("test"))
        delivery = Delivery(
            subject=subject, data=raw.data, headers=raw.headers, stream_seq=stored.seq, attempt=1
        )
        assert await dispatcher.handle(delivery) is Settle.ACK
        redelivered = Delivery(**{**delivery.__dict__, "attempt": 2})
        assert await dispatcher.handle(redelivered) is Settle.ACK
        assert await work_items(m) == 1  # deduplicated by the work item's Nats-Msg-Id
        # once the turn has started, a late redelivery publishes nothing at all
        await m.append(t, "s", turn, TurnStarted(replica="elsewhere"))
        before = await work_items(m)
        assert await dispatcher.handle(Delivery(**{**delivery.__dict__, "attempt": 3})) is (
            Settle.ACK
        )
        assert await work_items(m) == before


async def test_a_turn_id_reused_by_another_tenant_does_not_suppress_its_turn(
    server: NatsServer, barriers: Path
) -> None:
    """Attack: with the turn id alone as the work item's Nats-Msg-Id, a tenant that learns (or
    guesses) another's turn id and asks first has the other's work item deduplicated away."""
    async with mesh(server, barriers) as m, agent(server, settings(barriers)):
        shared = new_id()
        attacker, victim = tenant(), tenant()
        await m.request(attacker, "s", "first with this id", turn=shared)
        await m.wait_ended(attacker, "s", shared)
        await m.request(victim, "s", "victim's own turn", turn=shared)
        ended = await m.wait_ended(victim, "s", shared, timeout=10)
        assert ended == TurnCompleted(answer="victim's own turn")


@pytest.mark.parametrize("bad", ["a.b", "x>", "", None])
async def test_a_request_whose_turn_id_is_no_subject_token_is_refused_with_a_reason(
    server: NatsServer, barriers: Path, bad: str | None
) -> None:
    """Attack: a turn id with '.' or '>' would split or wildcard the work item's subject
    tokens. It is refused, recorded against the request's event id, and never run."""
    async with mesh(server, barriers) as m, agent(server, settings(barriers)):
        t = tenant()
        await m.append(t, "s", bad, TurnRequested(message="run me"))

        async def refused() -> TurnRefused | None:
            for e in await m.events(t, "s"):
                if isinstance(e.envelope.data, TurnRefused):
                    return e.envelope.data
            return None

        refusal = await eventually(refused, what="the malformed request's refusal")
        assert refusal.reason == "malformed"
        assert "invalid turn id" in refusal.message
        kinds = [type(e.envelope.data).__name__ for e in await m.events(t, "s")]
        assert kinds == ["TurnRequested", "TurnRefused"]
        assert await work_items(m) == 0
        # the session is not blocked by it
        good = await m.request(t, "s", "fine")
        assert await m.wait_ended(t, "s", good) == TurnCompleted(answer="fine")


async def test_a_cancel_on_another_tenants_log_does_not_stop_a_turn(
    server: NatsServer, barriers: Path
) -> None:
    async with mesh(server, barriers) as m, agent(server, settings(barriers)):
        victim, attacker = tenant(), tenant()
        turn = await m.request(victim, "s", "keep [hold:v] going")
        await m.reached("v")
        await m.cancel(attacker, "s", turn)  # same session name and turn id, other tenant
        await m.cancel(victim, "other-session", turn)  # same tenant, other session
        m.release("v")
        assert await m.wait_ended(victim, "s", turn) == TurnCompleted(answer="keep going")


async def test_an_event_type_this_replica_does_not_know_is_skipped(
    server: NatsServer, barriers: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A newer replica may write types an older one cannot decode: turns still run."""
    async with mesh(server, barriers) as m, agent(server, settings(barriers)):
        t = tenant()
        subject = log_subject(t, "s")
        payload = json.dumps({
            "id": new_id(), "tenant": t, "session": "s", "ts": "2026-01-01T00:00:00Z",
            "actor": {"service": "agent", "replica": "newer"},
            "data": {"type": "future.fact", "detail": "a field no replica here knows"},
        }).encode()  # fmt: skip
        headers = append_headers(new_id(), EMPTY, payload, "future.fact")
        await m.js.publish(subject, payload, stream=streams.SESSIONS.name, headers=headers)
        with caplog.at_level(logging.WARNING, logger="fleet.agent.turns"):
            turn = await m.request(t, "s", "still works")
            ended = await m.wait_ended(t, "s", turn)
        assert ended == TurnCompleted(answer="still works")
        assert any(getattr(r, "type", "") == "future.fact" for r in caplog.records)
