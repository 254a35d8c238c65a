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
from dataclasses import dataclass
from typing import Any

from fleet_agent.engine.model import EngineMesh, RunContext, derived_id, root_run_id, tree_id
from fleet_agent.runners import CancelToken, TurnInput
from fleet_events import bus
from fleet_events.budget import CloseTree, OpenTree
from fleet_mesh import rpc

VERB_TIMEOUT_S = 15.0


@dataclass(frozen=True)
class TreeLimits:
    """What the turn's tree opens with: the tree's sub-call cap, its depth, each run's steps."""

    max_llm_calls: int
    max_depth: int
    max_steps_per_run: int


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
    await call_verb(mesh, bus.OPEN_TREE, OpenTree(
        request_id=derived_id("open", tree), tenant=turn.tenant, tree=tree,
        max_llm_calls=limits.max_llm_calls, max_depth=limits.max_depth,
        max_steps_per_run=limits.max_steps_per_run, session=turn.session, turn=turn.turn,
        root_run=run,
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


__all__ = ["TreeLimits", "TurnScope", "call_verb", "mirror_cancel", "turn_scope"]
