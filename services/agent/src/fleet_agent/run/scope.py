"""A turn's scope, the same for every runner: open the turn's budget tree, build the root
run's context, mirror the turn's cancel into it, and close the tree at the end unless the
run was fenced (a newer holder owns the tree now) or parked (the resumed attempt goes on in it).

The tree's and the root run's ids are derived from the turn (`engine.model.tree_id`,
`root_run_id`), and the open and close requests' ids from the tree, so a retry or a later
attempt of the turn gets the first answer and lands on the record the first attempt wrote.
"""

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, replace
from typing import Any

from nats.js import JetStreamContext

from fleet_agent.engine.model import (
    EngineMesh,
    RlmTask,
    RunContext,
    derived_id,
    root_run_id,
    tree_id,
)
from fleet_agent.runners import CancelToken, TurnInput
from fleet_events import bus
from fleet_events.budget import CloseTree, OpenTree
from fleet_mesh import rpc
from fleet_mesh.runtime_config import RuntimeConfig

VERB_TIMEOUT_S = 15.0


@dataclass(frozen=True)
class TreeLimits:
    """What the turn's tree opens with: the tree's sub-call cap, its depth, each run's steps,
    every call of the tree, and its child runs. The runner's values are defaults: the
    tenant's settings (`tenant_limits`) win where they are stored."""

    max_llm_calls: int
    max_depth: int
    max_steps_per_run: int
    max_tree_calls: int | None = None
    max_child_runs: int | None = None

    @classmethod
    def of(cls, task: RlmTask, max_steps_per_run: int) -> "TreeLimits":
        return cls(
            max_llm_calls=task.max_llm_calls, max_depth=task.max_depth,
            max_steps_per_run=max_steps_per_run, max_tree_calls=task.max_tree_calls,
            max_child_runs=task.max_child_runs,
        )  # fmt: skip


SETTING_OF_LIMIT = {
    "max_llm_calls": "rlm_max_llm_calls",
    "max_depth": "rlm_max_depth",
    "max_tree_calls": "rlm_max_tree_calls",
    "max_child_runs": "rlm_max_child_runs",
}
"""The tenant settings a tree's limits are read from (tenant value, else global)."""


async def tenant_limits(js: JetStreamContext, tenant: str, limits: TreeLimits) -> TreeLimits:
    """`limits` with every one the tenant's (or the global) settings store replaced: the
    settings an admin sets are the ones a tree opens with, the agent's environment only
    seeds what no one set."""
    config = await RuntimeConfig.open(js)
    stored = {}
    for field_name, key in SETTING_OF_LIMIT.items():
        value = await config.stored_int(key, tenant=tenant)
        if value is not None:
            stored[field_name] = value
    return replace(limits, **stored) if stored else limits


@dataclass
class TurnScope:
    """The root run's context, and what the runner says about the tree at the end."""

    ctx: RunContext
    fenced: bool = False
    """Another holder appended to the run: the tree is that holder's, it stays open."""
    parked: bool = False
    """The turn gave its worker back on a question: the resumed attempt goes on in the tree."""


async def call_verb(mesh: EngineMesh, verb: Any, request: Any, timeout: float = 15.0) -> Any:
    """A verb call on the bus's loop (its connection), awaited from the caller's loop."""
    return await mesh.on_bus(rpc.call_verb(mesh.bus.nc, verb, request, timeout=timeout))


async def mirror_cancel(token: CancelToken, ctx: RunContext) -> None:
    """The turn's cancel (an asyncio token on the service's loop) as the run's flag, which
    dspy's threads see."""
    await token.wait()
    ctx.cancel.set(token.reason or "cancelled")


@asynccontextmanager
async def turn_scope(
    mesh: EngineMesh,
    turn: TurnInput,
    token: CancelToken,
    limits: TreeLimits,
    *,
    sandbox: Callable[[], Awaitable[str]] | None = None,
    deadline_s: float | None = None,
    on_fork: Callable[[str, Any], Awaitable[None]] | None = None,
) -> AsyncIterator[TurnScope]:
    """The turn's tree open and its root run's context built, for the body of the `async
    with`; `sandbox` finds the run's sandbox once the tree is open (None: the run finds its
    own when it needs one), `deadline_s` bounds the tree's runs from now."""
    tree = tree_id(turn.tenant, turn.session, turn.turn)
    run = root_run_id(turn.tenant, turn.session, turn.turn)
    limits = await mesh.on_bus(tenant_limits(mesh.bus.nc.jetstream(), turn.tenant, limits))
    await call_verb(mesh, bus.OPEN_TREE, OpenTree(
        request_id=derived_id("open", tree), tenant=turn.tenant, tree=tree,
        max_llm_calls=limits.max_llm_calls, max_depth=limits.max_depth,
        max_steps_per_run=limits.max_steps_per_run, session=turn.session, turn=turn.turn,
        root_run=run, max_tree_calls=limits.max_tree_calls,
        max_child_runs=limits.max_child_runs,
    ), timeout=VERB_TIMEOUT_S)  # fmt: skip
    scope: TurnScope | None = None
    try:
        found = await sandbox() if sandbox is not None else ""
        ctx = RunContext(
            tenant=turn.tenant, session=turn.session, turn=turn.turn, run=run, tree=tree,
            sandbox=found, mesh=mesh, attempt=turn.attempt, on_fork=on_fork,
            deadline=None if deadline_s is None else time.time() + deadline_s,
        )  # fmt: skip
        scope = TurnScope(ctx)
        mirror = asyncio.ensure_future(mirror_cancel(token, ctx))
        try:
            yield scope
        finally:
            mirror.cancel()
    finally:
        if scope is None or not (scope.fenced or scope.parked):
            close = CloseTree(request_id=derived_id("close", tree), tree=tree, reason="turn ended")
            await call_verb(mesh, bus.CLOSE_TREE, close, timeout=VERB_TIMEOUT_S)


__all__ = ["TreeLimits", "TurnScope", "call_verb", "mirror_cancel", "tenant_limits", "turn_scope"]
