"""The AsyncAPI 3 document of the whole bus, generated from the catalog (`fleet_events.bus`).

Every verb is a channel with a `receive` operation whose reply goes to the caller's inbox; every
event subject is a channel whose messages are the `Envelope` with that context's events in
`data`; the work queue and live deltas are channels too. Schemas come from msgspec, so they are
the wire types themselves, not a description kept beside them.
"""

import json
import re
from typing import Any, Union

import msgspec

from fleet_events.bus import CHANNELS, VERBS, Channel, Verb
from fleet_events.envelope import Envelope

VERSION = "3.0.0"
_REF = "#/components/schemas/{name}"
_PARAM = re.compile(r"\{(\w+)\}")


def _channel_id(pattern: str) -> str:
    return pattern.replace(".", "_").replace("{", "").replace("}", "")


def _envelope_name(channel: Channel) -> str:
    words = re.split(r"[-_]", channel.name)
    return "".join(w.capitalize() for w in words) + "Envelope"


def _parameters(pattern: str) -> dict[str, Any]:
    return {
        name: {"description": f"the {name} id, [A-Za-z0-9_-]{{1,64}}"}
        for name in _PARAM.findall(pattern)
    }


def _schemas() -> tuple[dict[str, Any], dict[str, str]]:
    """All component schemas, and the schema name of each message type."""
    types: list[Any] = []
    for verb in VERBS:
        types += [verb.request, verb.reply]
    event_channels = [c for c in CHANNELS if c.events]
    types += [_envelope_of(c.events) for c in event_channels]
    types += [c.payload for c in CHANNELS if c.payload is not None]
    refs, components = msgspec.json.schema_components(types, ref_template=_REF)
    text = json.dumps(components)
    names: dict[str, str] = {}
    renamed: dict[str, str] = {}
    for index, ref in enumerate(refs[: 2 * len(VERBS)]):
        names[_key(VERBS[index // 2], index % 2)] = ref["$ref"].rsplit("/", 1)[1]
    for offset, channel in enumerate(event_channels):
        generated = refs[2 * len(VERBS) + offset]["$ref"].rsplit("/", 1)[1]
        if generated not in renamed:  # channels carrying the same events share one schema
            readable = renamed[generated] = _envelope_name(channel)
            text = text.replace(json.dumps(generated), json.dumps(readable))
            old_ref, new_ref = _REF.format(name=generated), _REF.format(name=readable)
            text = text.replace(json.dumps(old_ref), json.dumps(new_ref))
        names[channel.name] = renamed[generated]
    for channel in CHANNELS:
        if channel.payload is not None:
            names[channel.name] = channel.payload.__name__
    return json.loads(text), names


def _envelope_of(events: tuple[type[Any], ...]) -> Any:
    union: Any = Union.__getitem__(events)  # a union built at runtime
    return Envelope[union]


def _key(verb: Verb[Any, Any], side: int) -> str:
    return f"{verb.key}:{'request' if side == 0 else 'reply'}"


def _message(name: str, summary: str) -> dict[str, Any]:
    return {"name": name, "summary": summary, "payload": {"$ref": _REF.format(name=name)}}


def asyncapi(version: str = "0.1.0") -> dict[str, Any]:
    """The document the gateway serves at `/asyncapi.json`."""
    schemas, names = _schemas()
    channels: dict[str, Any] = {}
    operations: dict[str, Any] = {}
    inbox_messages: dict[str, Any] = {}
    for verb in VERBS:
        cid = _channel_id(verb.pattern)
        request, reply = names[_key(verb, 0)], names[_key(verb, 1)]
        channels[cid] = {
            "address": verb.pattern,
            "title": f"{verb.service} {verb.name}",
            "description": f"{verb.summary} (scope: {verb.scope}"
            + (f", queue group {verb.queue()!r})" if verb.queue() else ")"),
            "parameters": _parameters(verb.pattern),
            "messages": {request: _message(request, verb.request.__name__)},
        }
        inbox_messages[reply] = _message(reply, verb.reply.__name__)
        operations[f"serve_{cid}"] = {
            "action": "receive",
            "channel": {"$ref": f"#/channels/{cid}"},
            "summary": verb.summary,
            "messages": [{"$ref": f"#/channels/{cid}/messages/{request}"}],
            "reply": {
                "address": {"location": "$message.header#/reply"},
                "channel": {"$ref": "#/channels/reply_inbox"},
                "messages": [{"$ref": f"#/channels/reply_inbox/messages/{reply}"}],
            },
        }
    channels["reply_inbox"] = {
        "address": None,
        "description": "the caller's inbox; an error reply carries a Fleet-Error header "
        "(a stable code) and the message as its body",
        "messages": inbox_messages,
    }
    for channel in CHANNELS:
        cid = _channel_id(channel.pattern)
        message = names.get(channel.name)
        entry: dict[str, Any] = {
            "address": channel.pattern,
            "title": channel.name,
            "description": channel.summary
            + (f" (stream {channel.stream})" if channel.stream else " (core NATS)"),
            "parameters": _parameters(channel.pattern),
            "messages": {},
        }
        if message is not None:
            entry["messages"][message] = _message(message, channel.summary)
        channels[cid] = entry
        operations[f"{'consume' if channel.kind == 'work' else 'watch'}_{cid}"] = {
            "action": "receive",
            "channel": {"$ref": f"#/channels/{cid}"},
            "summary": channel.summary,
            **(
                {"messages": [{"$ref": f"#/channels/{cid}/messages/{message}"}]}
                if message is not None
                else {}
            ),
        }
    return {
        "asyncapi": VERSION,
        "info": {
            "title": "fleet-rlm bus",
            "version": version,
            "description": "Every NATS subject, verb, event stream and work queue of fleet-rlm, "
            "generated from fleet_events.bus.",
        },
        "defaultContentType": "application/json",
        "channels": channels,
        "operations": operations,
        "components": {"schemas": schemas},
    }


if __name__ == "__main__":
    print(json.dumps(asyncapi(), indent=2))
