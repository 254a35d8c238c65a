"""`/api/v1/sessions*` route by route on a real nats-server: writes land on the log with the
sequence they answer, reads come from the projections (min_seq reads a write on any replica),
and every route treats another tenant's session as one that does not exist."""

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from nats.js import JetStreamContext
from tests.integration.gateway.api_kit import Api, running_api, tenant_id

from fleet_events import Actor, Envelope, new_id, streams, utc_now
from fleet_events.run import LlmCalled
from fleet_events.session import (
    CoreMemoryChanged,
    TurnCompleted,
    TurnStarted,
    log_subject,
    run_subject,
    session_filter,
)
from fleet_mesh.natsserver import NatsServer
from fleet_mesh.store import EventStore, open_store

AGENT = Actor(service="agent", replica="test")


@pytest.fixture
async def api(nats_server: NatsServer, js: JetStreamContext, tmp_path: Path) -> AsyncIterator[Api]:
    async with running_api(nats_server.url, tmp_path) as running:
        yield running


async def _store(js: JetStreamContext) -> EventStore:
    return await open_store(js, streams.SESSIONS)


async def _as_agent(
    store: EventStore,
    tenant: str,
    session: str,
    data: Any,
    *,
    turn: str | None = None,
    run: str | None = None,
) -> int:
    """Append as the agent would (not through the gateway)."""
    subject = run_subject(tenant, session, run) if run else log_subject(tenant, session)
    env = Envelope(
        id=new_id(), tenant=tenant, session=session, turn=turn, run=run, actor=AGENT,
        ts=utc_now(), data=data,
    )  # fmt: skip
    return (await store.append(subject, env)).seq


async def _create(api: Api, tenant: str, title: str = "") -> tuple[str, int]:
    response = await api.call("POST", "/api/v1/sessions", tenant, json={"title": title})
    assert response.status_code == 201, response.text
    body = response.json()
    return body["session"]["id"], body["seq"]


async def test_create_answers_the_stored_sequence_and_reads_see_it(
    api: Api, js: JetStreamContext
) -> None:
    tenant = tenant_id()
    response = await api.call("POST", "/api/v1/sessions", tenant, "bob", json={"title": "logs"})
    assert response.status_code == 201
    body = response.json()
    session, seq = body["session"]["id"], body["seq"]
    assert body["session"]["owner"] == "bob"
    stored = [e async for e in (await _store(js)).replay(session_filter(tenant, session))]
    assert [(e.seq, e.envelope.tenant, type(e.envelope.data).__name__) for e in stored] == [
        (seq, tenant, "SessionCreated")
    ]
    got = await api.call("GET", f"/api/v1/sessions/{session}", tenant, params={"min_seq": seq})
    assert got.status_code == 200
    assert got.json() == {**body["session"], "active_turn": None}


async def test_a_tenant_or_user_in_the_body_is_refused_and_nothing_is_stored(
    api: Api, js: JetStreamContext
) -> None:
    tenant, victim = tenant_id(), tenant_id()
    for field in ("tenant", "user", "owner"):
        response = await api.call(
            "POST", "/api/v1/sessions", tenant, json={"title": "x", field: victim}
        )
        assert response.status_code == 422
        body = response.json()
        assert body["code"] == "invalid_request"
        assert field in body["message"]
        assert body["details"]["problems"][0]["field"] == field
    for who in (tenant, victim):
        listed = await api.call("GET", "/api/v1/sessions", who, params={"status": "all"})
        assert listed.json()["items"] == []
    tail = [e async for e in (await _store(js)).replay(f"fleet.session.{victim}.>")]
    assert tail == []


async def test_a_body_nested_past_the_json_reader_is_a_422_and_stores_nothing(
    api: Api, js: JetStreamContext
) -> None:
    tenant = tenant_id()
    deep = b'{"title": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    response = await api.call(
        "POST", "/api/v1/sessions", tenant, content=deep,
        headers={"content-type": "application/json"},
    )  # fmt: skip
    assert response.status_code == 422, response.text
    body = response.json()
    assert body["code"] == "body_unreadable"
    assert "POST /api/v1/sessions is not JSON this API can read" in body["message"]
    tail = [e async for e in (await _store(js)).replay(f"fleet.session.{tenant}.>")]
    assert tail == []


