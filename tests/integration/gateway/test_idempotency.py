"""A turn request's idempotency key, on both doors (`Idempotency-Key` on
`POST /sessions/{id}/turns`, the `message` frame's `id` on the WebSocket), on a real
nats-server: a retry answers the first answer and stores nothing more; the key is scoped to
(tenant, session), so another tenant's reuse of it neither collides with nor sees the first.

The attacks replayed here failed before the application layer: the frame's client-made id was
the event's stream-wide message id, so another tenant sending the same id had its turn refused
with an error naming the first tenant's subject; a retried POST stored a second turn."""

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from nats.js import JetStreamContext
from tests.integration.gateway.api_kit import Api, running_api, tenant_id

from fleet_events import new_id, streams
from fleet_events.session import TurnRequested, log_subject
from fleet_mesh.natsserver import NatsServer
from fleet_mesh.store import Appended, Head, open_store

from .ws_kit import Gateway, frames_until, serve


@pytest.fixture
async def api(nats_server: NatsServer, js: JetStreamContext, tmp_path: Path) -> AsyncIterator[Api]:
    async with running_api(nats_server.url, tmp_path) as running:
        yield running


@pytest.fixture
async def gateway(nats_server: NatsServer, js: JetStreamContext, tmp_path: Path) -> Any:
    async with serve(nats_server.url, tmp_path / "gw") as gw:
        yield gw


async def _requests(js: JetStreamContext, tenant: str, session: str) -> list[tuple[str, str]]:
    """(turn, message) of every `turn.requested` on the session's log."""
    store = await open_store(js, streams.SESSIONS)
    return [
        (stored.envelope.turn or "", stored.envelope.data.message)
        async for stored in store.replay(log_subject(tenant, session))
        if isinstance(stored.envelope.data, TurnRequested)
    ]


async def _create(api: Api, tenant: str) -> str:
    response = await api.call("POST", "/api/v1/sessions", tenant, json={})
    assert response.status_code == 201, response.text
    return str(response.json()["session"]["id"])


def _turns(session: str) -> str:
    return f"/api/v1/sessions/{session}/turns"


async def _post(api: Api, tenant: str, session: str, key: str, message: str) -> Any:
    return await api.call(
        "POST", _turns(session), tenant, json={"message": message},
        headers={"Idempotency-Key": key},
    )  # fmt: skip


async def test_a_retried_post_with_the_same_key_stores_one_turn_and_answers_the_same(
    api: Api, js: JetStreamContext
) -> None:
    tenant = tenant_id()
    session = await _create(api, tenant)
    key = "retry-" + new_id()
    first = await _post(api, tenant, session, key, "summarise the log")
    again = await _post(api, tenant, session, key, "summarise the log")
    assert first.status_code == again.status_code == 202, (first.text, again.text)
    assert again.json() == first.json()
    assert await _requests(js, tenant, session) == [(first.json()["turn"], "summarise the log")]
    other = await _post(api, tenant, session, "another-" + new_id(), "summarise the log")
    assert other.status_code == 202
    assert other.json()["turn"] != first.json()["turn"]  # a new key is a new turn
    assert len(await _requests(js, tenant, session)) == 2


async def test_a_different_body_under_the_same_key_is_422_naming_the_key(
    api: Api, js: JetStreamContext
) -> None:
    tenant = tenant_id()
    session = await _create(api, tenant)
    key = "body-" + new_id()
    assert (await _post(api, tenant, session, key, "first question")).status_code == 202
    changed = await _post(api, tenant, session, key, "a different question")
    assert changed.status_code == 422, changed.text
    body = changed.json()
    assert body["code"] == "idempotency_key_reused"
    assert key in body["message"]
    assert body["details"]["idempotency_key"] == key
    assert await _requests(js, tenant, session) == [(body["details"]["turn"], "first question")]


async def test_a_retry_while_the_first_is_in_flight_is_409_then_the_first_answer(
    api: Api, js: JetStreamContext, monkeypatch: pytest.MonkeyPatch
) -> None:
    tenant = tenant_id()
    session = await _create(api, tenant)
    assert api.state.log is not None
    store = api.state.log.store
    real = store.append
    entered, go = asyncio.Event(), asyncio.Event()

    async def held(subject: str, envelope: Any, *, expect: Head | None = None) -> Appended:
        if isinstance(envelope.data, TurnRequested):  # the first request waits here
            entered.set()
            await go.wait()
        return await real(subject, envelope, expect=expect)

    monkeypatch.setattr(store, "append", held)
    key = "slow-" + new_id()
    first = asyncio.create_task(_post(api, tenant, session, key, "slow one"))
    await asyncio.wait_for(entered.wait(), 20)
    busy = await _post(api, tenant, session, key, "slow one")
    assert busy.status_code == 409, busy.text
    assert busy.json()["code"] == "idempotency_key_in_flight"
    assert key in busy.json()["message"]
    assert busy.headers["Retry-After"] == "1"
    go.set()
    answered = await asyncio.wait_for(first, 20)
    assert answered.status_code == 202
    again = await _post(api, tenant, session, key, "slow one")
    assert (again.status_code, again.json()) == (202, answered.json())
    assert len(await _requests(js, tenant, session)) == 1


