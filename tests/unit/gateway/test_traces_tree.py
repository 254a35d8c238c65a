"""The span tree of a turn and its OTLP/JSON form, from a hand-written log: a root run that plans
an iteration, runs a cell whose `sub_rlm_batched` call starts two child runs (one answers, one
fails), and a sub-LLM call made from inside the cell. Parents, times, totals and ids are checked
by value; the OTLP form is parsed with opentelemetry-proto after its hex ids are decoded."""

import base64
import copy
from datetime import UTC, datetime, timedelta
from typing import Any

import msgspec
import pytest
from google.protobuf import json_format
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from fleet_events import Actor, Envelope, Event
from fleet_events.run import (
    CellExecuted,
    ChildRunCompleted,
    ChildRunFailed,
    ChildRunRequested,
    Escalated,
    IterationPlanned,
    LlmCalled,
    RunCompleted,
    RunFailed,
    RunStarted,
    ToolCalled,
    ToolReturned,
)
from fleet_events.session import TurnCompleted, TurnRequested, TurnStarted
from fleet_gateway.traces import otlp
from fleet_gateway.traces.export import OtlpTarget
from fleet_gateway.traces.tree import Trace, build, trace_id

T0 = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
ACTOR = Actor(service="test", replica="r")
TENANT, SESSION, TURN = "acme", "s1", "turn1"
ROOT, KID_A, KID_B = "root", "kid-a", "kid-b"


def env(ms: int, data: Event, run: str | None = None, parent: str | None = None) -> Envelope[Any]:
    return Envelope(
        id=f"e{ms}-{type(data).__name__}-{run}", tenant=TENANT, actor=ACTOR,
        ts=T0 + timedelta(milliseconds=ms), data=data, session=SESSION, turn=TURN, run=run,
        parent_run=parent,
    )  # fmt: skip


def llm(ms: int, run: str, call: str, latency: float, cell: str = "", **kw: Any) -> Envelope[Any]:
    event = LlmCalled(
        role="planner", model="openai/scripted", prompt_tokens=100, completion_tokens=10,
        cost=0.001, latency_ms=latency, call_id=call, request_kind=kw.pop("kind", "step"),
        cell=cell, response="```python\nprint(1)\n```", **kw,
    )  # fmt: skip
    return env(ms, event, run)


def log() -> list[Envelope[Any]]:
    def kid(task: str) -> RunStarted:
        return RunStarted(kind="rlm", tree="tree", depth=1, parent_call="call-1", task=task)

    return [
        env(0, TurnRequested(message="ROOT: do it")),
        env(5, TurnStarted(replica="agent-0")),
        env(10, RunStarted(kind="rlm", tree="tree", task="do it"), ROOT),
        llm(60, ROOT, "root-l0", 40),
        env(61, IterationPlanned(index=0, code="sub_rlm_batched([...])", llm_call="root-l0"), ROOT),
        env(
            70,
            ToolCalled(call_id="call-1", tool="sub_rlm_batched", source="sandbox", cell="c0"),
            ROOT,
        ),
        env(71, ChildRunRequested(child_run=KID_A, task="a", call_id="call-1"), ROOT),
        env(
            71, ChildRunRequested(child_run=KID_B, task="b", call_id="call-1", batch_index=1), ROOT
        ),
        env(75, kid("a"), KID_A, ROOT),
        env(76, kid("b"), KID_B, ROOT),
        llm(100, KID_A, "kid-a-l0", 20),
        llm(101, KID_B, "kid-b-l0", 20, error="the model refused"),
        env(110, RunCompleted(answer="A", iterations=1, llm_calls=1), KID_A, ROOT),
        env(111, RunFailed(error="no answer"), KID_B, ROOT),
        env(
            112,
            ChildRunCompleted(child_run=KID_A, answer="A", child_head_hash="h", call_id="call-1"),
            ROOT,
        ),
        env(112, ChildRunFailed(child_run=KID_B, error="no answer", call_id="call-1"), ROOT),
        env(113, ToolReturned(call_id="call-1", tool="sub_rlm_batched", result=["A"]), ROOT),
        llm(130, ROOT, "root-l1", 10, cell="c0", kind="sub"),
        env(140, CellExecuted(code="...", cell_id="c0", iteration=0, duration_ms=75), ROOT),
        env(150, RunCompleted(answer="done", iterations=1, llm_calls=4), ROOT),
        env(160, TurnCompleted(answer="done")),
    ]


def by_name(trace: Trace) -> dict[str, Any]:
    return {f"{s.kind}:{s.attributes.get('fleet.run.id') or s.name}": s for s in trace.spans}


