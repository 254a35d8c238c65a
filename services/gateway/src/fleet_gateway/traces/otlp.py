"""Traces as an OTLP/JSON `ExportTraceServiceRequest`, with the OpenTelemetry GenAI semantic
conventions (`gen_ai.*`), so Jaeger, Phoenix or any OTLP receiver show a recursive turn as one
trace: the turn `invoke_workflow`, each run `invoke_agent`, each model call `chat`, each host
tool and code cell `execute_tool`. Phoenix's OpenInference names (`openinference.span.kind`,
`llm.token_count.*`) ride along, so it shows kinds and usage without a conversion.

OTLP/JSON's own rules, not protobuf's generic JSON mapping: trace and span ids are lowercase
hex (32 and 16 characters), 64-bit integers (times, token counts) are decimal strings, enums are
their numbers. Pure: a `Trace` in, a dict out.
"""

import base64
import copy
from datetime import UTC, datetime
from typing import Any

from google.protobuf import json_format
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from fleet_gateway.traces.tree import Attr, Span, Trace

SCOPE = "fleet-rlm.traces"
SPAN_KIND_INTERNAL, SPAN_KIND_CLIENT = 1, 3
STATUS_UNSET, STATUS_OK, STATUS_ERROR = 0, 1, 2
_EPOCH = datetime.fromtimestamp(0, UTC)

_OPERATION = {
    "turn": "invoke_workflow",
    "run": "invoke_agent",
    "child": "invoke_agent",
    "llm": "chat",
    "tool": "execute_tool",
    "cell": "execute_tool",
}


def nanos(ts: datetime) -> str:
    delta = ts - _EPOCH
    return str((delta.days * 86_400 + delta.seconds) * 10**9 + delta.microseconds * 1000)


def value(raw: Attr) -> dict[str, Any]:
    if isinstance(raw, bool):  # before int: a bool is an int in Python
        return {"boolValue": raw}
    if isinstance(raw, int):
        return {"intValue": str(raw)}
    if isinstance(raw, float):
        return {"doubleValue": raw}
    return {"stringValue": raw}


def _attributes(attrs: dict[str, Attr]) -> list[dict[str, Any]]:
    return [{"key": key, "value": value(attrs[key])} for key in sorted(attrs)]


def provider(model: str) -> str:
    """LiteLLM's `provider/model` names the provider (`openai/gpt-4o` → `openai`)."""
    return model.split("/", 1)[0] if "/" in model else "openai"


def gen_ai(span: Span, trace: Trace) -> dict[str, Attr]:
    """The GenAI convention's attributes of `span`, beside the `fleet.*` ones it carries."""
    attrs: dict[str, Attr] = {"gen_ai.conversation.id": trace.session}
    operation = _OPERATION.get(span.kind)
    if operation is None:  # an iteration: a step of the agent, not a GenAI operation
        return attrs
    attrs["gen_ai.operation.name"] = operation
    if span.kind == "turn":
        attrs["gen_ai.workflow.name"] = "fleet-rlm turn"
    elif span.kind in ("run", "child"):
        attrs["gen_ai.agent.id"] = str(span.attributes.get("fleet.run.id", ""))
        attrs["gen_ai.agent.name"] = str(span.attributes.get("fleet.run.kind", "rlm"))
    elif span.kind == "llm":
        model = str(span.attributes.get("fleet.llm.model", ""))
        attrs["gen_ai.request.model"] = model
        attrs["gen_ai.provider.name"] = provider(model)
        attrs["gen_ai.usage.input_tokens"] = span.tokens_in
        attrs["gen_ai.usage.output_tokens"] = span.tokens_out
    elif span.kind == "tool":
        attrs["gen_ai.tool.name"] = str(span.attributes.get("fleet.tool.name", ""))
        attrs["gen_ai.tool.call.id"] = str(span.attributes.get("fleet.tool.call_id", ""))
    elif span.kind == "cell":
        attrs["gen_ai.tool.name"] = "code_cell"
        attrs["gen_ai.tool.call.id"] = str(span.attributes.get("fleet.cell.id", ""))
    return attrs


