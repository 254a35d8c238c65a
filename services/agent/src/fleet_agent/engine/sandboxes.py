"""The session's sandbox for a turn: found, resumed, replaced or made, and recorded on the
session's log (`SandboxAttached`) when it changed. Both runners use it: the RLM turn runner
before the root run, the chat agent when a tool first needs the sandbox.
"""

import asyncio
import logging
from typing import Any

from fleet_agent.engine.model import EngineMesh
from fleet_agent.lenient import LenientCodec
from fleet_agent.run.failures import REPO_UNAVAILABLE, RunFailure
from fleet_events import Envelope, Event, bus, new_id, streams, utc_now
from fleet_events import sandbox as sb
from fleet_events.session import InterpreterState, SandboxAttached, TurnRequested, log_subject
from fleet_events.session_fold import FOLD, SessionState
from fleet_mesh import rpc
from fleet_mesh.blobs import JetStreamBlobs
from fleet_mesh.decider import Decision
from fleet_mesh.store import EventStore

log = logging.getLogger("fleet.agent.engine")

BROKER_PATIENCE_S = 120.0
"""How long a turn asks the broker again (the same request id: the broker answers a retried
id with its first answer) while it says `unavailable` ("retry shortly": its view of the
sandbox log catching up after a restart, a sandbox being resumed elsewhere) or while no
broker answers at all (one starting again)."""
BROKER_RETRY = frozenset({"unavailable"})


async def session_sandbox(mesh: EngineMesh, tenant: str, session: str, turn: str) -> str:
    """The session's sandbox id: resumed (or replaced on the same volume), or created; a new
    one is recorded on the session's log as `SandboxAttached` (docs/agent.md)."""
    future = mesh.bus.submit(_session_sandbox(mesh, tenant, session, turn))
    return await asyncio.wrap_future(future)


async def _session_sandbox(mesh: EngineMesh, tenant: str, session: str, turn: str) -> str:
    js = mesh.bus.nc.jetstream()
    lenient = EventStore(js, streams.SESSIONS, LenientCodec(await JetStreamBlobs.open(js)))
    state, wanted = await _fold_and_repo(lenient, tenant, session, turn)
    known = state.image.interpreter
    nc = mesh.bus.nc
    if wanted is None and known is not None:
        wanted = (known.repo_url, known.ref)
    if known is not None and known.sandbox and wanted == (known.repo_url, known.ref):
        info = await rpc.call_verb_retrying(
            nc, bus.RESUME_SANDBOX,
            sb.ResumeSandbox(request_id=new_id(), tenant=tenant, sandbox=known.sandbox),
            attempt_timeout=60, deadline=BROKER_PATIENCE_S, retry_codes=BROKER_RETRY,
        )  # fmt: skip
        if info.sandbox == known.sandbox:
            return info.sandbox
        reason = "replaced"
    else:  # none yet, or the turn names another repository or ref: a sandbox with it cloned
        repo_url, ref = wanted or (None, None)
        create = sb.CreateSandbox(
            request_id=new_id(), tenant=tenant, labels={"session": session, "role": "session"},
            volume=known.volume if known else None,
            volume_subpath=known.volume_subpath if known else None,
            repo_url=repo_url, ref=ref,
        )  # fmt: skip
        try:
            info = await rpc.call_verb_retrying(
                nc, bus.CREATE_SANDBOX, create, attempt_timeout=120,
                deadline=BROKER_PATIENCE_S + 120, retry_codes=BROKER_RETRY,
            )  # fmt: skip
        except rpc.RemoteError as exc:
            if repo_url is None:
                raise
            raise RepoUnavailable(repo_url, ref, exc.message) from exc
        reason = "repo" if known is not None and known.sandbox else "created"
    replaces = known.sandbox or "" if known else ""
    await attach(mesh, tenant, session, turn, info, replaces, reason)
    if reason == "repo":  # the old checkout is no longer the session's: not left running
        await _retire(nc, tenant, replaces)
    return info.sandbox


class RepoUnavailable(RunFailure):
    """The broker could not clone the turn's repository at its ref. Its message is safe to
    pass on: the broker says only that the repository or ref was not found or is unreachable,
    or took too long (git's own stderr, which can quote what it read, stays in its log)."""

    def __init__(self, repo_url: str, ref: str | None, said: str) -> None:
        at = f" at {ref!r}" if ref else ""
        super().__init__(
            f"the session's sandbox could not be made with repository {repo_url!r}{at}: "
            f"{said[:300]}. Check the URL and the ref (a tag, branch or commit the repository "
            "has; a private repository is not reachable from the sandbox), then send the turn "
            "again",
            code=REPO_UNAVAILABLE,
        )


async def _retire(nc: Any, tenant: str, sandbox: str) -> None:
    """Delete the session's former sandbox (its turn named another repository or ref); a
    failure is logged, never the turn's (the sandbox then runs on until deleted by hand)."""
    gone = sb.DeleteSandbox(
        request_id=new_id(), tenant=tenant, sandbox=sandbox,
        reason="the session's turn names another repository or ref",
    )  # fmt: skip
    try:
        await rpc.call_verb(nc, bus.DELETE_SANDBOX, gone, timeout=30, target=sandbox)
    except Exception as exc:  # the new sandbox is attached: nothing here may fail the turn
        log.warning("the session's former sandbox was not deleted",
                    extra={"sandbox": sandbox, "error": str(exc)})  # fmt: skip


async def _fold_and_repo(
    store: EventStore, tenant: str, session: str, turn: str
) -> tuple[SessionState, tuple[str | None, str | None] | None]:
    """The session's fold and the repository this turn's request names (None: it names none),
    in one pass over the session's `.log` (the fold leaves run steps alone: `load_turn`)."""
    state = FOLD.initial()
    wanted: tuple[str | None, str | None] | None = None
    async for stored in store.replay(log_subject(tenant, session)):
        state = FOLD.evolve(state, stored)
        data = stored.envelope.data
        if isinstance(data, TurnRequested) and stored.envelope.turn == turn and data.repo_url:
            wanted = wanted or (data.repo_url, data.repo_ref)
    return state, wanted


async def attach(
    mesh: EngineMesh,
    tenant: str,
    session: str,
    turn: str,
    info: sb.SandboxInfo,
    replaces: str,
    reason: str = "resumed",
) -> None:
    """Record `info` as the session's sandbox (`SandboxAttached`) on the session's log, through
    the decider kernel (`EngineMesh.facts`): appended against the head it folded, folded again
    and appended again when another writer got there first."""
    attached = SandboxAttached(
        interpreter=InterpreterState(
            sandbox=info.sandbox, repo_url=info.repo_url, ref=info.ref,
            context_paths=tuple(info.context_paths), volume=info.volume,
            volume_subpath=info.volume_subpath,
        ),
        replaces=replaces,
        reason=reason,
    )  # fmt: skip
    event_id = new_id()  # one id for every try: a lost ack is read back, never stored twice

    def wrap(_: None, event: Event) -> Envelope[Event]:
        return Envelope(
            id=event_id, tenant=tenant, session=session, turn=turn, actor=mesh.actor,
            ts=utc_now(), data=event, correlation=turn,
        )  # fmt: skip

    await mesh.facts.submit(
        log_subject(tenant, session), decide=lambda _: Decision(events=(attached,)), wrap=wrap,
        request_id=event_id,
    )  # fmt: skip


__all__ = ["RepoUnavailable", "attach", "session_sandbox"]
