"""The broker's life across restarts: reap what must not outlive its task, revive the rest.

A broker's sandboxes die with it (each runner exits when its socket closes). When a broker
starts again under the same replica name it replays the SANDBOXES stream and, for the
sandboxes the log says it held: children and sandboxes of finished runs are reaped
(`sandbox.deleted`); session sandboxes run again in place, same id and workspace, with
`sandbox.replaced` (REPL memory lost, files kept).
"""

import asyncio
from pathlib import Path
from typing import TYPE_CHECKING

from fleet_events import run as run_events
from fleet_events import sandbox as sb
from fleet_events import session as session_events
from fleet_sandbox_broker import domain

if TYPE_CHECKING:
    from fleet_sandbox_broker.broker import Broker


async def reconcile_until_done(broker: "Broker") -> None:
    """Reconcile in the background: a slow or briefly unavailable store must not keep the
    broker from answering; failures are retried with backoff."""
    for attempt in range(8):
        try:
            await reconcile(broker)
            return
        except Exception:
            broker.ctx.log.exception("reconcile failed", extra={"attempt": attempt})
            await asyncio.sleep(min(30.0, 0.5 * 2**attempt))


async def reconcile(broker: "Broker") -> None:
    """After a restart: reap this replica's children, run its session sandboxes again."""
    views = await broker.views("fleet.sandbox.>")
    mine = [v for v in views.values() if v.replica == broker.ctx.replica
            and v.status != "deleted"]  # fmt: skip
    for view in sorted(mine, key=lambda v: v.parent is None):
        if domain.to_reap(view, await run_finished(broker, view)):
            await broker.provider.discard(view.sandbox)
            await broker.append(view.tenant, view.sandbox, sb.SandboxDeleted(
                sandbox=view.sandbox, reason="reaped: its broker restarted, and a child "
                "never outlives its task",
            ), view.labels)  # fmt: skip
            continue
        try:
            await revive(broker, view)
        except Exception:
            broker.ctx.log.exception("could not revive a sandbox", extra={"sandbox": view.sandbox})


async def run_finished(broker: "Broker", view: domain.SandboxView) -> bool:
    """Whether the run named in the sandbox's labels has ended, by its run subject."""
    session, run = view.labels.get("session"), view.labels.get("run")
    if not session or not run or broker.sessions is None:
        return False
    try:
        last = await broker.sessions.last(session_events.run_subject(view.tenant, session, run))
    except Exception:  # an unreadable or foreign run: keep the sandbox, never guess
        broker.ctx.log.exception("cannot read a run", extra={"run": run})
        return False
    return last is not None and isinstance(
        last.envelope.data, run_events.RunCompleted | run_events.RunFailed
    )


async def revive(broker: "Broker", view: domain.SandboxView) -> None:
    mounts: dict[str, Path] = {}
    if view.spec.volume is not None:
        mounts["volume"] = await asyncio.to_thread(
            broker.volumes.prepare, view.tenant, view.spec.volume, view.spec.volume_subpath
        )
    box = await broker.provider.create(view.sandbox, view.limits, mounts=mounts, revive=True)
    if view.spec.volume is not None and box.uid is not None:
        await asyncio.to_thread(
            broker.volumes.ensure, view.tenant, view.spec.volume, view.spec.volume_subpath,
            box.uid,
        )  # fmt: skip
    held = await broker.adopt(view.tenant, box, dict(view.labels), None, view.spec)
    await broker.append(view.tenant, view.sandbox, sb.SandboxReplaced(
        sandbox=view.sandbox, replaced=view.sandbox,
        reason="its broker restarted: the sandbox runs again on the same workspace; REPL "
        "memory was lost, files were kept",
    ), held.labels)  # fmt: skip
