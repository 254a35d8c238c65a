"""The RLM as a turn runner (`FLEET_AGENT_RUNNER=rlm`): a turn's message becomes the root run
of a budget tree, on the session's sandbox.

Per turn: open the tree (`budget.open`, under a request id fixed by the turn, so a retry or a
second attempt gets the first answer), find the session's sandbox (the fold's interpreter
state: resumed, or replaced on the same volume, or created) and record `SandboxAttached` when
it changed, run the root, close the tree whatever happened.

`restartable` is True because a later attempt resumes (issue 16): the root run's id and the
tree's are derived from the turn (`model.root_run_id`, `model.tree_id`), so attempt N lands on
the run subject attempt 1 wrote, and `run_rlm` continues from its record (`engine.resume`):
recorded model responses and cells are reused, only the step in flight runs again. Where the
record cannot be continued (the session's sandbox was replaced: its REPL state is gone) the
run ends `run.failed` (`sandbox_lost`) and the turn `TurnFailed(retryable=True,
code="sandbox_lost")`. A run ended by a model call's failure ends the turn with that call's
kind (`llm_rate_limited`, `llm_auth_failed`, ...: `fleet_agent.llm_failures`), its flag and
its message, which name the profile and model and say what to do.
"""

import asyncio
import dataclasses
import logging
import time
from collections.abc import Callable
from typing import Any

from fleet_agent.engine.child_worker import ChildRunWorker
from fleet_agent.engine.mesh import MeshPool
from fleet_agent.engine.model import (
    EngineMesh,
    RlmTask,
    RunContext,
    derived_id,
    root_run_id,
    tree_id,
)
from fleet_agent.engine.rlm import SANDBOX_LOST, run_rlm
from fleet_agent.engine.settings import EngineSettings
from fleet_agent.lenient import LenientCodec
from fleet_agent.runners import Answered, CancelToken, Failed, StatedFailure, Stopped, TurnInput
from fleet_events import Envelope, bus, new_id, streams, utc_now
from fleet_events import sandbox as sb
from fleet_events.budget import CloseTree, OpenTree
from fleet_events.session import InterpreterState, SandboxAttached, TurnRequested, log_subject
from fleet_events.session_fold import FOLD, SessionState
from fleet_mesh import rpc
from fleet_mesh.blobs import JetStreamBlobs
from fleet_mesh.secrets import SecretError, private_key_from_env
from fleet_mesh.service import ServiceContext
from fleet_mesh.store import AppendConflict, EventStore
from fleet_mesh.work import WorkConsumer

log = logging.getLogger("fleet.agent.engine")


class RlmRunFailed(RuntimeError):
    """The root run ended in `run.failed`; the worker records `TurnFailed` (its text stays in
    this replica's log, the run's record has the error) with `code`."""

    def __init__(self, message: str, code: str = "runner_error") -> None:
        super().__init__(message)
        self.failure_code = code


class RlmTurnRunner:
    restartable = True

    def __init__(self, pool: MeshPool, task: RlmTask, *, deadline_s: float = 3600.0) -> None:
        self.ping_details: Callable[[], dict[str, Any]] = dict
        """What this runner adds to the replica's ping (its child-run slots)."""
        self._pool = pool
        self._task = task
        self._deadline_s = deadline_s

    async def run(self, turn: TurnInput, token: CancelToken) -> Answered | Stopped | Failed:
        mesh = await self._pool.get(turn.tenant)
        tree = tree_id(turn.tenant, turn.session, turn.turn)
        run = root_run_id(turn.tenant, turn.session, turn.turn)
        task = dataclasses.replace(self._task, inputs={"task": turn.message})
        await _call(mesh, bus.OPEN_TREE, OpenTree(
            request_id=derived_id("open", tree), tenant=turn.tenant, tree=tree,
            max_llm_calls=task.max_llm_calls, max_depth=task.max_depth,
            max_steps_per_run=task.max_iters + 1, session=turn.session, turn=turn.turn,
            root_run=run,
        ))  # fmt: skip
        fenced = False
        try:
            sandbox = await self._sandbox(mesh, turn)
            ctx = RunContext(
                tenant=turn.tenant, session=turn.session, turn=turn.turn, run=run, tree=tree,
                sandbox=sandbox, mesh=mesh, deadline=time.time() + self._deadline_s,
                attempt=turn.attempt, on_fork=self._forked(mesh, turn),
            )  # fmt: skip
            mirror = asyncio.ensure_future(_mirror_cancel(token, ctx))
            try:
                result = await run_rlm(task, ctx)
                fenced = result.fenced
            finally:
                mirror.cancel()
        finally:
            if not fenced:  # a fenced attempt's tree is the new holder's: it stays open
                await _call(mesh, bus.CLOSE_TREE, CloseTree(
                    request_id=derived_id("close", tree), tree=tree, reason="turn ended",
                ))  # fmt: skip
        if result.status == "completed":
            return Answered(result.answer, root_head_hash=result.head_hash)
        if result.status == "cancelled":
            return Stopped(result.answer)
        if result.code:  # a model call's failure: safe to state (no provider text in it)
            return Failed(result.error, code=result.code, retryable=result.retryable)
        lost = result.error == SANDBOX_LOST
        raise RlmRunFailed(result.error, code="sandbox_lost" if lost else "runner_error")

    async def _sandbox(self, mesh: EngineMesh, turn: TurnInput) -> str:
        """The session's sandbox; for a later attempt, "" when it is gone (the run then ends
        `sandbox_lost`: the REPL state its record was made in is not there any more)."""
        try:
            return await session_sandbox(mesh, turn.tenant, turn.session, turn.turn)
        except rpc.RemoteError:
            if turn.attempt == 1:
                raise
            log.warning("resume: the session's sandbox is gone", extra={"turn": turn.turn})
            return ""

    def _forked(self, mesh: EngineMesh, turn: TurnInput) -> Callable[[str, Any], Any]:
        async def forked(old: str, info: sb.SandboxInfo) -> None:
            """A resumed root runs on in a fork of the session's sandbox: the fork is the
            session's sandbox from now on. The old one is not deleted: the local provider
            kills a sandbox's whole process group, and its forks are in it (docs/turns.md,
            "Not done yet")."""
            await mesh.on_bus(_attach(mesh, turn.tenant, turn.session, turn.turn, info, old))

        return forked