async def test_a_post_without_a_key_is_a_new_turn_each_time(api: Api, js: JetStreamContext) -> None:
    tenant = tenant_id()
    session = await _create(api, tenant)
    for _ in range(2):
        asked = await api.call("POST", _turns(session), tenant, json={"message": "again"})
        assert asked.status_code == 202
    assert len(await _requests(js, tenant, session)) == 2


@pytest.mark.parametrize(
    ("key", "why"),
    [("", "empty"), ("k" * 256, "256 characters"), ("tab\there", "printable")],
)
async def test_a_bad_key_is_400_naming_the_header_and_stores_nothing(
    api: Api, js: JetStreamContext, key: str, why: str
) -> None:
    tenant = tenant_id()
    session = await _create(api, tenant)
    refused = await _post(api, tenant, session, key, "hello")
    assert refused.status_code == 400, refused.text
    body = refused.json()
    assert body["code"] == "invalid_idempotency_key"
    assert "Idempotency-Key" in body["message"]
    assert why in body["message"]
    assert await _requests(js, tenant, session) == []


async def test_a_key_of_255_printable_characters_is_taken(api: Api) -> None:
    tenant = tenant_id()
    session = await _create(api, tenant)
    key = "~ !" + "k" * 252
    assert (await _post(api, tenant, session, key, "hello")).status_code == 202


async def test_another_tenant_reusing_a_key_gets_its_own_turn_and_never_the_first(
    api: Api, js: JetStreamContext
) -> None:
    """The same key, the same session id in two tenants: two turns, each answered only with
    its own (the event id is a hash of tenant, session and key, not the client's string)."""
    first, second = tenant_id(), tenant_id()
    session = await _create(api, first)
    key = "shared-" + new_id()
    mine = await _post(api, first, session, key, "tenant one")
    assert mine.status_code == 202
    theirs_session = await _create(api, second)
    theirs = await _post(api, second, theirs_session, key, "tenant two")
    assert theirs.status_code == 202, theirs.text
    assert theirs.json()["turn"] != mine.json()["turn"]
    assert await _requests(js, second, theirs_session) == [(theirs.json()["turn"], "tenant two")]
    # the same key on another session of the same tenant is another turn too
    other = await _create(api, first)
    elsewhere = await _post(api, first, other, key, "tenant one")
    assert elsewhere.status_code == 202
    assert elsewhere.json()["turn"] != mine.json()["turn"]


@pytest.mark.parametrize("field", ["id", "turn_id"])  # `turn_id`: the older spelling
async def test_a_frame_id_reused_by_another_tenant_is_its_own_turn_and_leaks_nothing(
    gateway: Gateway, js: JetStreamContext, field: str
) -> None:
    """Attack: tenant two sends a `message` frame with the id tenant one used. Before, the id
    was the event's stream-wide message id: tenant two's turn was refused, and the error frame
    named tenant one's subject (its tenant and session ids)."""
    first, second = f"t{new_id()[:8]}", f"t{new_id()[:8]}"
    session, frame_id = new_id(), new_id()

    async def send(tenant: str, content: str) -> dict[str, Any]:
        ws = await gateway.socket(tenant)
        frame = {"type": "message", "session_id": session, field: frame_id, "content": content}
        await ws.send(json.dumps(frame))
        got = await frames_until(ws, lambda f: any(x["type"] in ("accepted", "error") for x in f))
        await ws.close()
        (answer,) = [x for x in got if x["type"] in ("accepted", "error")]
        assert first not in json.dumps(answer) or tenant == first
        return answer

    one = await send(first, "tenant one asks")
    two = await send(second, "tenant two asks")
    assert one["type"] == two["type"] == "accepted", (one, two)
    assert two["turn_id"] != one["turn_id"]
    assert await _requests(js, second, session) == [(two["turn_id"], "tenant two asks")]
    again = await send(second, "tenant two asks")  # tenant two's own retry: the first answer
    assert (again["turn_id"], again["seq"]) == (two["turn_id"], two["seq"])
    assert len(await _requests(js, second, session)) == 1
