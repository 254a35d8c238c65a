"""Traces of a recursive turn through the gateway: a real mesh (broker, budget and an RLM agent as
processes, `tests/integration/agent/rlm_kit.py`), the scripted LM (a FAKE model server) behind
the tenant's profile, and the gateway in this process. The turn's root run fans out to two child
runs; its trace is read back as the span tree, as OTLP/JSON (parsed with opentelemetry-proto
once the hex ids are decoded, parent links checked by id, then POSTed to an OTLP/HTTP receiver
the test runs) and live: with `OTEL_EXPORTER_OTLP_ENDPOINT` set the gateway exports the turn's
spans as it ends. Another tenant gets 404 on every route, and feedback lands on the log."""

import base64
import copy
import json
import re
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
from aiohttp import web
from google.protobuf import json_format
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from tests.integration.agent.rlm_kit import Processes, processes, session, step
from tests.integration.gateway.api_kit import Api, running_api, tenant_id

from fleet_events.session import TraceFeedbackRecorded, log_subject
from fleet_harness.scripted_lm import Reply, ScriptedLM, ScriptedRequest
from fleet_harness.waits import eventually
from fleet_mesh.natsserver import free_port

__all__ = ["processes"]
pytestmark = pytest.mark.slow

AGENT_ENV = {
    "FLEET_AGENT_TURN_SLOTS": "2",
    "FLEET_ENGINE_CHILD_SLOTS": "2",
    "FLEET_ENGINE_MAX_ITERS": "4",
    "FLEET_ENGINE_MAX_LLM_CALLS": "20",
}
FAN_OUT = "answers = sub_rlm_batched(['child task alpha', 'child task beta'])"
HEX32, HEX16 = re.compile(r"^[0-9a-f]{32}$"), re.compile(r"^[0-9a-f]{16}$")


def script(request: ScriptedRequest) -> Reply:
    """The root fans out to two children, then submits their answers; each child submits its
    name at once (children run concurrently, so replies are chosen by what the prompt holds)."""
    text = request.prompt_text
    if "ROOT" in text:
        if "answers = sub_rlm_batched" in text:
            return Reply(step("SUBMIT(answer=' '.join(answers))"), key="root-2")
        return Reply(step(FAN_OUT + "\nprint(answers)"), key="root-1")
    name = re.search(r"child task (alpha|beta)", text)
    assert name, "a request from neither the root nor a child"
    return Reply(step(f"SUBMIT(answer='{name.group(1)}')"), key=f"child-{name.group(1)}")


@dataclass
class Receiver:
    """An OTLP/HTTP trace receiver (`POST /v1/traces`, protobuf or JSON), as a collector is."""

    url: str
    requests: list[tuple[str, bool, ExportTraceServiceRequest]] = field(default_factory=list)
    """(content type, sent by a gateway's live export, the request)."""
    refuse: int = 0
    """Answer this many of the next requests 503, as a collector that is down would."""
    refused: int = 0

    def spans(self, *, live: bool, content_type: str | None = None) -> dict[bytes, Any]:
        return {
            span.span_id: span
            for kind, by_gateway, body in self.requests
            if by_gateway == live and content_type in (None, kind)
            for resource in body.resource_spans
            for scope in resource.scope_spans
            for span in scope.spans
        }


def protobuf_json(document: dict[str, Any]) -> dict[str, Any]:
    """OTLP/JSON's hex ids turned into protobuf's JSON mapping of bytes (base64)."""
    out = copy.deepcopy(document)
    for resource in out["resourceSpans"]:
        for scope in resource["scopeSpans"]:
            for span in scope["spans"]:
                for key in ("traceId", "spanId", "parentSpanId"):
                    if key in span:
                        span[key] = base64.b64encode(bytes.fromhex(span[key])).decode()
    return out


