"""A broker's life across restarts: reap what must not outlive its task, revive the rest, and
leave nothing of a dead replica behind.

A broker's sandboxes die with it (each runner exits when its socket closes); their workspaces
stay on disk. At start, once its view of the SANDBOXES stream has caught up, a broker settles:
- the sandboxes the log says it holds (its replica name survives restarts: `fleet up` keeps it
  in the data dir), and
- those of another replica name whose workspace is on this broker's disk and whose holder is
  gone (no responders on the sandbox's own subject): a replica that was renamed, scaled away
  or never came back.
Settling is: children and sandboxes of finished runs are reaped (`sandbox.deleted`, files
removed); session sandboxes run again in place, same id and workspace, with `sandbox.replaced`
naming the replica that holds them now (REPL memory lost, files kept). Each is claimed with an
append that expects the subject's head as the view saw it, so of two brokers settling the same
sandbox exactly one acts. Without this a dead replica's workspaces stayed on disk under their
old uids, and the uid pool handed those uids to other tenants' new sandboxes (issue 8).
"""

from pathlib import Path

import stamina
from nats.errors import NoRespondersError
from nats.errors import TimeoutError as NatsTimeout

from fleet_events import bus
from fleet_events import run as run_events
from fleet_events import sandbox as sb
from fleet_events import session as session_events
from fleet_events.envelope import new_id
from fleet_mesh import rpc
from fleet_sandbox_broker import domain
from fleet_sandbox_broker.broker import Broker, Held

RETRY_WAIT_S = (0.5, 30.0)  # first and longest wait between reconcile attempts


async def reconcile_until_done(broker: Broker) -> None:
    """Reconcile in the background (a slow or briefly unavailable store must not keep the
    broker from answering), retrying with backoff for as long as the broker runs: giving up
    would leave a dead replica's workspaces on disk for good."""
    async for attempt in stamina.retry_context(
        on=Exception, attempts=None, timeout=None, wait_initial=RETRY_WAIT_S[0],
        wait_max=RETRY_WAIT_S[1],
    ):  # fmt: skip
        with attempt:
            try:
                await reconcile(broker)
            except Exception:
                broker.ctx.log.exception(
                    "reconcile failed; retrying", extra={"attempt": attempt.num}
                )
                raise


async def reconcile(broker: Broker) -> None:
    await broker.view.caught_up(timeout=30.0)
    me = broker.ctx.replica
    views = [v for v in broker.view.everyone() if v.sandbox not in broker.held]
    mine = [v for v in views if v.replica == me]
    for view in sorted(mine, key=lambda v: v.parent is None):  # children before parents
        await settle(broker, view, "its broker restarted")
    for view in views:
        mine_on_disk = domain.orphaned(view, me, lambda workspace: _on_my_disk(broker, workspace))
        if mine_on_disk and await _holder_gone(broker, view):
            await settle(broker, view, f"its replica {view.replica} is gone")


def reachable(broker: Broker, view: domain.SandboxView) -> bool:
    """Whether this replica can act on the sandbox's files (`resume`): the same host and root
    for a sandbox on this host, or, for one on a remote provider (Daytona), that provider. (At
    start a broker takes over only what is on its disk: a dead replica's Daytona sandboxes wait
    for their session's `resume`.)"""
    provider = broker.providers.get(view.provider)
    if provider is not None and getattr(provider, "remote", False):
        return True
    return _on_my_disk(broker, view.workspace)


def _on_my_disk(broker: Broker, workspace: str) -> bool:
    directory = Path(workspace).parent
    # a link: its files are in its fork family's filesystem on this disk (`providers.disks`),
    # mounted again by the revive if the provider that mounted it has stopped
    on_disk = directory.is_dir() or directory.is_symlink()
    return directory.parent.resolve() == broker.settings.root.resolve() and on_disk


async def _holder_gone(broker: Broker, view: domain.SandboxView) -> bool:
    ask = sb.GetSandbox(request_id=new_id(), tenant=view.tenant, sandbox=view.sandbox)
    try:
        await rpc.call_verb(broker.ctx.nc, bus.GET_SANDBOX, ask, target=view.sandbox, timeout=5)
    except NoRespondersError:
        return True
    except (TimeoutError, NatsTimeout, rpc.RemoteError):
        return False  # someone may hold it: never guess
    return False


async def settle(broker: Broker, view: domain.SandboxView, why: str) -> Held | None:
    """Reap or revive one sandbox no broker holds: the revived sandbox, or None if it was
    reaped or another broker claimed it first."""
    if view.provider and view.provider not in broker.providers:
        # run by a provider this broker was not configured for (Daytona's keys removed, say):
        # acting on it with another provider would start or remove the wrong thing
        broker.ctx.log.warning(
            "a sandbox of a provider this broker lacks is left as it is",
            extra={"sandbox": view.sandbox, "provider": view.provider},
        )
        return None
    provider = broker.provider_of(view)
    if domain.to_reap(view, await run_finished(broker, view)):
        if await broker.claim(view, domain.reaped(view.sandbox, why)):
            await provider.discard(view.sandbox)
        return None
    if not await broker.claim(view, domain.revived(view.sandbox, broker.ctx.replica, why)):
        return None
    try:
        return await broker.start_box(
            view.tenant, dict(view.labels), view.limits, view.spec, sandbox=view.sandbox,
            revive=True, provider=provider,
        )  # fmt: skip
    except Exception as exc:
        broker.ctx.log.exception("could not revive a sandbox", extra={"sandbox": view.sandbox})
        failed = domain.stopped(view.sandbox, "exited", f"could not be revived: {exc}")
        assert failed is not None
        await broker.append(view.tenant, view.sandbox, failed, view.labels)
        return None


async def run_finished(broker: Broker, view: domain.SandboxView) -> bool:
    """Whether the run named in the sandbox's labels has ended (`run.TERMINAL`: completed,
    failed or cancelled), by its run subject."""
    session, run = view.labels.get("session"), view.labels.get("run")
    if not session or not run or broker.sessions is None:
        return False
    try:
        last = await broker.sessions.last(session_events.run_subject(view.tenant, session, run))
    except Exception:  # an unreadable or foreign run: keep the sandbox, never guess
        broker.ctx.log.exception("cannot read a run", extra={"run": run})
        return False
    # every end counts: a cancelled run's sandbox is as finished as a completed one's
    return last is not None and isinstance(last.envelope.data, run_events.TERMINAL)