def test_the_tree_nests_turn_runs_iterations_calls_cells_tools_and_children() -> None:
    trace = build(TENANT, SESSION, TURN, log())
    spans = {s.span_id: s for s in trace.spans}
    named = by_name(trace)
    turn, root = named["turn:invoke_workflow turn"], named["run:root"]
    iteration, cell = named["iteration:iteration 0"], named["cell:execute_tool code_cell"]
    tool = named["tool:execute_tool sub_rlm_batched"]
    kid_a, kid_b = named["run:kid-a"], named["run:kid-b"]
    assert trace.spans[0] is turn
    assert turn.parent_id is None
    assert root.parent_id == turn.span_id
    assert iteration.parent_id == root.span_id
    assert cell.parent_id == iteration.span_id
    assert tool.parent_id == cell.span_id
    assert kid_a.parent_id == tool.span_id
    assert kid_b.parent_id == tool.span_id
    llms = [s for s in trace.spans if s.kind == "llm"]
    parents = sorted(spans[s.parent_id].name for s in llms if s.parent_id)
    # the planning call under its iteration, the sub call under its cell, each child's own
    assert parents == sorted(
        ["iteration 0", "execute_tool code_cell", "invoke_agent rlm", "invoke_agent rlm"]
    )
    # every parent comes before its children
    order = [s.span_id for s in trace.spans]
    assert all(order.index(s.parent_id or "") < order.index(s.span_id) for s in trace.spans[1:])
    assert len(trace.spans) == 11

    assert (turn.start, turn.end) == (T0, T0 + timedelta(milliseconds=160))
    assert iteration.start == T0 + timedelta(milliseconds=20)  # its planning call's start
    assert iteration.end == T0 + timedelta(milliseconds=140)  # its cell's end
    assert cell.start == T0 + timedelta(milliseconds=65)
    assert (tool.duration_ms, kid_a.duration_ms) == (43.0, 35.0)

    assert (turn.llm_calls, turn.tokens_in, turn.tokens_out) == (4, 400, 40)
    assert round(turn.cost, 6) == 0.004
    assert (kid_a.llm_calls, root.llm_calls) == (1, 4)
    assert (kid_b.status, kid_b.error) == ("error", "no answer")
    assert (trace.status, trace.message, trace.answer) == ("completed", "ROOT: do it", "done")


def test_ids_are_fixed_by_the_log_so_a_rebuild_gives_the_same_trace() -> None:
    first, again = build(TENANT, SESSION, TURN, log()), build(TENANT, SESSION, TURN, log())
    assert [s.span_id for s in first.spans] == [s.span_id for s in again.spans]
    assert first.trace_id == trace_id(TENANT, SESSION, TURN)
    assert len(first.trace_id) == 32
    assert int(first.trace_id, 16) >= 0
    assert all(len(s.span_id) == 16 and s.span_id == s.span_id.lower() for s in first.spans)
    assert len({s.span_id for s in first.spans}) == len(first.spans)
    other = build("other-tenant", SESSION, TURN, log())
    assert other.trace_id != first.trace_id
    assert not {s.span_id for s in other.spans} & {s.span_id for s in first.spans}


def test_events_of_other_turns_are_left_out_and_an_open_turn_stays_open() -> None:
    events = log()[:12]  # cut before anything ended
    stray = msgspec.structs.replace(events[3], turn="another")
    trace = build(TENANT, SESSION, TURN, [*events, stray])
    assert trace.status == "open"
    assert trace.root.end is None
    assert sum(1 for s in trace.spans if s.kind == "llm") == 3  # the other turn's call is not in
    document = otlp.export_request([trace], service_version="1")
    (resource,) = document["resourceSpans"]
    spans = resource["scopeSpans"][0]["spans"]
    root = next(s for s in spans if "parentSpanId" not in s)
    assert root["status"] == {"code": otlp.STATUS_UNSET}
    assert int(root["endTimeUnixNano"]) >= int(root["startTimeUnixNano"])


def _protobuf_json(document: dict[str, Any]) -> dict[str, Any]:
    """OTLP/JSON's hex ids as protobuf's JSON mapping wants them (base64 of the bytes)."""
    out = copy.deepcopy(document)
    for resource in out["resourceSpans"]:
        for scope in resource["scopeSpans"]:
            for span in scope["spans"]:
                for key in ("traceId", "spanId", "parentSpanId"):
                    if key in span:
                        span[key] = base64.b64encode(bytes.fromhex(span[key])).decode()
    return out


