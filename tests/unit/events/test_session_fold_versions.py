"""A replica one version behind reads a log a newer replica wrote to (issue 9, item 9)."""

import msgspec
import pytest

from fleet_agent.lenient import LenientCodec, Unknown
from fleet_events import Actor, BlobRef, Envelope, Event, utc_now
from fleet_events.codec import Codec, CodecError, sha256_hex
from fleet_events.session import CoreMemoryChanged, log_subject
from fleet_events.session_fold import EMPTY, evolve, skipped_line
from fleet_mesh.store import StoredEvent

ACTOR = Actor(service="agent", replica="a-new")


class ToolBudgetSet(Event, frozen=True, kw_only=True, tag="future.tool_budget_set"):
    """A type only the newer replica has."""

    tools: int


class MemoryBlobs:
    """An in-memory stand-in for the object store (the JetStream one is tested on a server)."""

    def __init__(self) -> None:
        self.data: dict[str, bytes] = {}

    async def put(self, tenant: str, data: bytes) -> BlobRef:
        digest = sha256_hex(data)
        self.data[f"{tenant}/{digest}"] = data
        return BlobRef(object=f"{tenant}/{digest}", sha256=digest, size=len(data))

    async def get(self, tenant: str, sha256: str) -> bytes:
        return self.data[f"{tenant}/{sha256}"]


def newer(data: Event) -> bytes:
    env = Envelope(
        id="e7", tenant="acme", session="s1", turn="t1", actor=ACTOR, ts=utc_now(), data=data
    )
    return msgspec.json.encode(env)


def test_the_strict_codec_refuses_a_newer_type_and_the_lenient_one_keeps_its_place() -> None:
    raw = newer(ToolBudgetSet(tools=3))
    with pytest.raises(CodecError, match=r"future\.tool_budget_set"):
        Codec().decode_stored(raw)
    env = LenientCodec().decode_stored(raw)
    assert env.data == Unknown(of_type="future.tool_budget_set")
    assert (env.id, env.tenant, env.session, env.turn, env.actor) == (
        "e7",
        "acme",
        "s1",
        "t1",
        ACTOR,
    )


def test_known_events_decode_as_ever() -> None:
    event = CoreMemoryChanged(block="human", op="append", value="x")
    assert LenientCodec().decode_stored(newer(event)).data == event


@pytest.mark.parametrize(
    "raw",
    [
        b"not json",
        b'{"id": "e", "tenant": "acme"}',
        msgspec.json.encode(
            {"id": "e", "tenant": "acme", "actor": {"service": "a", "replica": "b"},
             "ts": "2026-01-01T00:00:00Z", "data": {"type": "run.completed"}}
        ),
        msgspec.json.encode(
            {"id": "e", "tenant": "acme", "actor": {"service": "a", "replica": "b"},
             "ts": "2026-01-01T00:00:00Z", "data": {"no_type": 1}}
        ),
    ],
    ids=["not-json", "no-data", "known-type-missing-field", "untagged-data"],
)  # fmt: skip
def test_damage_is_still_an_error_not_an_unknown_type(raw: bytes) -> None:
    with pytest.raises(CodecError):
        LenientCodec().decode_stored(raw)


async def test_an_offloaded_event_of_a_newer_type_is_kept_as_unknown_too() -> None:
    blobs = MemoryBlobs()
    big = Envelope(
        id="e8", tenant="acme", session="s1", actor=ACTOR, ts=utc_now(), data=ToolBudgetSet(tools=1)
    )
    stub = await Codec(blobs, inline_limit=10).encode(big)
    assert blobs.data, "the envelope was not offloaded"
    env = await LenientCodec(blobs).decode(stub, tenant="acme")
    assert env.data == Unknown(of_type="future.tool_budget_set")


def test_the_fold_skips_and_names_the_newer_type() -> None:
    env = LenientCodec().decode_stored(newer(ToolBudgetSet(tools=3)))
    event = StoredEvent(
        subject=log_subject("acme", "s1"), seq=3, envelope=env, hash="", prev_hash=""
    )
    state = evolve(evolve(EMPTY, event), event)
    assert (state.skipped, state.skipped_count) == (("future.tool_budget_set",), 2)
    assert msgspec.structs.replace(state, skipped=(), skipped_count=0) == EMPTY
    line = skipped_line(state)
    assert line is not None
    assert "future.tool_budget_set" in line