async def test_another_tenants_session_is_404_on_every_route(api: Api) -> None:
    owner, other = tenant_id(), tenant_id()
    session, _ = await _create(api, owner, "private")
    turn = (
        await api.call("POST", f"/api/v1/sessions/{session}/turns", owner, json={"message": "q"})
    ).json()["turn"]
    routes: list[tuple[str, str, dict[str, Any]]] = [
        ("GET", "", {}),
        ("PATCH", "", {"json": {"title": "mine now"}}),
        ("DELETE", "", {}),
        ("GET", "/state", {}),
        ("GET", "/turns", {}),
        ("GET", "/stats", {}),
        ("POST", "/turns", {"json": {"message": "hello"}}),
        ("POST", "/cancel", {"json": {"turn": turn}}),
    ]
    unknown = new_id()
    for method, suffix, kwargs in routes:
        foreign = await api.call(method, f"/api/v1/sessions/{session}{suffix}", other, **kwargs)
        missing = await api.call(method, f"/api/v1/sessions/{unknown}{suffix}", other, **kwargs)
        assert foreign.status_code == 404, (method, suffix, foreign.text)
        assert foreign.json()["code"] == "session_not_found"
        # indistinguishable from an id that exists nowhere, except for the id it names
        assert foreign.json()["message"].replace(session, unknown) == missing.json()["message"]
    listed = await api.call("GET", "/api/v1/sessions", other, params={"status": "all"})
    assert listed.json()["items"] == []
    mine = await api.call("GET", f"/api/v1/sessions/{session}", owner)
    assert mine.json()["title"] == "private"
    assert mine.json()["status"] == "active"


async def test_rename_and_delete_are_events_and_a_deleted_session_refuses_changes(
    api: Api,
) -> None:
    tenant = tenant_id()
    session, _ = await _create(api, tenant, "old")
    renamed = await api.call("PATCH", f"/api/v1/sessions/{session}", tenant, json={"title": "new"})
    assert renamed.status_code == 200
    got = await api.call(
        "GET", f"/api/v1/sessions/{session}", tenant, params={"min_seq": renamed.json()["seq"]}
    )
    assert got.json()["title"] == "new"
    deleted = await api.call("DELETE", f"/api/v1/sessions/{session}", tenant)
    assert deleted.status_code == 200
    seq = deleted.json()["seq"]
    got = await api.call("GET", f"/api/v1/sessions/{session}", tenant, params={"min_seq": seq})
    assert got.json()["status"] == "deleted"
    again = await api.call("PATCH", f"/api/v1/sessions/{session}", tenant, json={"title": "x"})
    assert again.status_code == 409
    assert again.json()["code"] == "session_deleted"
    assert (await api.call("DELETE", f"/api/v1/sessions/{session}", tenant)).status_code == 409
    active = await api.call("GET", "/api/v1/sessions", tenant, params={"min_seq": seq})
    assert active.json()["items"] == []
    gone = await api.call("GET", "/api/v1/sessions", tenant, params={"status": "deleted"})
    assert [s["id"] for s in gone.json()["items"]] == [session]


async def test_list_pages_newest_first_with_search_and_created_range(api: Api) -> None:
    tenant = tenant_id()
    made = [
        await _create(api, tenant, f"report {i:02d}" if i % 2 else f"chat {i}") for i in range(7)
    ]
    last_seq = made[-1][1]
    seen: list[str] = []
    cursor = None
    while True:
        params: dict[str, Any] = {"limit": 3, "min_seq": last_seq}
        if cursor:
            params["cursor"] = cursor
        page = (await api.call("GET", "/api/v1/sessions", tenant, params=params)).json()
        seen += [s["id"] for s in page["items"]]
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert seen == [sid for sid, _ in reversed(made)]
    found = await api.call("GET", "/api/v1/sessions", tenant, params={"search": "REPORT"})
    assert sorted(s["title"] for s in found.json()["items"]) == [
        "report 01", "report 03", "report 05"
    ]  # fmt: skip
    wild = await api.call("GET", "/api/v1/sessions", tenant, params={"search": "%"})
    assert wild.json()["items"] == []  # a LIKE wildcard is a literal character
    third = (await api.call("GET", f"/api/v1/sessions/{made[3][0]}", tenant)).json()
    after = await api.call(
        "GET", "/api/v1/sessions", tenant, params={"created_after": third["created_at"]}
    )
    assert [s["id"] for s in after.json()["items"]] == [sid for sid, _ in reversed(made[3:])]
    before = await api.call(
        "GET", "/api/v1/sessions", tenant, params={"created_before": third["created_at"]}
    )
    assert [s["id"] for s in before.json()["items"]] == [sid for sid, _ in reversed(made[:3])]


