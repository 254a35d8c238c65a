"""The WebSockets against a real nats-server and real uvicorn: resume after a drop and after a
forced overflow (no loss, no duplicates), error frames that leave the socket usable, identity
only from the ticket, tenants apart, two replicas alike."""

import asyncio
import json
from pathlib import Path
from typing import Any

import httpx
import pytest
from nats.js import JetStreamContext
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed

from fleet_events import new_id, streams
from fleet_events.session import SessionRenamed, session_filter
from fleet_mesh.natsserver import NatsServer
from fleet_mesh.store import open_store

from .ws_kit import (
    Gateway,
    StalledClient,
    frames_until,
    read_or_closed,
    seqs,
    serve,
    writer,
)

EVENTS = "/api/v1/ws/execution/events"


@pytest.fixture
async def gateway(nats_server: NatsServer, js: JetStreamContext, tmp_path: Path) -> Any:
    async with serve(nats_server.url, tmp_path / "gw") as gw:
        yield gw


async def _stored_seqs(js: JetStreamContext, tenant: str, session: str) -> list[int]:
    store = await open_store(js, streams.SESSIONS)
    return [raw.seq async for raw in store.read_raw(session_filter(tenant, session))]


async def test_a_client_that_reconnects_with_its_last_sequence_gets_exactly_what_it_missed(
    gateway: Gateway, js: JetStreamContext
) -> None:
    tenant, session = f"t{new_id()[:8]}", new_id()
    log = await writer(js)
    for i in range(5):
        await log.append(tenant, session, SessionRenamed(title=f"before {i}"))
    ws = await gateway.socket(tenant, EVENTS, session_id=session, after_seq=0)
    first = await frames_until(ws, lambda got: len(seqs(got)) >= 5)
    await ws.close()  # dropped: what lands now is missed
    for i in range(5):
        await log.append(tenant, session, SessionRenamed(title=f"while away {i}"))
    ws = await gateway.socket(tenant, EVENTS, session_id=session, after_seq=seqs(first)[-1])
    for i in range(3):
        await log.append(tenant, session, SessionRenamed(title=f"after {i}"))
    second = await frames_until(ws, lambda got: len(seqs(got)) >= 8)
    await ws.close()
    received = seqs(first) + seqs(second)
    assert received == await _stored_seqs(js, tenant, session)  # every one, once, in order
    titles = [f["event"]["data"]["title"] for f in first + second if f["type"] == "event"]
    assert titles[5:10] == [f"while away {i}" for i in range(5)]


async def test_a_socket_that_falls_behind_closes_with_its_last_sequence_and_resumes_losing_nothing(
    nats_server: NatsServer, js: JetStreamContext, tmp_path: Path
) -> None:
    tenant, session = f"t{new_id()[:8]}", new_id()
    log = await writer(js)
    async with serve(nats_server.url, tmp_path / "gw", ws_queue_limit=4) as gw:
        ticket = await gw.ticket(tenant)
        url = f"{gw.ws_url}{EVENTS}?ticket={ticket}&session_id={session}&trace_mode=verbose"
        stalled = StalledClient(url)  # reads nothing until every event is stored
        await stalled.open()
        big = "x" * 60_000
        for i in range(160):  # ~9.6 MB: far more than the socket buffers hold
            await log.append(tenant, session, SessionRenamed(title=f"{i} {big}"))
        got, code, text = await stalled.read_all()
        assert code == 4008, (code, text)
        reason = json.loads(text)
        assert reason["code"] == "queue_overflow"
        assert reason["last_seq"] == seqs(got)[-1]  # the close says exactly where to resume
        stored = await _stored_seqs(js, tenant, session)
        assert len(seqs(got)) < len(stored)  # it really fell behind
        # A client that resumes from each close's last sequence gets the rest, however many
        # times its (tiny) queue overflows again on the way.
        rest: list[dict[str, Any]] = []
        last, closes = reason["last_seq"], 0
        while len(seqs(got)) + len(seqs(rest)) < len(stored):
            ws = await gw.socket(
                tenant, EVENTS, session_id=session, after_seq=last, trace_mode="verbose"
            )
            missing = len(stored) - len(seqs(got)) - len(seqs(rest))
            more, closed_with = await read_or_closed(ws, lambda f, n=missing: len(seqs(f)) >= n)
            rest += more
            if closed_with is None:
                await ws.close()
            else:
                assert closed_with == 4008
                closes += 1
                assert closes < 500
            last = (seqs(rest) or seqs(got))[-1]
        assert seqs(got) + seqs(rest) == stored  # nothing lost, nothing twice


