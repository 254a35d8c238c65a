"""Who may do what on the bus: each process kind's verbs, channels, streams and buckets.

The bus catalog (`fleet_events.bus`) says who *serves* each verb and what each channel carries;
this table adds who *calls* each verb, who appends to each channel, which streams it reads
(and which shared durable consumers it pulls from) and which buckets it reads or writes. From
it `permissions(role)` derives the NATS user's publish and subscribe allow-lists that
`fleet_mesh.credentials` writes into the servers' configuration, so a process that does what
this table does not say is refused by the server, not trusted to behave: a rogue or buggy
replica cannot answer another service's verbs, read another's replies (every role has its own
inbox prefix) or append to another's stream.

The subjects are NATS's own JetStream API (`$JS.API.…`), scoped to the streams a role reads;
the durable consumers of `fleet_events.streams.CONSUMERS` are pulled only by the role that owns
them. The table in docs/deployment.md is generated from here (`permission_markdown`) and a
test keeps it fresh.
"""

from dataclasses import dataclass
from typing import Any

from fleet_events import bus, streams, subjects
from fleet_events.bus import Channel, Verb
from fleet_events.streams import ConsumerSpec, KvSpec, ObjectStoreSpec, StreamSpec

ADMIN = "admin"
"""The local operator: `fleet up` itself (bootstrap, the embedded model's set-up), the CLI's
maintenance commands and the test harness. It may do everything, as the account owner may."""

ROLES: tuple[str, ...] = (*subjects.SERVICES, *subjects.ROLES, ADMIN)


def inbox_prefix(role: str) -> str:
    """Where a role's replies come back: `_INBOX.<role>`, subscribable by that role only."""
    return f"_INBOX.{check_role(role)}"


def check_role(role: str) -> str:
    if role not in ROLES:
        raise ValueError(f"unknown role {role!r}: expected one of {', '.join(ROLES)}")
    return role


@dataclass(frozen=True)
class Access:
    """What one process kind does. `serves` comes from the catalog (every verb whose service
    it is); the rest is what its code calls, appends to and reads."""

    role: str
    calls: tuple[Verb[Any, Any], ...] = ()
    appends: tuple[Channel, ...] = ()
    """Channels it publishes to (events appended, work items queued, live deltas sent)."""
    listens: tuple[Channel, ...] = ()
    """Core-NATS channels it subscribes to (no JetStream)."""
    watches: tuple[StreamSpec, ...] = ()
    """Streams whose subjects it subscribes to on core NATS, to hear of an append at once."""
    inspects: tuple[StreamSpec, ...] = ()
    """Streams whose configuration and state it may ask for (no message: readiness)."""
    reads: tuple[StreamSpec, ...] = ()
    pulls: tuple[ConsumerSpec, ...] = ()
    """Shared durable consumers it pulls from (their stream is read through them only)."""
    kv_reads: tuple[KvSpec, ...] = ()
    kv_writes: tuple[KvSpec, ...] = ()
    objects: tuple[ObjectStoreSpec, ...] = ()
    purges: tuple[StreamSpec, ...] = ()
    """Streams it may purge subjects of (the checkpointer's admin purge, behind a receipt)."""

    @property
    def serves(self) -> tuple[Verb[Any, Any], ...]:
        return tuple(v for v in bus.VERBS if v.service == self.role)


# Lookups the table below reads at import, built without calling this module's functions (so
# mutation testing, which makes every function of the module fail on demand, can import it).
_CHANNEL = {c.name: c for c in bus.CHANNELS}
_SERVED = {
    service: tuple(v for v in bus.VERBS if v.service == service and v.name != "ping")
    for service in {v.service for v in bus.VERBS}
}


_PINGS = tuple(bus.PING.values())

