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
code="sandbox_lost")`. A run ended by a failure it can state (a model call's kind such as
`llm_rate_limited`, the budget's refusal, the repository) ends the turn with that code, flag
and message (`fleet_agent.run.failures`).

The turn's scope (the tree, the root run's context, the cancel) and how the root run's outcome
ends the turn are the run kernel's (`fleet_agent.run`), shared with the chat runner.
"""

import asyncio
import dataclasses
import logging
from collections.abc import Callable
from typing import Any

from fleet_agent.engine.child_worker import ChildRunWorker
from fleet_agent.engine.mesh import MeshPool
from fleet_agent.engine.model import EngineMesh, RlmResult, RlmTask
from fleet_agent.engine.rlm import run_rlm
from fleet_agent.engine.sandboxes import attach, session_sandbox
from fleet_agent.engine.settings import EngineSettings
from fleet_agent.run.lifecycle import turn_end
from fleet_agent.run.scope import TreeLimits, turn_scope
from fleet_agent.runners import Answered, CancelToken, Failed, Stopped, TurnInput
from fleet_events import sandbox as sb
from fleet_mesh import rpc
from fleet_mesh.secrets import SecretError, private_key_from_env
from fleet_mesh.service import ServiceContext
from fleet_mesh.work import WorkConsumer

log = logging.getLogger("fleet.agent.engine")


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
        task = dataclasses.replace(self._task, inputs={"task": turn.message})
        limits = TreeLimits.of(task, max_steps_per_run=task.max_iters + 1)
        result: RlmResult
        async with turn_scope(
            mesh, turn, token, limits, sandbox=lambda: self._sandbox(mesh, turn),
            deadline_s=self._deadline_s, on_fork=self._forked(mesh, turn),
        ) as scope:  # fmt: skip
            result = await run_rlm(task, scope.ctx)
            scope.fenced = result.fenced
        return turn_end(result.outcome(), result.head_hash)

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
            await mesh.on_bus(attach(mesh, turn.tenant, turn.session, turn.turn, info, old))

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


__all__ = ["RlmTurnRunner", "child_run_consumer", "engine_runner", "session_sandbox"]