async def test_bad_frames_get_error_frames_and_the_socket_stays_usable(
    gateway: Gateway, js: JetStreamContext
) -> None:
    tenant, session = f"t{new_id()[:8]}", new_id()
    ws = await gateway.socket(tenant)

    def message(**fields: Any) -> str:
        return json.dumps({"type": "message", "content": "hi", "session_id": session, **fields})

    bad: list[tuple[str, str]] = [
        ("not json", "malformed_frame"),
        (message(tenant="other"), "invalid_frame"),  # identity is never read from a frame
        (message(user_id="someone"), "invalid_frame"),
        (message(session_id="a.b"), "invalid_session"),
        (message(execution_mode="fast"), "invalid_execution_mode"),
        (message(repo_ref="main"), "repo_ref_requires_repo"),
        (message(content="   "), "empty_message"),
        (message(content="x" * 1_100_000), "frame_too_large"),
        (message(trace_mode="loud"), "invalid_trace_mode"),
        (message(repo_url="https://example.invalid/r.git", repo_ref="-x"), "invalid_repo_ref"),
        (message(context_paths=["src/../../etc"]), "invalid_context_path"),
        (message(document_ids=["notes"]), "document_not_found"),  # none is loaded here
        (json.dumps({"type": "cancel"}), "nothing_to_cancel"),
        (json.dumps({"type": "command", "command": "rm"}), "unknown_command"),
        (json.dumps({"type": "command", "command": "answer", "args": {}}), "no_session"),
    ]
    for text, code in bad:
        await ws.send(text)
        frame = json.loads(await asyncio.wait_for(ws.recv(), 10))
        assert (frame["type"], frame["code"]) == ("error", code), frame
        assert frame["message"]
    assert await _stored_seqs(js, tenant, session) == []  # nothing stored
    await ws.send(json.dumps({"type": "message", "content": "hello", "session_id": session,
                              "execution_mode": "rlm_only"}))  # fmt: skip
    got = await frames_until(ws, lambda f: any(x["type"] == "accepted" for x in f)
                             and len(seqs(f)) >= 2)  # fmt: skip
    accepted = next(x for x in got if x["type"] == "accepted")
    events = [x["event"]["data"] for x in got if x["type"] == "event"]
    assert [e["type"] for e in events[:2]] == ["session.created", "turn.requested"]
    assert events[1]["message"] == "hello"
    assert events[1]["mode"] == "rlm_only"
    await ws.send(json.dumps({"type": "cancel"}))
    await ws.send(json.dumps({"type": "command", "command": "resolve_hitl",
                              "args": {"message_id": "q1", "action_label": "yes"}}))  # fmt: skip
    later = await frames_until(ws, lambda f: len(seqs(f)) >= 2)
    kinds = [x["event"]["data"]["type"] for x in later if x["type"] == "event"]
    assert kinds == ["turn.cancel_requested", "input.provided"]
    cancel = next(x["event"] for x in later if x.get("event", {}).get("data", {}).get("type")
                  == "turn.cancel_requested")  # fmt: skip
    assert cancel["turn"] == accepted["turn_id"]
    await ws.close()
    assert len(await _stored_seqs(js, tenant, session)) == 4


async def test_identity_comes_only_from_the_ticket(gateway: Gateway, js: JetStreamContext) -> None:
    ticket = await gateway.ticket("tenant-a")
    ws = await connect(f"{gateway.ws_url}{EVENTS}?ticket={ticket}&session_id=s&tenant=b")
    with pytest.raises(ConnectionClosed) as closed:
        await asyncio.wait_for(ws.recv(), 10)
    assert closed.value.rcvd is not None
    assert closed.value.rcvd.code == 1008
    assert "unsupported_identity_query_params" in closed.value.rcvd.reason
    used = await gateway.ticket("tenant-a")
    ws = await connect(f"{gateway.ws_url}{EVENTS}?ticket={used}&session_id=s")
    await ws.close()  # redeemed: a ticket opens one socket
    for bad in ("nope", used):  # a made-up ticket, and one already used
        ws = await connect(f"{gateway.ws_url}{EVENTS}?ticket={bad}&session_id=s")
        with pytest.raises(ConnectionClosed) as closed:
            await asyncio.wait_for(ws.recv(), 10)
        assert closed.value.rcvd is not None
        assert closed.value.rcvd.code == 4401
        assert json.loads(closed.value.rcvd.reason)["code"] == "invalid_ticket"