@pytest.fixture
async def receiver() -> AsyncIterator[Receiver]:
    port = free_port()
    got = Receiver(url=f"http://127.0.0.1:{port}")

    async def traces(request: web.Request) -> web.Response:
        kind = request.content_type
        body = await request.read()
        if got.refuse > 0:
            got.refuse -= 1
            got.refused += 1
            return web.Response(status=503, text="collector unavailable")
        if kind == "application/x-protobuf":
            message = ExportTraceServiceRequest.FromString(body)
        elif kind == "application/json":
            message = json_format.ParseDict(
                protobuf_json(json.loads(body)), ExportTraceServiceRequest()
            )
        else:
            return web.Response(status=415, text=f"unsupported content type {kind}")
        live = request.headers.get("User-Agent", "").startswith("fleet-rlm-gateway/")
        got.requests.append((kind, live, message))
        answer = ExportTraceServiceResponse().SerializeToString()
        return web.Response(body=answer, content_type="application/x-protobuf")

    app = web.Application()
    app.router.add_post("/v1/traces", traces)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    yield got
    await runner.cleanup()


@pytest.fixture
async def api(
    processes: Processes, receiver: Receiver, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[Api]:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.url)
    async with running_api(processes.server.url, tmp_path / "gw") as running:
        yield running


async def _recursive_turn(api: Api, tenant: str, fake: ScriptedLM) -> tuple[str, str]:
    made = await api.call(
        "POST", "/api/v1/runtime/llm-profiles", tenant,
        json={"name": "scripted", "model": "openai/scripted", "api_base": fake.base_url},
    )  # fmt: skip
    assert made.status_code == 201, made.text
    roles = {"planner": "scripted", "delegate": "scripted"}
    bound = await api.call("PATCH", "/api/v1/runtime/llm-roles", tenant, json={"roles": roles})
    assert bound.status_code == 200, bound.text
    created = await api.call("POST", "/api/v1/sessions", tenant, json={"title": "traces"})
    assert created.status_code == 201, created.text
    sid = created.json()["session"]["id"]
    asked = await api.call(
        "POST", f"/api/v1/sessions/{sid}/turns", tenant,
        json={"message": "ROOT: fan out to two children", "mode": "rlm_only"},
    )  # fmt: skip
    assert asked.status_code == 202, asked.text
    turn = asked.json()["turn"]

    async def ended() -> dict[str, Any] | None:
        page = await api.call("GET", f"/api/v1/sessions/{sid}/turns", tenant)
        rows = [t for t in page.json()["items"] if t["id"] == turn]
        return rows[0] if rows and rows[0]["status"] not in ("queued", "running") else None

    row = await eventually(ended, timeout=90, what="the recursive turn to end")
    assert row["status"] == "completed", row
    assert row["assistant_message"] == "alpha beta"
    return sid, turn