async def test_bad_list_parameters_say_which_and_why(api: Api) -> None:
    tenant = tenant_id()
    for params, field in (
        ({"limit": 0}, "limit"),
        ({"limit": 101}, "limit"),
        ({"status": "archived"}, "status"),
        ({"created_after": "yesterday"}, "created_after"),
        ({"min_seq": -1}, "min_seq"),
    ):
        response = await api.call("GET", "/api/v1/sessions", tenant, params=params)
        assert response.status_code == 422
        assert response.json()["details"]["problems"][0]["field"] == field
        assert field in response.json()["message"]
    forged = await api.call("GET", "/api/v1/sessions", tenant, params={"cursor": "czEyMw"})
    assert forged.status_code == 200  # a cursor of ours (s123) pages from there
    junk = await api.call("GET", "/api/v1/sessions", tenant, params={"cursor": "!!nope"})
    assert junk.status_code == 422
    assert junk.json()["code"] == "invalid_cursor"
    bad_id = await api.call("GET", "/api/v1/sessions/a.b", tenant)
    assert bad_id.status_code == 422
    assert bad_id.json()["details"]["problems"][0]["field"] == "session_id"


async def test_turns_are_appended_and_listed_with_their_progress(
    api: Api, js: JetStreamContext
) -> None:
    tenant = tenant_id()
    session, _ = await _create(api, tenant)
    asked = await api.call(
        "POST", f"/api/v1/sessions/{session}/turns", tenant,
        json={"message": "summarise", "mode": "rlm_only"},
    )  # fmt: skip
    assert asked.status_code == 202
    turn, seq = asked.json()["turn"], asked.json()["seq"]
    store = await _store(js)
    await _as_agent(store, tenant, session, TurnStarted(replica="agent-0"), turn=turn)
    end = await _as_agent(store, tenant, session, TurnCompleted(answer="done"), turn=turn)
    listed = await api.call(
        "GET", f"/api/v1/sessions/{session}/turns", tenant, params={"min_seq": end}
    )
    (only,) = listed.json()["items"]
    assert (only["id"], only["requested_seq"], only["status"]) == (turn, seq, "completed")
    assert (only["user_message"], only["assistant_message"], only["mode"]) == (
        "summarise", "done", "rlm_only"
    )  # fmt: skip
    assert only["attempts"] == 1
    bad = await api.call(
        "POST", f"/api/v1/sessions/{session}/turns", tenant, json={"message": "x", "mode": "fast"}
    )
    assert bad.status_code == 422
    assert "mode" in bad.json()["message"]
    empty = await api.call(
        "POST", f"/api/v1/sessions/{session}/turns", tenant, json={"message": ""}
    )
    assert empty.status_code == 422


async def test_cancel_names_the_running_turn_or_says_there_is_none(api: Api) -> None:
    tenant = tenant_id()
    session, _ = await _create(api, tenant)
    none = await api.call("POST", f"/api/v1/sessions/{session}/cancel", tenant)
    assert none.status_code == 409
    assert none.json()["code"] == "no_active_turn"
    asked = await api.call(
        "POST", f"/api/v1/sessions/{session}/turns", tenant, json={"message": "q"}
    )
    turn = asked.json()["turn"]
    cancel = await api.call(
        "POST", f"/api/v1/sessions/{session}/cancel", tenant,
        params={"min_seq": asked.json()["seq"]}, json={"reason": "changed my mind"},
    )  # fmt: skip
    assert cancel.status_code == 202
    assert cancel.json()["turn"] == turn
    listed = await api.call(
        "GET", f"/api/v1/sessions/{session}/turns", tenant,
        params={"min_seq": cancel.json()["seq"]},
    )  # fmt: skip
    assert listed.json()["items"][0]["cancel_requested"] is True
    unknown = await api.call(
        "POST", f"/api/v1/sessions/{session}/cancel", tenant, json={"turn": new_id()}
    )
    assert unknown.status_code == 404
    assert unknown.json()["code"] == "turn_not_found"