ACCESS: dict[str, Access] = {
    "gateway": Access(
        "gateway",
        calls=(
            *_PINGS,  # readiness asks every service
            bus.CREATE_SANDBOX, bus.LIST_SANDBOXES, bus.RESUME_SANDBOX, bus.LIST_VOLUME,
            bus.READ_VOLUME_FILE, bus.TEST_DAYTONA, bus.GET_SANDBOX, bus.DELETE_SANDBOX,
            bus.ARCHIVE_SANDBOX, bus.AGENT_STATUS, bus.TEST_LM, bus.PURGE_SESSION,
        ),
        appends=(_CHANNEL["session-log"],),
        listens=(_CHANNEL["live"],),
        watches=(streams.SESSIONS,),
        inspects=streams.STREAMS,
        reads=(streams.SESSIONS,),
        kv_reads=(streams.CONFIG, streams.SNAPSHOTS, streams.SECRETS, streams.TICKETS,
                  streams.GATEWAY),
        kv_writes=(streams.CONFIG, streams.SNAPSHOTS, streams.SECRETS, streams.TICKETS,
                   streams.GATEWAY),
        objects=(streams.BLOBS,),
    ),
    "agent": Access(
        "agent",
        calls=(
            *_SERVED["budget"],
            *_SERVED[bus.CREATE_SANDBOX.service],
            bus.AGENT_STATUS, bus.TEST_LM,
        ),
        appends=(
            _CHANNEL["session-log"], _CHANNEL["session-run"], _CHANNEL["agent-turn"],
            _CHANNEL["agent-child-run"], _CHANNEL["live"],
        ),
        listens=(_CHANNEL["cell-output"],),
        watches=(streams.SESSIONS,),
        reads=(streams.SESSIONS,),
        pulls=(streams.TURN_DISPATCH, streams.TURN_WORKERS, streams.CHILD_RUN_WORKERS),
        kv_reads=(streams.CONFIG, streams.SNAPSHOTS, streams.SECRETS),
        kv_writes=(streams.SNAPSHOTS,),
        objects=(streams.BLOBS,),
    ),
    "sandbox-broker": Access(
        "sandbox-broker",
        # another replica's sandbox (a fork, a child built beside its parent), and the
        # interpreter owning a context: its tool calls and its cell's output
        calls=(*_SERVED[bus.CREATE_SANDBOX.service], bus.TOOL_CALL),
        appends=(_CHANNEL["sandbox"], _CHANNEL["cell-output"]),
        reads=(streams.SANDBOXES, streams.SESSIONS),
        kv_reads=(streams.CONFIG, streams.SNAPSHOTS),
        kv_writes=(streams.SNAPSHOTS,),
        objects=(streams.BLOBS,),
    ),
    "budget": Access(
        "budget",
        appends=(_CHANNEL["budget-tree"], _CHANNEL["budget-tenant-day"]),
        reads=(streams.BUDGET,),
        kv_reads=(streams.SNAPSHOTS,),
        kv_writes=(streams.SNAPSHOTS,),
        objects=(streams.BLOBS,),
    ),
    "quality": Access(
        "quality",
        appends=(_CHANNEL["quality"],),
        reads=(streams.QUALITY,),
        kv_reads=(streams.SNAPSHOTS,),
        kv_writes=(streams.SNAPSHOTS,),
        objects=(streams.BLOBS,),
    ),
    "checkpointer": Access(
        "checkpointer",
        appends=(_CHANNEL["session-log"],),
        reads=(streams.SESSIONS,),
        purges=(streams.SESSIONS,),
        kv_reads=(streams.SNAPSHOTS,),
        kv_writes=(streams.SNAPSHOTS,),
        objects=(streams.BLOBS,),
    ),
}  # fmt: skip


def access_of(role: str) -> Access:
    try:
        return ACCESS[check_role(role)]
    except KeyError:
        raise ValueError(f"{role!r} may do everything: it has no access table") from None


# -- NATS permissions ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Permissions:
    """One NATS user's allow-lists (and the few denies that carve other roles' durable
    consumers out of a stream it reads). A role answers the requests of its verbs by
    publishing to its callers' inboxes (`_INBOX.<caller>.>`: publish only; no role subscribes
    to another's), not by NATS's `allow_responses`, which binds the answer to the connection
    the request came in on: an agent's interpreter hears a tool call on one connection and
    answers it on another."""

    publish: tuple[str, ...]
    subscribe: tuple[str, ...]
    publish_deny: tuple[str, ...] = ()

    def config(self) -> dict[str, Any]:
        """The `permissions` block of a user in nats-server's configuration."""
        publish: dict[str, Any] = {"allow": list(self.publish)}
        if self.publish_deny:
            publish["deny"] = list(self.publish_deny)
        return {"publish": publish, "subscribe": {"allow": list(self.subscribe)}}


EVERYTHING = Permissions(publish=(">",), subscribe=(">",))

JS_ALWAYS = ("$JS.API.INFO", "$JS.API.STREAM.NAMES")
"""What any JetStream client asks before anything else (its account, a stream by subject)."""


def _stream_reads(stream: str) -> tuple[str, ...]:
    api = "$JS.API"
    return (
        f"{api}.STREAM.INFO.{stream}",
        f"{api}.STREAM.MSG.GET.{stream}",
        f"{api}.DIRECT.GET.{stream}",
        f"{api}.DIRECT.GET.{stream}.>",
        f"{api}.CONSUMER.CREATE.{stream}",
        f"{api}.CONSUMER.CREATE.{stream}.>",
        f"{api}.CONSUMER.INFO.{stream}.*",
        f"{api}.CONSUMER.DELETE.{stream}.*",
        f"{api}.CONSUMER.MSG.NEXT.{stream}.*",
        f"$JS.ACK.{stream}.>",
        f"$JS.FC.{stream}.>",
    )