async def test_a_recursive_turn_is_one_trace_in_the_tree_in_otlp_and_live(
    api: Api, receiver: Receiver
) -> None:
    tenant, other = tenant_id(), tenant_id()
    with ScriptedLM(script) as fake:
        sid, turn = await _recursive_turn(api, tenant, fake)

    listed = await api.call("GET", f"/api/v1/sessions/{sid}/traces", tenant)
    assert listed.status_code == 200, listed.text
    (summary,) = listed.json()["items"]
    assert (summary["turn_id"], summary["status"], summary["llm_calls"]) == (turn, "completed", 4)
    assert HEX32.match(summary["trace_id"])

    debug = await api.call("GET", f"/api/v1/sessions/{sid}/trace-debug", tenant)
    assert debug.status_code == 200, debug.text
    body = debug.json()
    assert (body["trace_id"], body["resolved_from"]) == (summary["trace_id"], "latest")
    spans = {s["span_id"]: s for s in body["spans"]}
    runs = [s for s in body["spans"] if s["span_type"] == "run"]
    assert len(runs) == 3
    (root,) = [r for r in runs if r["attributes"]["fleet.run.depth"] == 0]
    children = [r for r in runs if r is not root]
    (fan_out,) = [s for s in body["spans"] if s["name"] == "execute_tool sub_rlm_batched"]
    assert all(c["parent_span_id"] == fan_out["span_id"] for c in children)
    cell = spans[fan_out["parent_span_id"]]
    iteration = spans[cell["parent_span_id"]]
    assert (cell["span_type"], iteration["span_type"]) == ("cell", "iteration")
    assert iteration["parent_span_id"] == root["span_id"]
    assert spans[root["parent_span_id"]]["span_type"] == "turn"
    assert body["performance_summary"]["runs"] == 3
    assert body["performance_summary"]["llm_calls"] == 4
    assert all(s["duration_ms"] is not None and s["duration_ms"] >= 0 for s in body["spans"])

    exported = await api.call("POST", f"/api/v1/sessions/{sid}/trace-export", tenant, json={})
    assert exported.status_code == 200, exported.text
    document = exported.json()
    raw_spans = document["resourceSpans"][0]["scopeSpans"][0]["spans"]
    assert all(HEX32.match(s["traceId"]) and HEX16.match(s["spanId"]) for s in raw_spans)
    parsed = json_format.ParseDict(protobuf_json(document), ExportTraceServiceRequest())
    proto = list(parsed.resource_spans[0].scope_spans[0].spans)
    assert len(proto) == len(body["spans"])
    ids = {s.span_id for s in proto}
    assert {s.span_id.hex() for s in proto} == set(spans)
    assert {s.trace_id.hex() for s in proto} == {summary["trace_id"]}
    assert all(s.parent_span_id in ids for s in proto if s.parent_span_id)
    assert sum(1 for s in proto if not s.parent_span_id) == 1
    by_id = {s.span_id.hex(): s for s in proto}
    for child in children:  # parent links by id: child run → the fan-out tool call
        assert by_id[child["span_id"]].parent_span_id.hex() == fan_out["span_id"]

    # the file as is, to a real OTLP/HTTP receiver, as protobuf
    async with httpx.AsyncClient() as client:
        posted = await client.post(
            receiver.url + "/v1/traces", content=parsed.SerializeToString(),
            headers={"Content-Type": "application/x-protobuf"},
        )  # fmt: skip
    assert posted.status_code == 200
    assert set(receiver.spans(live=False)) == ids

    # live: the gateway exported the same spans (OTLP/HTTP protobuf) when the turn ended
    async def live() -> dict[bytes, Any] | None:
        got = receiver.spans(live=True, content_type="application/x-protobuf")
        return got if set(got) >= ids else None

    streamed = await eventually(live, timeout=30, what="the live export to reach the receiver")
    assert set(streamed) == ids
    assert {s.trace_id.hex() for s in streamed.values()} == {summary["trace_id"]}

    root_run = root["attributes"]["fleet.run.id"]
    steps = await api.call("GET", f"/api/v1/runs/{root_run}/steps", tenant)
    assert steps.status_code == 200, steps.text
    kinds = [s["step_type"] for s in steps.json()["items"]]
    assert kinds[0] == "started"
    assert kinds[-1] == "completed"
    assert kinds.count("child_requested") == 2
    assert "llm_called" in kinds
    assert steps.json()["session_id"] == sid

    # another tenant: the same 404 as for what exists nowhere, on every route
    for method, path, payload in (
        ("GET", f"/api/v1/sessions/{sid}/traces", None),
        ("GET", f"/api/v1/sessions/{sid}/trace-debug", None),
        ("POST", f"/api/v1/sessions/{sid}/trace-export", {}),
        ("GET", f"/api/v1/runs/{root_run}/steps", None),
        ("POST", "/api/v1/traces/feedback", {"session_id": sid, "trace_id": summary["trace_id"]}),
    ):
        theirs = await api.call(method, path, other, json=payload)
        assert theirs.status_code == 404, (path, theirs.text)

    judged = await api.call(
        "POST", "/api/v1/traces/feedback", tenant,
        json={"session_id": sid, "trace_id": summary["trace_id"], "is_correct": True,
              "comment": "right", "expected_response": "alpha beta"},
    )  # fmt: skip
    assert judged.status_code == 200, judged.text
    assert judged.json()["turn_id"] == turn
    assert judged.json()["expectation_logged"] is True


