"""The sandbox verbs: create, fork, children under the isolation policy, info, delete, list and
resume. Each is a short orchestration over the broker core; the decisions are in `domain.py`."""

import asyncio
from collections.abc import Awaitable, Callable

from nats.errors import NoRespondersError
from nats.errors import TimeoutError as NatsTimeout

from fleet_events import bus
from fleet_events import sandbox as sb
from fleet_events.envelope import new_id, utc_now
from fleet_mesh import rpc
from fleet_sandbox_broker import domain, lifecycle, snapshot
from fleet_sandbox_broker.broker import Broker, Held
from fleet_sandbox_broker.errors import (
    BadSpec,
    ForkFailed,
    ProviderNotConfigured,
    SandboxNotFound,
    SandboxStopped,
    Unavailable,
)
from fleet_sandbox_broker.volumes import check_subpath, child_subpath


class Sandboxes:
    def __init__(self, broker: Broker) -> None:
        self.b = broker

    async def create(self, req: sb.CreateSandbox) -> sb.SandboxInfo:
        check_subpath(req.volume_subpath)  # a child's `.children/<id>` is the broker's to give
        if req.limits is not None:
            problem = domain.limits_problem(req.limits, self.b.settings.limit_bounds)
            if problem is not None:
                raise BadSpec(problem)
        spec = domain.Spec(
            req.volume, req.volume_subpath, req.repo_url, req.ref, tuple(req.context_paths),
            req.local_checkout,
        )  # fmt: skip
        files = {path: await self.b.blobs.get(req.tenant, ref.sha256)
                 for path, ref in req.context_files.items()}  # fmt: skip
        try:
            provider = await self.b.provider_for(req.tenant)
        except ProviderNotConfigured as refused:
            await self.b.refuse_create(req.tenant, dict(req.labels), refused)
            raise
        held = await self.b.start_box(
            req.tenant, dict(req.labels), req.limits, spec, fork_ready=req.fork_ready,
            files=files, provider=provider,
        )  # fmt: skip
        return self.b.info(held)

    async def fork(self, req: sb.ForkSandbox) -> sb.SandboxInfo:
        parent = self.b.get_held(req.tenant, req.sandbox)
        return self.b.info(await self.b.fork_box(parent, {**parent.labels, **req.labels}))

    async def build_child(self, req: sb.BuildChild) -> sb.ChildSandbox:
        """The isolation policy, one code path for every child (docs/sandboxes.md)."""
        parent = self.b.get_held(req.tenant, req.sandbox)
        mode = await self.b.config.get("rlm_child_isolation_mode", tenant=req.tenant)
        fallback = await self.b.config.get("rlm_child_fork_fallback", tenant=req.tenant)
        policy = domain.ChildPolicy(mode=mode, fallback=fallback)  # type: ignore[arg-type]
        facts = domain.ParentFacts(
            has_volume=parent.spec.volume is not None,
            provider_can_fork=self.b.provider_of(parent).capabilities.fork,
        )
        plan = domain.decide_child(policy, facts)
        labels = {**parent.labels, "role": "child", "parent": parent.box.id, **req.labels}
        child: Held | None = None
        context = req.context
        if plan.branch == "fork":
            try:
                child = await self.b.fork_box(parent, labels)
            except (ForkFailed, SandboxStopped) as exc:
                plan = domain.after_fork_failure(policy, exc.message)
        if plan.branch in ("clean_volume", "clean_fallback"):
            child, context = await self._clean_child(parent, labels), new_id()
        elif plan.branch == "context":
            context = new_id()
        target = child or parent
        decided = domain.child_decided(parent.box.id, target.box.id, policy, plan, context)
        await self.b.append(req.tenant, parent.box.id, decided, parent.labels)
        if plan.branch == "refused":
            raise ForkFailed(f"no sandbox for the child: {plan.reason}")
        return sb.ChildSandbox(
            sandbox=target.box.id, context=context, branch=plan.branch, reason=plan.reason,
            workspace=str(target.box.workspace), context_paths=list(target.spec.context_paths),
            volume_subpath=target.spec.volume_subpath,
        )  # fmt: skip

    async def _clean_child(self, parent: Held, labels: dict[str, str]) -> Held:
        spec, child_id = parent.spec, new_id()
        paths = list(spec.context_paths)
        files: dict[str, bytes] = {}
        if spec.local_checkout and spec.repo_url is None:
            text = await asyncio.to_thread(
                snapshot.build, parent.box.workspace, paths,
                max_bytes=self.b.settings.snapshot_max_bytes,
                file_bytes=self.b.settings.snapshot_file_bytes,
            )  # fmt: skip
            files[snapshot.SNAPSHOT_PATH] = text.encode()
            paths.append(snapshot.SNAPSHOT_PATH)
        child_spec = domain.Spec(
            volume=spec.volume,
            volume_subpath=child_subpath(child_id) if spec.volume else None,
            repo_url=spec.repo_url, ref=spec.ref, context_paths=tuple(paths),
        )  # fmt: skip
        # default limits and nothing special: the warm pool can serve the child
        defaults = self.b.settings.default_limits()
        limits = None if parent.box.limits == defaults else parent.box.limits
        held = await self.b.start_box(
            parent.tenant, labels, limits, child_spec, files=files,
            sandbox=child_id if spec.volume else None, parent=parent.box.id,
            provider=self.b.provider_of(parent),  # a child runs where its parent does
        )  # fmt: skip
        parent.children.add(held.box.id)
        return held

    async def get(self, req: sb.GetSandbox) -> sb.SandboxInfo:
        return self.b.info(self.b.get_held(req.tenant, req.sandbox))

    async def delete(self, req: sb.DeleteSandbox) -> sb.Ack:
        await self.b.remove(self.b.get_held(req.tenant, req.sandbox), req.reason)
        return sb.Ack()

    async def list(self, req: sb.ListSandboxes) -> sb.SandboxList:
        await self.b.view.caught_up()
        views = [v for v in self.b.view.of(req.tenant).values()
                 if req.session is None or v.labels.get("session") == req.session]  # fmt: skip
        chosen, cursor = domain.page(views, req.cursor, req.limit, self.b.settings.list_page_max)
        return sb.SandboxList(items=[_listed(v) for v in chosen], next_cursor=cursor)

    async def resume(self, req: sb.ResumeSandbox) -> sb.SandboxInfo:
        """The session's sandbox if some replica holds it running. A stopped one is deleted by
        its holder and replaced; one no broker holds is revived on its own files where this
        replica can reach them (`resume` keeps the workspace), else replaced on the same volume
        and subpath (REPL memory lost, files on the volume kept)."""
        await self.b.view.caught_up()
        view = self.b.view.get(req.tenant, req.sandbox)
        # before anything is claimed: a provider this broker lacks must not leave the old
        # sandbox recorded deleted with no replacement
        provider = await self.b.provider_for(req.tenant)
        nc, ask = (
            self.b.ctx.nc,
            sb.GetSandbox(request_id=new_id(), tenant=req.tenant, sandbox=req.sandbox),
        )
        try:
            info = await rpc.call_verb(nc, bus.GET_SANDBOX, ask, target=req.sandbox, timeout=5)
        except NoRespondersError:
            info = None
        except (TimeoutError, NatsTimeout) as exc:
            raise Unavailable(f"the broker holding {req.sandbox!r} did not answer; retry") from exc
        except rpc.RemoteError as exc:
            raise SandboxNotFound(exc.message) from exc
        if info is not None and info.status == "running":
            return info
        if view is None:
            raise SandboxNotFound(f"no live sandbox {req.sandbox!r} for tenant {req.tenant!r}")
        if info is not None:
            reason = f"its sandbox {req.sandbox} was stopped: {info.stopped_reason}"
            remove = sb.DeleteSandbox(
                request_id=new_id(), tenant=req.tenant, sandbox=req.sandbox,
                reason=f"replaced: {reason}",
            )  # fmt: skip
            await rpc.call_verb(nc, bus.DELETE_SANDBOX, remove, target=req.sandbox, timeout=30)
        else:
            reason = f"its sandbox {req.sandbox} is gone (no broker holds it)"
            if lifecycle.reachable(self.b, view):
                revived = await lifecycle.settle(self.b, view, reason)
                if revived is not None:
                    return self.b.info(revived)
            elif not await self.b.claim(view, domain.deleted(req.sandbox, f"replaced: {reason}")):
                raise Unavailable(f"sandbox {req.sandbox!r} is being resumed elsewhere; retry")
        held = await self.b.start_box(
            req.tenant, dict(view.labels), view.limits, view.spec,
            first=lambda box: domain.replacement(box.id, req.sandbox, self.b.ctx.replica, reason),
            provider=provider,
        )  # fmt: skip
        return self.b.info(held)

    async def test_daytona(self, req: sb.TestDaytona) -> sb.DaytonaProbe:
        """The Daytona provider's probe, or "not configured" when this broker has none."""
        probe: Callable[[float], Awaitable[sb.DaytonaProbe]] | None = getattr(
            self.b.providers.get("daytona"), "probe", None
        )
        if probe is not None:
            return await probe(req.timeout_s)
        return sb.DaytonaProbe(
            ok=False, preflight_ok=False, configured=False, checked_at=utc_now(),
            checks=[sb.ProbeCheck(name="configured", ok=False, detail="not configured")],
            guidance=[
                "Daytona is not configured on this sandbox broker: set DAYTONA_API_KEY, "
                "DAYTONA_API_URL and DAYTONA_TARGET and restart it, then set a tenant's "
                "sandbox_provider to daytona"
            ],
            error="not configured", replica=self.b.ctx.replica,
        )  # fmt: skip


def _listed(v: domain.SandboxView) -> sb.SandboxInfo:
    return sb.SandboxInfo(
        sandbox=v.sandbox, tenant=v.tenant, provider=v.provider, replica=v.replica,
        status=v.status, workspace=v.workspace, parent=v.parent, labels=v.labels,
        contexts=list(v.contexts), stopped_reason=v.stopped_reason, volume=v.spec.volume,
        volume_subpath=v.spec.volume_subpath, repo_url=v.spec.repo_url, ref=v.spec.ref,
        context_paths=list(v.spec.context_paths),
    )  # fmt: skip