async def child_run_consumer(
    ctx: ServiceContext, pool: MeshPool, settings: EngineSettings
) -> WorkConsumer:
    """The child-run work consumer, started: every runner whose RLM code may call `sub_rlm`
    needs one (the engine's and the chat agent's), else a child run is never taken."""
    children = ChildRunWorker(pool, ctx.log)
    consumer = WorkConsumer(
        ctx.js, settings.child_consumer(), children.handle, slots=settings.child_slots, log=ctx.log
    )
    children.consumer = consumer
    await consumer.start()
    return consumer


async def engine_runner(
    ctx: ServiceContext, settings: EngineSettings | None = None
) -> RlmTurnRunner:
    """The runner `FLEET_AGENT_RUNNER=rlm` selects, on its own connections (module docstring of
    `engine.mesh`); it needs the services' private key to open model keys."""
    key = private_key_from_env()
    if key is None:
        raise SecretError(
            "FLEET_AGENT_RUNNER=rlm needs the services' private key: "
            "set FLEET_SECRETS_KEY to its file"
        )
    settings = settings or EngineSettings()
    url = ctx.nc.connected_url.geturl() if ctx.nc.connected_url else ""
    pool = MeshPool(url, ctx.actor, key)
    consumer = await child_run_consumer(ctx, pool, settings)

    async def stop() -> None:
        await consumer.stop()
        await asyncio.to_thread(pool.close)

    ctx.on_stop.append(stop)

    def details() -> dict[str, Any]:
        return {
            "child_slots": consumer.slots,
            "children_running": consumer.stats.running,
            "children_peak": consumer.stats.peak,
            "children_busy_peak": consumer.stats.busy_peak,
            "children_handled": consumer.stats.handled,
            "child_slots_lent": consumer.stats.lent,
        }

    runner = RlmTurnRunner(pool, settings.task(), deadline_s=settings.tree_deadline_s)
    runner.ping_details = details
    return runner


async def _mirror_cancel(token: CancelToken, ctx: RunContext) -> None:
    await token.wait()
    ctx.cancel.set(token.reason or "cancelled")


async def _call(mesh: EngineMesh, verb: Any, request: Any, timeout: float = 15.0) -> Any:
    """A verb call on the bus's loop (its connection), awaited from the caller's loop."""
    future = mesh.bus.submit(rpc.call_verb(mesh.bus.nc, verb, request, timeout=timeout))
    return await asyncio.wrap_future(future)


# -- the session's sandbox ---------------------------------------------------------------------


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
        info = await rpc.call_verb(
            nc, bus.RESUME_SANDBOX,
            sb.ResumeSandbox(request_id=new_id(), tenant=tenant, sandbox=known.sandbox),
            timeout=60,
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
            info = await rpc.call_verb(nc, bus.CREATE_SANDBOX, create, timeout=120)
        except rpc.RemoteError as exc:
            if repo_url is None:
                raise
            raise RepoUnavailable(repo_url, ref, exc.message) from exc
        reason = "repo" if known is not None and known.sandbox else "created"
    replaces = known.sandbox or "" if known else ""
    await _attach(mesh, tenant, session, turn, info, replaces, reason)
    if reason == "repo":  # the old checkout is no longer the session's: not left running
        await _retire(nc, tenant, replaces)
    return info.sandbox


class RepoUnavailable(StatedFailure):
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
            code="repo_unavailable",
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


async def _attach(
    mesh: EngineMesh,
    tenant: str,
    session: str,
    turn: str,
    info: sb.SandboxInfo,
    replaces: str,
    reason: str = "resumed",
) -> None:
    """Record `info` as the session's sandbox (`SandboxAttached`) on the session's log."""
    attached = SandboxAttached(
        interpreter=InterpreterState(
            sandbox=info.sandbox, workspace=info.workspace, repo_url=info.repo_url, ref=info.ref,
            context_paths=tuple(info.context_paths), volume=info.volume,
            volume_subpath=info.volume_subpath,
        ),
        replaces=replaces,
        reason=reason,
    )  # fmt: skip
    subject = log_subject(tenant, session)
    for _ in range(16):
        envelope = Envelope(
            id=new_id(), tenant=tenant, session=session, turn=turn, actor=mesh.actor,
            ts=utc_now(), data=attached, correlation=turn,
        )  # fmt: skip
        try:
            await mesh.store.append(subject, envelope, expect=await mesh.store.head(subject))
            break
        except AppendConflict:
            continue