async def test_feedback_is_recorded_on_the_turns_log_and_only_there(
    api: Api, processes: Processes
) -> None:
    tenant, other = tenant_id(), tenant_id()
    with ScriptedLM(script) as fake:
        sid, turn = await _recursive_turn(api, tenant, fake)
    unknown = await api.call(
        "POST", "/api/v1/traces/feedback", tenant,
        json={"session_id": sid, "turn_id": "no-such-turn", "is_correct": False},
    )  # fmt: skip
    assert unknown.status_code == 404, unknown.text
    neither = await api.call("POST", "/api/v1/traces/feedback", tenant, json={"session_id": sid})
    assert neither.status_code == 422
    assert "trace_id" in neither.json()["message"]
    foreign = await api.call(
        "POST", "/api/v1/traces/feedback", other, json={"session_id": sid, "turn_id": turn}
    )
    assert foreign.status_code == 404
    judged = await api.call(
        "POST", "/api/v1/traces/feedback", tenant,
        json={"session_id": sid, "turn_id": turn, "is_correct": False, "comment": "wrong"},
    )  # fmt: skip
    assert judged.status_code == 200, judged.text
    async with session(processes) as s:
        envelopes = await s.read(log_subject(tenant, sid))
    recorded = [e for e in envelopes if isinstance(e.data, TraceFeedbackRecorded)]
    assert len(recorded) == 1, "refused feedback stored something"
    (event,) = recorded
    assert (event.turn, event.data.is_correct, event.data.comment) == (turn, False, "wrong")
    assert event.data.trace_id == judged.json()["trace_id"]
    assert event.data.user == "alice"


async def test_two_gateway_replicas_export_each_ended_turn_once(
    api: Api, processes: Processes, receiver: Receiver, tmp_path: Path
) -> None:
    """Both replicas bind the one durable consumer: a turn's trace reaches the collector from
    one of them, not from each (the second turn, exported after the first, is the marker that
    a duplicate of the first would have had its chance to arrive)."""

    def exports_of(trace: str) -> int:
        found = 0
        for _, live, body in receiver.requests:
            ids = {s.trace_id.hex() for r in body.resource_spans for c in r.scope_spans
                   for s in c.spans}  # fmt: skip
            found += live and ids == {trace}
        return found

    traces: list[str] = []
    async with running_api(processes.server.url, tmp_path / "gw-2") as second:
        assert second.state.replica != api.state.replica
        with ScriptedLM(script) as fake:
            for _ in range(2):
                tenant = tenant_id()
                sid, _ = await _recursive_turn(api, tenant, fake)
                listed = await api.call("GET", f"/api/v1/sessions/{sid}/traces", tenant)
                trace = listed.json()["items"][0]["trace_id"]
                traces.append(trace)

                async def exported(t: str = trace) -> bool:
                    return exports_of(t) >= 1

                await eventually(exported, timeout=30, what="the turn's live export")
    assert [exports_of(t) for t in traces] == [1, 1]


async def test_a_collector_that_refuses_gets_the_trace_once_it_answers(
    processes: Processes, receiver: Receiver, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The live export acks a turn's message only after a 2xx: a collector answering 503
    twice still gets the trace, on the third delivery (the retry delay grows: 1 s, then 2 s).
    This gateway is told `http/json`, so the same trace also arrives as OTLP/JSON."""
    receiver.refuse = 2
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.url)
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "http/json")
    tenant = tenant_id()
    async with running_api(processes.server.url, tmp_path / "gw-json") as api:
        with ScriptedLM(script) as fake:
            sid, _ = await _recursive_turn(api, tenant, fake)
        listed = await api.call("GET", f"/api/v1/sessions/{sid}/traces", tenant)
        trace = listed.json()["items"][0]["trace_id"]

        async def delivered() -> bool:
            got = receiver.spans(live=True, content_type="application/json")
            return any(s.trace_id.hex() == trace for s in got.values())

        await eventually(delivered, timeout=30, what="the trace after the collector came back")
    assert receiver.refused == 2