def _durable(spec: ConsumerSpec) -> tuple[str, ...]:
    api, stream, name = "$JS.API", spec.stream, spec.durable
    return (
        f"{api}.CONSUMER.CREATE.{stream}.{name}",
        f"{api}.CONSUMER.CREATE.{stream}.{name}.>",
        f"{api}.CONSUMER.DURABLE.CREATE.{stream}.{name}",
        f"{api}.CONSUMER.INFO.{stream}.{name}",
        f"{api}.CONSUMER.DELETE.{stream}.{name}",
        f"{api}.CONSUMER.MSG.NEXT.{stream}.{name}",
        f"$JS.ACK.{stream}.{name}.>",
    )


def _pattern(channel: Channel) -> str:
    """A channel's subjects as a NATS filter (each `{param}` one `*` token)."""
    return subjects.Pattern(channel.pattern).filter()


def _verb_filter(verb: Verb[Any, Any]) -> str:
    if verb.scope == "service":
        return verb.subject()
    if verb.scope == "sandbox":
        return subjects.SANDBOX_RPC.filter(service=verb.service, verb=verb.name)
    return subjects.CALLBACK.filter()


def callers_of(verb: Verb[Any, Any]) -> tuple[str, ...]:
    """The roles whose access table calls `verb`, and the admin (who may call anything)."""
    return (*(a.role for a in ACCESS.values() if verb in a.calls), ADMIN)


def _unique(items: list[str]) -> tuple[str, ...]:
    return tuple(dict.fromkeys(items))


def permissions(role: str) -> Permissions:
    """The allow-lists of `role`'s NATS user, derived from its access table and the catalog."""
    if check_role(role) == ADMIN:
        return EVERYTHING
    access = access_of(role)
    publish: list[str] = list(JS_ALWAYS)
    subscribe: list[str] = [f"{inbox_prefix(role)}.>"]
    publish += [_verb_filter(v) for v in access.calls]
    publish += [_pattern(c) for c in access.appends]
    subscribe += [_verb_filter(v) for v in access.serves]
    publish += [f"{inbox_prefix(c)}.>" for v in access.serves for c in callers_of(v)]
    subscribe += [_pattern(c) for c in access.listens]
    subscribe += [subject for spec in access.watches for subject in spec.subjects]
    publish += [f"$JS.API.STREAM.INFO.{s.name}" for s in access.inspects]
    read_streams = [s.name for s in access.reads]
    for name in read_streams:
        publish += _stream_reads(name)
    for spec in access.pulls:
        publish += _durable(spec)
    for kv in _unique([k.bucket for k in (*access.kv_reads, *access.kv_writes)]):
        publish += _stream_reads(f"KV_{kv}")
    publish += [f"$KV.{kv.bucket}.>" for kv in access.kv_writes]
    for store in access.objects:
        publish += [*_stream_reads(f"OBJ_{store.bucket}"), f"$O.{store.bucket}.>"]
        publish.append(f"$JS.API.STREAM.PURGE.OBJ_{store.bucket}")  # deleting an object
    publish += [f"$JS.API.STREAM.PURGE.{s.name}" for s in access.purges]
    # Another role's durable consumer on a stream this one reads stays that role's.
    own = {(c.stream, c.durable) for c in access.pulls}
    deny = [
        subject
        for spec in streams.CONSUMERS
        if spec.stream in read_streams and (spec.stream, spec.durable) not in own
        for subject in _durable(spec)
    ]
    return Permissions(
        publish=_unique(publish),
        subscribe=_unique(subscribe),
        publish_deny=_unique(deny),
    )


def permission_markdown() -> str:
    """The permission table of docs/deployment.md (a test keeps the doc in step)."""
    rows = [
        "| role | serves (subscribes) | calls | appends to | reads | buckets (r / w) |",
        "|---|---|---|---|---|---|",
    ]
    for role in ROLES:
        if role == ADMIN:
            rows.append(f"| {ADMIN} | everything (`>`) | everything | everything | everything "
                        "| everything |")  # fmt: skip
            continue
        a = access_of(role)
        serves = [f"`{v.key}`" for v in a.serves] + [f"`{c.name}`" for c in a.listens]
        serves += [f"{s.name} appends (core)" for s in a.watches]
        calls = sorted({f"`{v.key}`" for v in a.calls if v.name != "ping"})
        if any(v.name == "ping" for v in a.calls):
            calls.insert(0, "every `ping`")
        reads = [s.name for s in a.reads] + [f"{c.stream}/{c.durable}" for c in a.pulls]
        buckets = [k.bucket + (" (w)" if k in a.kv_writes else "") for k in a.kv_reads]
        buckets += [f"{o.bucket} (object, w)" for o in a.objects]
        cells = [
            role,
            ", ".join(serves) or "—",
            ", ".join(calls) or "—",
            ", ".join(f"`{c.name}`" for c in a.appends) or "—",
            ", ".join(reads) + (f"; purges {', '.join(s.name for s in a.purges)}"
                                if a.purges else ""),
            ", ".join(buckets) or "—",
        ]  # fmt: skip
        rows.append("| " + " | ".join(cells) + " |")
    return "\n".join(rows)
