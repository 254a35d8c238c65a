"""The earlier name of the gateway's writer, kept for the routes that import it: both are
`sessionlog.append_event`, the one append of every client write to a session's `.log`."""

from typing import Any

from fleet_events import Actor, Envelope
from fleet_events.envelope import Event
from fleet_gateway.sessionlog import Appended, append_event, log_head
from fleet_mesh.store import EventStore

__all__ = ["append_to_log", "log_head"]


async def append_to_log(
    store: EventStore,
    actor: Actor,
    tenant: str,
    session: str,
    data: Event,
    *,
    turn: str | None = None,
    new_session: bool = False,
    **envelope: Any,
) -> tuple[int, Envelope[Any]]:
    """`append_event` answering (stream sequence, envelope): the log must exist (404), or
    with `new_session` must not (409)."""
    done = await append_event(
        store, actor, tenant, session, data, turn=turn, new_session=new_session, **envelope
    )
    assert isinstance(done, Appended)  # no `check`: it never answers an earlier request
    return done.seq, done.envelope