_OPENINFERENCE = {
    "turn": "CHAIN",
    "iteration": "CHAIN",
    "run": "AGENT",
    "child": "AGENT",
    "llm": "LLM",
    "tool": "TOOL",
    "cell": "TOOL",
}


def openinference(span: Span) -> dict[str, Attr]:
    """What Phoenix (OpenInference) reads to show a span's kind and a model call's usage,
    beside the GenAI names; `gen_ai.system` for consumers older than `gen_ai.provider.name`."""
    attrs: dict[str, Attr] = {"openinference.span.kind": _OPENINFERENCE[span.kind]}
    if span.kind == "llm":
        model = str(span.attributes.get("fleet.llm.model", ""))
        attrs.update(
            {"llm.model_name": model, "llm.provider": provider(model),
             "gen_ai.system": provider(model), "llm.token_count.prompt": span.tokens_in,
             "llm.token_count.completion": span.tokens_out,
             "llm.token_count.total": span.tokens_in + span.tokens_out}
        )  # fmt: skip
    elif span.kind == "tool":
        attrs["tool.name"] = str(span.attributes.get("fleet.tool.name", ""))
    elif span.kind == "cell":
        attrs["tool.name"] = "code_cell"
    return attrs


def otlp_span(span: Span, trace: Trace, last: datetime) -> dict[str, Any]:
    attrs: dict[str, Attr] = {**span.attributes, **openinference(span), **gen_ai(span, trace)}
    attrs.update({"fleet.span.kind": span.kind, "fleet.cost_usd": round(span.cost, 8)})
    if span.kind != "llm":  # the subtree's totals; only a model call carries gen_ai.usage
        attrs.update(
            {"fleet.usage.input_tokens": span.tokens_in,
             "fleet.usage.output_tokens": span.tokens_out, "fleet.llm_calls": span.llm_calls}
        )  # fmt: skip
    if span.end is None:
        attrs["fleet.open"] = True
    status: dict[str, Any] = {"code": STATUS_OK}
    if span.status == "error":
        status = {"code": STATUS_ERROR, "message": span.error[:1000]}
    elif span.status == "open":
        status = {"code": STATUS_UNSET}
    out: dict[str, Any] = {
        "traceId": trace.trace_id,
        "spanId": span.span_id,
        "name": span.name,
        "kind": SPAN_KIND_CLIENT if span.kind == "llm" else SPAN_KIND_INTERNAL,
        "startTimeUnixNano": nanos(span.start),
        "endTimeUnixNano": nanos(span.end or max(last, span.start)),
        "attributes": _attributes(attrs),
        "status": status,
    }
    if span.parent_id is not None:
        out["parentSpanId"] = span.parent_id
    return out


def export_request(
    traces: list[Trace], *, service_version: str, replica: str = ""
) -> dict[str, Any]:
    """One resource (the fleet-rlm service, the tenant) with one scope holding every span."""
    resource: dict[str, Attr] = {"service.name": "fleet-rlm", "service.version": service_version}
    if traces:
        resource["fleet.tenant"] = traces[0].tenant
    if replica:
        resource["service.instance.id"] = replica
    spans: list[dict[str, Any]] = []
    for trace in traces:
        last = max((s.end or s.start for s in trace.spans), default=trace.root.start)
        spans.extend(otlp_span(span, trace, last) for span in trace.spans)
    return {
        "resourceSpans": [
            {
                "resource": {"attributes": _attributes(resource)},
                "scopeSpans": [
                    {"scope": {"name": SCOPE, "version": service_version}, "spans": spans}
                ],
            }
        ]
    }


def protobuf(document: dict[str, Any]) -> bytes:
    """The same request as OTLP/HTTP's protobuf body (what every collector must accept; some,
    Phoenix among them, take nothing else): the hex ids become the bytes they spell."""
    shaped = copy.deepcopy(document)
    for resource in shaped["resourceSpans"]:
        for scope in resource["scopeSpans"]:
            for span in scope["spans"]:
                for key in ("traceId", "spanId", "parentSpanId"):
                    if key in span:
                        span[key] = base64.b64encode(bytes.fromhex(span[key])).decode()
    message = json_format.ParseDict(shaped, ExportTraceServiceRequest())
    return bytes(message.SerializeToString())
