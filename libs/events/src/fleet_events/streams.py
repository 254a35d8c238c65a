"""What the bootstrap creates: streams, the work queue, the config KV and the object store.

Plain data, so the bootstrap (fleet_mesh) and the docs test read the same definitions.
"""

from dataclasses import dataclass
from typing import Literal

from fleet_events import subjects as spaces


@dataclass(frozen=True, slots=True)
class StreamSpec:
    name: str
    subjects: tuple[str, ...]
    retention: Literal["limits", "workqueue"] = "limits"
    allow_atomic: bool = True
    duplicate_window_s: float = 120.0
    max_msg_size: int = 1024 * 1024
    description: str = ""


@dataclass(frozen=True, slots=True)
class KvSpec:
    bucket: str
    history: int = 1
    max_value_size: int = 1024 * 1024
    description: str = ""
    ttl_s: float | None = None
    """Entries expire this long after they are written (None: never)."""


@dataclass(frozen=True, slots=True)
class ObjectStoreSpec:
    bucket: str
    description: str = ""


SESSIONS = StreamSpec(
    "SESSIONS",
    (spaces.SESSIONS_ALL,),
    description="authoritative session logs: .log per session, .run.<run> per run",
)
SANDBOXES = StreamSpec(
    "SANDBOXES", (spaces.stream_scope("sandbox"),), description="sandbox lifecycle"
)
BUDGET = StreamSpec(
    "BUDGET", (spaces.stream_scope("budget"),), description="ledger of each recursive tree"
)
QUALITY = StreamSpec(
    "QUALITY", (spaces.stream_scope("quality"),), description="datasets, runs, promotions"
)
WORK = StreamSpec(
    "WORK",
    (spaces.stream_scope("work"),),
    retention="workqueue",
    allow_atomic=False,
    description="turns, child runs, optimization runs: pulled by any replica",
)

EVENT_STREAMS = (SESSIONS, SANDBOXES, BUDGET, QUALITY)
STREAMS = (*EVENT_STREAMS, WORK)

CONFIG = KvSpec("fleet-config", history=16, description="runtime settings, LLM profiles, roles")
SNAPSHOTS = KvSpec(
    "fleet-snapshots", history=1, max_value_size=8 * 1024 * 1024, description="fold snapshots"
)
SECRETS = KvSpec(
    "fleet-secrets",
    history=1,
    max_value_size=64 * 1024,
    description="secrets sealed to the services' public key: services read, the gateway writes",
)
TICKETS = KvSpec(
    "fleet-tickets",
    history=1,
    max_value_size=4 * 1024,
    ttl_s=300.0,
    description="single-use WebSocket tickets: any gateway replica redeems one exactly once",
)
GATEWAY = KvSpec(
    "fleet-gateway",
    history=1,
    max_value_size=4 * 1024,
    description="the gateway's shared state: API tokens (hashed), per-tenant upload allowances",
)
KV_BUCKETS = (CONFIG, SNAPSHOTS, SECRETS, TICKETS, GATEWAY)

BLOBS = ObjectStoreSpec("fleet-blobs", description="payloads over the inline limit")
OBJECT_STORES = (BLOBS,)


@dataclass(frozen=True, slots=True)
class ConsumerSpec:
    """A durable pull consumer every replica of a service shares (any replica takes any
    message). `ack_wait_s` is the ack deadline: a message neither acked nor reported in
    progress for that long is redelivered. `max_deliver` bounds deliveries (-1: unbounded)."""

    stream: str
    durable: str
    filter_subject: str
    ack_wait_s: float = 30.0
    max_deliver: int = -1
    max_ack_pending: int = 10_000
    description: str = ""
    deliver: Literal["all", "new"] = "all"
    """Where a new consumer starts: the first stored message, or the first stored after it
    is created (an exporter that only cares about what happens from now on)."""


TURN_DISPATCH = ConsumerSpec(
    SESSIONS.name,
    "agent-turn-dispatch",
    spaces.SESSION_LOGS,
    description="the agent's dispatcher: each TurnRequested on a session log becomes a work item",
)
TURN_WORKERS = ConsumerSpec(
    WORK.name,
    "agent-turn",
    spaces.work("agent", "turn"),
    # One delivery more than the attempts allowed (fleet_agent.config.AgentSettings.max_attempts):
    # the last one only records the poison turn's TurnFailed.
    max_deliver=4,
    description="turns, pulled by any agent replica with a free slot",
)
CHILD_RUN_WORKERS = ConsumerSpec(
    WORK.name,
    "agent-child-run",
    spaces.work("agent", "child_run"),
    # A redelivery finds the run started and records it failed (no resume yet, issue 16):
    # three deliveries cover a dead holder and a death while recording that.
    max_deliver=3,
    description="child runs of recursive trees (sub_rlm), pulled by any agent replica with a "
    "free child slot",
)
CONSUMERS = (TURN_DISPATCH, TURN_WORKERS, CHILD_RUN_WORKERS)