async def test_stats_sum_the_runs_llm_calls_per_model(api: Api, js: JetStreamContext) -> None:
    tenant = tenant_id()
    session, _ = await _create(api, tenant)
    store = await _store(js)
    calls = [
        ("openai/big", 100, 20, 300.0, 0.01, False),
        ("openai/big", 50, 10, 100.0, 0.005, False),
        ("openai/small", 7, 3, 20.0, 0.0, False),
        ("openai/small", 7, 3, 20.0, 0.0, True),  # replayed from the record: not paid again
    ]
    seq = 0
    for model, tin, tout, ms, cost, recorded in calls:
        seq = await _as_agent(
            store, tenant, session,
            LlmCalled(
                role="planner", model=model, prompt_tokens=tin, completion_tokens=tout,
                latency_ms=ms, cost=cost, recorded=recorded,
            ),
            run="run1",
        )  # fmt: skip
    stats = await api.call(
        "GET", f"/api/v1/sessions/{session}/stats", tenant, params={"min_seq": seq}
    )
    body = stats.json()
    assert (body["total_calls"], body["total_tokens_in"], body["total_tokens_out"]) == (3, 157, 33)
    assert body["total_latency_ms"] == 420.0
    assert body["total_cost"] == pytest.approx(0.015)
    assert [(m["model"], m["calls"], m["tokens_in"]) for m in body["model_breakdown"]] == [
        ("openai/big", 2, 150), ("openai/small", 1, 7)
    ]  # fmt: skip


async def test_state_folds_memory_and_history(api: Api, js: JetStreamContext) -> None:
    tenant = tenant_id()
    session, _ = await _create(api, tenant)
    asked = await api.call(
        "POST", f"/api/v1/sessions/{session}/turns", tenant, json={"message": "hi"}
    )
    turn = asked.json()["turn"]
    store = await _store(js)
    await _as_agent(
        store, tenant, session,
        CoreMemoryChanged(block="human", op="append", value="likes tea", text="likes tea"),
        turn=turn,
    )  # fmt: skip
    end = await _as_agent(store, tenant, session, TurnCompleted(answer="hello"), turn=turn)
    state = await api.call(
        "GET", f"/api/v1/sessions/{session}/state", tenant, params={"min_seq": end}
    )
    body = state.json()
    assert body["core_memory"] == {"persona": "", "human": "likes tea", "scratchpad": ""}
    assert body["history"] == [{"question": "hi", "answer": "hello", "turn": turn}]


async def test_min_seq_past_the_log_is_refused_at_once_naming_the_last_sequence(
    api: Api,
) -> None:
    tenant = tenant_id()
    session, seq = await _create(api, tenant)
    ahead = await api.call(
        "GET", f"/api/v1/sessions/{session}", tenant, params={"min_seq": seq + 10**9}
    )
    assert ahead.status_code == 422
    body = ahead.json()
    assert body["code"] == "min_seq_ahead"
    assert body["details"]["min_seq"] == seq + 10**9
    assert body["details"]["last_seq"] >= seq


async def test_a_replica_that_cannot_catch_up_in_time_says_so_with_retry_after(
    nats_server: NatsServer, js: JetStreamContext, tmp_path: Path
) -> None:
    async with running_api(nats_server.url, tmp_path, read_wait_max_s=0.2) as api:
        tenant = tenant_id()
        session, seq = await _create(api, tenant)
        assert api.state.projector is not None
        assert api.state.projections is not None
        assert await api.state.projections.wait_for(seq, 5)
        api.state.projector.stop()  # this replica stops folding: it falls behind the log
        await asyncio.wait_for(api.state.projector.finished.wait(), 5)
        renamed = await api.call(
            "PATCH", f"/api/v1/sessions/{session}", tenant, json={"title": "z"}
        )
        behind = await api.call(
            "GET", f"/api/v1/sessions/{session}", tenant, params={"min_seq": renamed.json()["seq"]}
        )
        assert behind.status_code == 503
        assert behind.json()["code"] == "projection_behind"
        assert behind.headers["retry-after"] == "1"


async def test_a_write_on_one_replica_is_read_on_another_with_its_sequence(
    nats_server: NatsServer, js: JetStreamContext, tmp_path: Path
) -> None:
    async with (
        running_api(nats_server.url, tmp_path, replica="gateway-a") as a,
        running_api(nats_server.url, tmp_path, replica="gateway-b") as b,
    ):
        tenant = tenant_id()
        session, _ = await _create(a, tenant, "shared")
        renamed = await a.call("PATCH", f"/api/v1/sessions/{session}", tenant, json={"title": "t2"})
        seq = renamed.json()["seq"]
        answers = [
            (
                await r.call("GET", f"/api/v1/sessions/{session}", tenant, params={"min_seq": seq})
            ).json()
            for r in (a, b)
        ]
        assert answers[0] == answers[1]
        assert answers[1]["title"] == "t2"
        # even without min_seq, a session the log has is never a 404 on a lagging replica
        fresh, _ = await _create(a, tenant, "fresh")
        got = await b.call("GET", f"/api/v1/sessions/{fresh}", tenant)
        assert got.status_code == 200