async def test_a_tenant_never_sees_another_tenants_session_on_a_socket(
    gateway: Gateway, js: JetStreamContext
) -> None:
    session = new_id()
    a, b = f"a{new_id()[:8]}", f"b{new_id()[:8]}"
    log = await writer(js)
    await log.append(a, session, SessionRenamed(title="a's secret"))
    spy = await gateway.socket(b, EVENTS, session_id=session)  # the same id, another tenant
    ws = await gateway.socket(a, EVENTS, session_id=session)
    await frames_until(ws, lambda f: len(seqs(f)) >= 1)
    sender = await gateway.socket(b)
    await sender.send(json.dumps({"type": "message", "content": "b's own", "session_id": session}))
    seen = await frames_until(spy, lambda f: len(seqs(f)) >= 2)  # b's own two events only
    titles = json.dumps(seen)
    assert "a's secret" not in titles
    assert all(f["subject"].startswith(f"fleet.session.{b}.") for f in seen if f["type"] == "event")
    await log.append(a, session, SessionRenamed(title="a again"))
    mine = await frames_until(ws, lambda f: len(seqs(f)) >= 1)
    assert "b's own" not in json.dumps(mine)
    for sock in (spy, ws, sender):
        await sock.close()


async def test_two_replicas_redeem_each_others_tickets_and_stream_the_same(
    nats_server: NatsServer, js: JetStreamContext, tmp_path: Path
) -> None:
    tenant, session = f"t{new_id()[:8]}", new_id()
    log = await writer(js)
    for i in range(3):
        await log.append(tenant, session, SessionRenamed(title=str(i)))
    async with (
        serve(nats_server.url, tmp_path / "gw", replica="gateway-0") as one,
        serve(nats_server.url, tmp_path / "gw", replica="gateway-1") as two,
    ):
        ticket = await one.ticket(tenant)  # minted on one, redeemed on the other
        ws_two = await connect(f"{two.ws_url}{EVENTS}?ticket={ticket}&session_id={session}")
        ws_one = await one.socket(tenant, EVENTS, session_id=session)
        await log.append(tenant, session, SessionRenamed(title="live"))
        got_one = await frames_until(ws_one, lambda f: len(seqs(f)) >= 4)
        got_two = await frames_until(ws_two, lambda f: len(seqs(f)) >= 4)
        await ws_one.close()
        await ws_two.close()
    assert got_one == got_two


async def test_revoking_an_api_token_closes_its_sockets_and_refuses_its_tickets(
    nats_server: NatsServer, js: JetStreamContext, tmp_path: Path
) -> None:
    # M5: a ticket minted before a revoke opened a socket after it, turns were accepted, and
    # open sockets kept streaming; two replicas: the revoke lands on one, the socket on the other
    async with (
        serve(nats_server.url, tmp_path / "gw", replica="gw-a") as a,
        serve(nats_server.url, tmp_path / "gw", replica="gw-b") as b,
    ):
        tenant = f"t{new_id()[:8]}"
        async with a.client(tenant) as admin:
            issued = await admin.post("/api/v1/auth/tokens", json={"name": "ci", "ttl_s": 600})
            assert issued.status_code == 201, issued.text
        token, token_id = issued.json()["token"], issued.json()["id"]
        bearer = {"Authorization": f"Bearer {token}"}

        async def ticket() -> str:
            async with httpx.AsyncClient(base_url=b.url, headers=bearer) as client:
                minted = await client.post("/api/v1/auth/ws-ticket")
            assert minted.status_code == 200, minted.text
            return str(minted.json()["ticket"])

        open_socket = await connect(f"{b.ws_url}/api/v1/ws/execution?ticket={await ticket()}")
        await open_socket.send(json.dumps({"type": "nope"}))  # answered: the socket is live
        assert json.loads(await asyncio.wait_for(open_socket.recv(), 10))["type"] == "error"
        spare = await ticket()  # minted before the revoke, used after it

        async with httpx.AsyncClient(base_url=a.url, headers=bearer) as client:
            revoked = await client.delete(f"/api/v1/auth/tokens/{token_id}")
        assert revoked.status_code == 200, revoked.text

        with pytest.raises(ConnectionClosed) as closed:  # the open socket is closed by b
            await asyncio.wait_for(open_socket.recv(), 10)
        assert closed.value.rcvd is not None
        assert closed.value.rcvd.code == 4401
        assert json.loads(closed.value.rcvd.reason) == {"code": "token_revoked", "token": token_id}

        late = await connect(f"{b.ws_url}/api/v1/ws/execution?ticket={spare}")
        with pytest.raises(ConnectionClosed) as refused:
            await asyncio.wait_for(late.recv(), 10)
        assert refused.value.rcvd is not None
        assert refused.value.rcvd.code == 4401
        assert json.loads(refused.value.rcvd.reason)["code"] == "invalid_ticket"