def test_the_otlp_form_parses_as_opentelemetry_proto_with_genai_attributes() -> None:
    trace = build(TENANT, SESSION, TURN, log())
    document = otlp.export_request([trace], service_version="0.1.0", replica="gw-1")
    parsed = json_format.ParseDict(_protobuf_json(document), ExportTraceServiceRequest())
    spans = list(parsed.resource_spans[0].scope_spans[0].spans)
    assert len(spans) == len(trace.spans)
    ids = {s.span_id for s in spans}
    assert all(len(s.trace_id) == 16 and s.trace_id.hex() == trace.trace_id for s in spans)
    assert all(s.parent_span_id in ids for s in spans if s.parent_span_id)
    assert sum(1 for s in spans if not s.parent_span_id) == 1

    def attrs(span: Any) -> dict[str, Any]:
        return {a.key: getattr(a.value, a.value.WhichOneof("value")) for a in span.attributes}

    chat = [attrs(s) for s in spans if s.name == "chat openai/scripted"]
    assert len(chat) == 4
    assert all(a["gen_ai.operation.name"] == "chat" for a in chat)
    assert all(a["gen_ai.request.model"] == "openai/scripted" for a in chat)
    assert all(a["gen_ai.provider.name"] == "openai" for a in chat)
    assert {(a["gen_ai.usage.input_tokens"], a["gen_ai.usage.output_tokens"]) for a in chat} == {
        (100, 10)
    }
    assert all(a["openinference.span.kind"] == "LLM" for a in chat)
    assert {a["llm.token_count.total"] for a in chat} == {110}
    agents = [attrs(s) for s in spans if s.name == "invoke_agent rlm"]
    assert {a["openinference.span.kind"] for a in agents} == {"AGENT"}
    assert sorted(a["gen_ai.agent.id"] for a in agents) == sorted([ROOT, KID_A, KID_B])
    tool = next(attrs(s) for s in spans if s.name == "execute_tool sub_rlm_batched")
    assert (tool["gen_ai.operation.name"], tool["gen_ai.tool.call.id"]) == (
        "execute_tool",
        "call-1",
    )
    assert all(attrs(s)["gen_ai.conversation.id"] == SESSION for s in spans)
    failed = next(s for s in spans if s.status.message == "no answer")
    assert failed.status.code == otlp.STATUS_ERROR
    resource = {a.key: a.value.string_value for a in parsed.resource_spans[0].resource.attributes}
    assert resource["service.name"] == "fleet-rlm"
    assert resource["service.instance.id"] == "gw-1"
    turn = next(s for s in spans if not s.parent_span_id)
    assert turn.end_time_unix_nano - turn.start_time_unix_nano == 160 * 10**6


def test_the_collector_is_named_from_otels_variables_and_logged_without_credentials() -> None:
    assert OtlpTarget.from_env({}) is None
    base = OtlpTarget.from_env(
        {"OTEL_EXPORTER_OTLP_ENDPOINT": "https://u:pw@collector:4318/",
         "OTEL_EXPORTER_OTLP_HEADERS": "authorization=Bearer s3cret, x-team = a,broken"}
    )  # fmt: skip
    assert base is not None
    assert base.url == "https://u:pw@collector:4318/v1/traces"
    assert base.headers == {"authorization": "Bearer s3cret", "x-team": "a"}
    assert base.shown == "https://collector:4318/v1/traces"
    own = OtlpTarget.from_env(
        {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://ignored:1",
         "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://c:4318/custom?token=t"}
    )  # fmt: skip
    assert own is not None
    assert own.url == "http://c:4318/custom?token=t"
    assert "token" not in own.shown


def test_the_protobuf_body_is_the_same_request_and_protocols_are_checked() -> None:
    document = otlp.export_request([build(TENANT, SESSION, TURN, log())], service_version="1")
    parsed = ExportTraceServiceRequest.FromString(otlp.protobuf(document))
    again = json_format.ParseDict(_protobuf_json(document), ExportTraceServiceRequest())
    assert parsed == again
    default = OtlpTarget.from_env({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:1"})
    assert default is not None
    assert default.protocol == "http/protobuf"
    with pytest.raises(ValueError, match=r"'grpc'.*http/protobuf, http/json"):
        OtlpTarget.from_env(
            {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:1", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}
        )


def test_a_chat_agent_turn_nests_its_tools_and_says_where_it_escalated() -> None:
    """The chat agent (ReAct) calls tools outside any cell and may escalate to the RLM."""
    chat = "chat-run"
    events = [
        env(0, TurnRequested(message="look it up")),
        env(1, RunStarted(kind="chat", tree="tree", task="look it up"), chat),
        llm(30, chat, "", 20),  # a call with no call id: under its run
        env(31, IterationPlanned(index=0, tool="search"), chat),
        env(32, ToolCalled(call_id="t1", tool="search", args={"q": "x"}), chat),
        env(40, ToolReturned(call_id="t1", tool="search", error="offline"), chat),
        env(41, Escalated(from_module="react", to_module="rlm", rule="tools_needed"), chat),
        env(50, RunFailed(error="gave up"), chat),
        env(51, TurnCompleted(answer="sorry")),
    ]
    trace = build(TENANT, SESSION, TURN, events)
    named = {s.name: s for s in trace.spans}
    run, tool = named["invoke_agent chat"], named["execute_tool search"]
    assert tool.parent_id == run.span_id
    assert (tool.status, tool.error, tool.duration_ms) == ("error", "offline", 8.0)
    assert named["chat openai/scripted"].parent_id == run.span_id
    assert run.attributes["fleet.run.escalated"] == "react->rlm"
    assert named["iteration 0"].attributes["fleet.iteration.tool"] == "search"
    assert (run.status, run.error) == ("error", "gave up")