async def test_an_oversized_body_is_413_and_stores_nothing(api: Api, js: JetStreamContext) -> None:
    tenant = tenant_id()
    session, seq = await _create(api, tenant)
    huge = {"message": "x" * (1024 * 1024 + 1)}
    response = await api.call("POST", f"/api/v1/sessions/{session}/turns", tenant, json=huge)
    assert response.status_code == 413
    assert response.json()["code"] == "payload_too_large"
    assert "1048576" in response.json()["message"]

    async def chunks() -> AsyncIterator[bytes]:  # no Content-Length: counted as it streams
        yield b'{"message": "'
        for _ in range(20):
            yield b"y" * 65536
        yield b'"}'

    streamed = await api.call(
        "POST", f"/api/v1/sessions/{session}/turns", tenant,
        content=chunks(), headers={"content-type": "application/json"},
    )  # fmt: skip
    assert streamed.status_code == 413
    head = await (await _store(js)).head(log_subject(tenant, session))
    assert head.seq == seq


async def test_a_tenant_over_its_request_rate_gets_429_and_another_tenant_does_not(
    nats_server: NatsServer, js: JetStreamContext, tmp_path: Path
) -> None:
    async with running_api(nats_server.url, tmp_path, tenant_rps=0.01, tenant_burst=3) as api:
        busy, calm = tenant_id(), tenant_id()
        answers = [(await api.call("GET", "/api/v1/auth/me", busy)).status_code for _ in range(4)]
        assert answers == [200, 200, 200, 429]
        over = await api.call("GET", "/api/v1/sessions", busy)
        assert over.json()["code"] == "rate_limited"
        assert int(over.headers["retry-after"]) >= 1
        assert (await api.call("GET", "/api/v1/sessions", calm)).status_code == 200


async def test_a_tenant_at_its_concurrent_turns_gets_429_and_nothing_is_stored(
    nats_server: NatsServer, js: JetStreamContext, tmp_path: Path
) -> None:
    async with running_api(nats_server.url, tmp_path, tenant_concurrent_turns=2) as api:
        tenant = tenant_id()
        sessions = [(await _create(api, tenant))[0] for _ in range(3)]
        asked = []
        for session in sessions[:2]:
            response = await api.call(
                "POST", f"/api/v1/sessions/{session}/turns", tenant, json={"message": "q"}
            )
            asked.append(response.json())
        assert api.state.projections is not None
        assert await api.state.projections.wait_for(asked[-1]["seq"], 5)
        store = await _store(js)
        before = await store.head(log_subject(tenant, sessions[2]))
        third = await api.call(
            "POST", f"/api/v1/sessions/{sessions[2]}/turns", tenant, json={"message": "q"}
        )
        assert third.status_code == 429
        assert third.json()["code"] == "too_many_turns"
        assert third.json()["details"] == {"active_turns": 2, "limit": 2}
        assert third.headers["retry-after"] == "2"
        assert await store.head(log_subject(tenant, sessions[2])) == before
        neighbour = tenant_id()  # the quota is the tenant's, not the mesh's
        theirs, _ = await _create(api, neighbour)
        other = await api.call(
            "POST", f"/api/v1/sessions/{theirs}/turns", neighbour, json={"message": "q"}
        )
        assert other.status_code == 202
        end = await _as_agent(
            store, tenant, sessions[0], TurnCompleted(answer="a"), turn=asked[0]["turn"]
        )
        assert await api.state.projections.wait_for(end, 5)
        again = await api.call(
            "POST", f"/api/v1/sessions/{sessions[2]}/turns", tenant, json={"message": "q"}
        )
        assert again.status_code == 202


async def test_created_range_edges_answer_sensibly_not_500(api: Api) -> None:
    tenant = tenant_id()
    session, seq = await _create(api, tenant)
    early = await api.call(
        "GET", "/api/v1/sessions", tenant,
        params={"created_after": "0405-01-01T00:00:00Z", "min_seq": seq},
    )  # fmt: skip
    assert [s["id"] for s in early.json()["items"]] == [session]  # year 405 sorts before 2026
    for edge in ("0001-01-01T00:00:00+05:00", "9999-12-31T23:59:59-05:00"):
        response = await api.call("GET", "/api/v1/sessions", tenant, params={"created_after": edge})
        assert response.status_code == 422, response.text
        assert response.json()["details"]["field"] == "created_after"
        assert edge in response.json()["message"]
