"""The broker's application service: what each request does to sandboxes, the log and files.

Pure decisions live in `domain.py`, restarts in `lifecycle.py`, and the bus plumbing (routing,
idempotence, error codes) in `subscribers.py`; this module orchestrates the provider, the
event store, the blob store and the config KV for one replica.
"""

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nats.errors import NoRespondersError
from nats.errors import TimeoutError as NatsTimeout

from fleet_events import bus
from fleet_events import sandbox as sb
from fleet_events.codec import BlobStore, sha256_hex
from fleet_events.envelope import Envelope, Event, new_id, utc_now
from fleet_events.ids import check_id
from fleet_mesh import rpc
from fleet_mesh.blobs import BlobNotFound
from fleet_mesh.runtime_config import RuntimeConfig
from fleet_mesh.service import ServiceContext
from fleet_mesh.store import AppendConflict, EventStore, Head
from fleet_sandbox_broker import domain, lifecycle, snapshot
from fleet_sandbox_broker.config import BrokerSettings
from fleet_sandbox_broker.errors import ForkFailed, SandboxNotFound, SandboxStopped, TooLarge
from fleet_sandbox_broker.pool import WarmPool
from fleet_sandbox_broker.providers.base import Provider, Sandbox
from fleet_sandbox_broker.volumes import Volumes, check_subpath, child_subpath


@dataclass
class Held:
    """A sandbox this replica holds."""

    tenant: str
    box: Sandbox
    labels: dict[str, str]
    parent: str | None = None
    spec: domain.Spec = field(default_factory=domain.Spec)
    interpreters: dict[str, str | None] = field(default_factory=dict)
    children: set[str] = field(default_factory=set)
    served: list[rpc.Served] = field(default_factory=list)  # its subjects (subscribers.py)


class Broker:
    def __init__(
        self,
        ctx: ServiceContext,
        provider: Provider,
        store: EventStore,
        blobs: BlobStore,
        settings: BrokerSettings,
        config: RuntimeConfig,
        sessions: EventStore | None = None,
    ) -> None:
        self.ctx = ctx
        self.provider = provider
        self.store = store
        self.blobs = blobs
        self.settings = settings
        self.config = config
        self.volumes = Volumes(settings.volumes)
        self.sessions: EventStore | None = sessions
        self.pool = WarmPool(provider, settings.pool_size, settings.default_limits())
        self.held: dict[str, Held] = {}
        self._heads: dict[str, Head] = {}
        self._locks: dict[str, asyncio.Lock] = {}
        self._reconciling: asyncio.Task[None] | None = None
        self._closing = False
        # set by the routes (subscribers.py): serve / stop serving one held sandbox's subjects
        self.on_adopt: Callable[[Held], Awaitable[None]] | None = None
        self.on_release: Callable[[Held], Awaitable[None]] | None = None

    async def append(self, tenant: str, sandbox: str, event: Event, labels: dict[str, str]) -> None:
        subject = sb.sandbox_subject(tenant, sandbox)
        envelope: Envelope[Event] = Envelope(
            id=new_id(), tenant=tenant, actor=self.ctx.actor, ts=utc_now(), data=event,
            session=labels.get("session"), run=labels.get("run"),
        )  # fmt: skip
        # One writer per sandbox subject (this replica), appends serialised per subject; a
        # stale cached head (say, after a restart) is re-read once.
        async with self._locks.setdefault(subject, asyncio.Lock()):
            try:
                appended = await self.store.append(
                    subject, envelope, expect=self._heads.get(subject)
                )
            except AppendConflict:
                appended = await self.store.append(subject, envelope)
            self._heads[subject] = appended.head

    def get_held(self, tenant: str, sandbox: str) -> Held:
        held = self.held.get(sandbox)
        if held is None or held.tenant != tenant:
            raise SandboxNotFound(f"no sandbox {sandbox!r} for tenant {tenant!r} on this replica")
        return held

    def info(self, sandbox: str, held: Held) -> sb.SandboxInfo:
        box = held.box
        return sb.SandboxInfo(
            sandbox=sandbox, tenant=held.tenant, provider=self.provider.name,
            replica=self.ctx.replica, status="running" if box.running else "stopped",
            workspace=str(box.workspace), parent=held.parent, labels=held.labels,
            contexts=sorted(box.contexts), stopped_reason=box.stopped_reason, pid=box.pid,
            uid=box.uid, capabilities=self.provider.capabilities, volume=held.spec.volume,
            volume_subpath=held.spec.volume_subpath, repo_url=held.spec.repo_url,
            ref=held.spec.ref, context_paths=list(held.spec.context_paths),
        )  # fmt: skip

    def start(self) -> None:
        """Background work: fill the warm pool, reconcile with the log (lifecycle.py)."""
        self._reconciling = asyncio.create_task(lifecycle.reconcile_until_done(self))
        self.pool.start()

    async def adopt(self, tenant: str, box: Sandbox, labels: dict[str, str],
                     parent: str | None, spec: domain.Spec | None = None) -> Held:  # fmt: skip
        held = Held(tenant, box, labels, parent, spec or domain.Spec())
        self.held[box.id] = held
        box.on_stop.append(lambda stopped: self._on_stop(stopped, held))
        if self.on_adopt is not None:
            await self.on_adopt(held)
        return held

    async def _on_stop(self, box: Sandbox, held: Held) -> None:
        limit = box.stopped_limit
        if self._closing or (limit == "exited" and box.stopped_reason in ("deleted", "replaced")):
            return
        assert limit is not None
        event = sb.LimitExceeded(
            sandbox=box.id,
            limit=limit,  # type: ignore[arg-type]
            detail=box.stopped_reason or "",
        )
        try:
            await self.append(held.tenant, box.id, event, held.labels)
        except Exception:
            self.ctx.log.exception("could not record a sandbox stop", extra={"sandbox": box.id})

    # -- verbs -------------------------------------------------------------------------------

    async def create(self, req: sb.CreateSandbox) -> sb.SandboxInfo:
        check_subpath(req.volume_subpath)  # a child's `.children/<id>` is the broker's to give
        spec = domain.Spec(
            req.volume, req.volume_subpath, req.repo_url, req.ref, tuple(req.context_paths),
            req.local_checkout,
        )  # fmt: skip
        files = {path: await self.blobs.get(req.tenant, ref.sha256)
                 for path, ref in req.context_files.items()}  # fmt: skip
        held = await self._start(
            req.tenant, dict(req.labels), req.limits, spec, fork_ready=req.fork_ready, files=files
        )
        return self.info(held.box.id, held)

    async def _start(
        self,
        tenant: str,
        labels: dict[str, str],
        limits: sb.Limits | None,
        spec: domain.Spec,
        *,
        fork_ready: bool = True,
        files: dict[str, bytes] | None = None,
        sandbox: str | None = None,
        parent: str | None = None,
    ) -> Held:
        """A clean sandbox: from the warm pool when nothing about it is special."""
        box = None
        plain = spec.volume is None and spec.repo_url is None and limits is None
        if plain and fork_ready and sandbox is None:
            box = self.pool.take()
        limits = limits or self.settings.default_limits()
        if box is None:
            mounts: dict[str, Path] = {}
            if spec.volume is not None:
                path = await asyncio.to_thread(
                    self.volumes.prepare, tenant, spec.volume, spec.volume_subpath
                )
                mounts["volume"] = path
            box = await self.provider.create(
                sandbox or new_id(), limits, fork_ready=fork_ready, mounts=mounts
            )
        try:
            if spec.volume is not None and box.uid is not None:
                await asyncio.to_thread(
                    self.volumes.ensure, tenant, spec.volume, spec.volume_subpath, box.uid
                )
            if spec.repo_url is not None:
                await self.provider.clone_repo(
                    box, spec.repo_url, spec.ref, allow_local=self.settings.allow_local_repos
                )
            for name, data in (files or {}).items():
                await box.write_file(name, data)
        except BaseException:
            await box.destroy()
            raise
        held = await self.adopt(tenant, box, labels, parent, spec)
        await self.append(tenant, box.id, sb.SandboxCreated(
            sandbox=box.id, provider=self.provider.name, replica=self.ctx.replica,
            workspace=str(box.workspace), labels=labels, limits=box.limits, volume=spec.volume,
            volume_subpath=spec.volume_subpath, repo_url=spec.repo_url, ref=spec.ref,
            context_paths=list(spec.context_paths), local_checkout=spec.local_checkout,
        ), labels)  # fmt: skip
        return held

    async def fork(self, req: sb.ForkSandbox) -> sb.SandboxInfo:
        parent = self.get_held(req.tenant, req.sandbox)
        held = await self._fork(parent, {**parent.labels, **req.labels})
        return self.info(held.box.id, held)

    async def _fork(self, parent: Held, labels: dict[str, str]) -> Held:
        child_id = new_id()
        box = await self.provider.fork(parent.box, child_id)
        labels = {**labels, "parent": parent.box.id}
        held = await self.adopt(parent.tenant, box, labels, parent.box.id)
        held.interpreters = dict.fromkeys(parent.interpreters)
        parent.children.add(child_id)
        await self.append(parent.tenant, child_id, sb.SandboxForked(
            sandbox=child_id, parent=parent.box.id, provider=self.provider.name,
            replica=self.ctx.replica, workspace=str(box.workspace), labels=labels,
            limits=box.limits,
        ), labels)  # fmt: skip
        return held

    async def build_child(self, req: sb.BuildChild) -> sb.ChildSandbox:
        """The isolation policy, one code path for every child (docs/sandboxes.md)."""
        parent = self.get_held(req.tenant, req.sandbox)
        mode = await self.config.get("rlm_child_isolation_mode", tenant=req.tenant)
        fallback = await self.config.get("rlm_child_fork_fallback", tenant=req.tenant)
        policy = domain.ChildPolicy(mode=mode, fallback=fallback)  # type: ignore[arg-type]
        facts = domain.ParentFacts(
            has_volume=parent.spec.volume is not None,
            provider_can_fork=self.provider.capabilities.fork,
        )
        plan = domain.decide_child(policy, facts)
        labels = {**parent.labels, "role": "child", "parent": parent.box.id, **req.labels}
        child: Held | None = None
        context = req.context
        if plan.branch == "fork":
            try:
                child = await self._fork(parent, labels)
            except (ForkFailed, SandboxStopped) as exc:
                plan = domain.after_fork_failure(policy, exc.message)
        if plan.branch in ("clean_volume", "clean_fallback"):
            child, context = await self._clean_child(parent, labels), new_id()
        elif plan.branch == "context":
            context = new_id()
        decided = sb.ChildIsolationDecided(
            parent=parent.box.id, child=None if plan.branch == "refused" else
            (child.box.id if child else parent.box.id), mode=policy.mode, branch=plan.branch,
            reason=plan.reason, context=context,
        )  # fmt: skip
        await self.append(req.tenant, parent.box.id, decided, parent.labels)
        if plan.branch == "refused":
            raise ForkFailed(f"no sandbox for the child: {plan.reason}")
        target = child or parent
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
                max_bytes=self.settings.snapshot_max_bytes,
                file_bytes=self.settings.snapshot_file_bytes,
            )  # fmt: skip
            files[snapshot.SNAPSHOT_PATH] = text.encode()
            paths.append(snapshot.SNAPSHOT_PATH)
        child_spec = domain.Spec(
            volume=spec.volume,
            volume_subpath=child_subpath(child_id) if spec.volume else None,
            repo_url=spec.repo_url, ref=spec.ref, context_paths=tuple(paths),
        )  # fmt: skip
        # default limits and nothing special: the warm pool can serve the child
        limits = None if parent.box.limits == self.settings.default_limits() else parent.box.limits
        held = await self._start(
            parent.tenant, labels, limits, child_spec, files=files,
            sandbox=child_id if spec.volume else None, parent=parent.box.id,
        )  # fmt: skip
        parent.children.add(held.box.id)
        return held

    async def open_context(self, req: sb.OpenContext) -> sb.Ack:
        held = self.get_held(req.tenant, req.sandbox)
        check_id("context", req.context)
        if req.interpreter is not None:
            check_id("interpreter", req.interpreter)
        await held.box.open_context(req.context)
        held.interpreters[req.context] = req.interpreter
        await self.append(req.tenant, req.sandbox, sb.ContextOpened(
            sandbox=req.sandbox, context=req.context, interpreter=req.interpreter
        ), held.labels)  # fmt: skip
        return sb.Ack()

    async def close_context(self, req: sb.CloseContext) -> sb.Ack:
        held = self.get_held(req.tenant, req.sandbox)
        if held.interpreters.pop(req.context, "absent") == "absent":
            return sb.Ack(ok=False)
        await held.box.close_context(req.context)
        await self.append(req.tenant, req.sandbox, sb.ContextClosed(
            sandbox=req.sandbox, context=req.context
        ), held.labels)  # fmt: skip
        return sb.Ack()

    async def execute(self, req: sb.Execute) -> sb.ExecuteReply:
        held = self.get_held(req.tenant, req.sandbox)
        if req.context not in held.interpreters:
            raise SandboxNotFound(f"no open context {req.context!r} in sandbox {req.sandbox!r}")
        interpreter = held.interpreters[req.context]
        blobs = dict(req.blobs)
        for digest, ref in req.blob_refs.items():
            if ref.sha256 != digest:
                raise rpc.BadRequest(f"blob {ref.object} does not hold variable {digest}")
            try:
                blobs[digest] = (await self.blobs.get(req.tenant, ref.sha256)).decode()
            except BlobNotFound as exc:
                raise rpc.BadRequest(
                    f"variable {digest} is not in the object store: {exc}"
                ) from exc
        limit = held.box.limits.wall_s
        wall = limit if req.wall_s is None else min(req.wall_s, limit)
        try:
            return await held.box.execute(
                context=req.context, code=req.code, variables=req.variables, blobs=blobs,
                tools=req.tools, output_fields=req.output_fields, wall_s=wall,
                relay=self._relay_to(interpreter, req.callback_timeout_s),
            )  # fmt: skip
        except SandboxStopped as exc:
            return sb.ExecuteReply(kind="terminal", error=exc.message)

    def _relay_to(self, interpreter: str | None, timeout: float) -> Any:
        async def relay(call: sb.ToolCall) -> sb.ToolReply:
            if interpreter is None:
                return sb.ToolReply(ok=False, error="this context has no interpreter for tools")
            try:
                return await rpc.call_verb(
                    self.ctx.nc, bus.TOOL_CALL, call, target=interpreter, timeout=timeout
                )
            except (TimeoutError, NatsTimeout):
                return sb.ToolReply(
                    ok=False, error=f"host tool {call.name!r} did not answer within {timeout:g} s"
                )
            except NoRespondersError:
                return sb.ToolReply(ok=False, error="the interpreter owning this context is gone")
            except rpc.RemoteError as exc:
                return sb.ToolReply(ok=False, error=exc.message)

        return relay

    async def put_file(self, req: sb.PutFile) -> sb.FileInfo:
        held = self.get_held(req.tenant, req.sandbox)
        if req.blob is not None:
            data = await self.blobs.get(req.tenant, req.blob.sha256)
        elif req.data is not None:
            data = req.data
        else:
            raise rpc.BadRequest("put needs `data` or `blob`")
        await held.box.write_file(req.path, data)
        return sb.FileInfo(path=req.path, size=len(data), sha256=sha256_hex(data))

    async def get_file(self, req: sb.GetFile) -> sb.FileContent:
        held = self.get_held(req.tenant, req.sandbox)
        data = await held.box.read_file(req.path, req.max_bytes)
        digest = sha256_hex(data)
        if req.via_blob:
            ref = await self.blobs.put(req.tenant, data)
            return sb.FileContent(path=req.path, size=len(data), sha256=digest, blob=ref)
        if len(data) > self.settings.max_request_bytes - 4096:
            raise TooLarge(f"{req.path!r} is {len(data)} bytes: ask with via_blob=true")
        return sb.FileContent(path=req.path, size=len(data), sha256=digest, data=data)

    async def get(self, req: sb.GetSandbox) -> sb.SandboxInfo:
        return self.info(req.sandbox, self.get_held(req.tenant, req.sandbox))

    async def delete(self, req: sb.DeleteSandbox) -> sb.Ack:
        await self._delete(self.get_held(req.tenant, req.sandbox), req.reason)
        return sb.Ack()

    async def _delete(self, held: Held, reason: str) -> None:
        box = held.box
        for child in sorted(held.children):
            if child in self.held:
                await self._delete(self.held[child], f"parent {box.id} deleted")
        await box.destroy()
        if self.on_release is not None:
            await self.on_release(held)
        self.held.pop(box.id, None)
        if held.parent in self.held:
            self.held[held.parent].children.discard(box.id)
        await self.append(held.tenant, box.id, sb.SandboxDeleted(sandbox=box.id, reason=reason),
                           held.labels)  # fmt: skip

    async def list(self, req: sb.ListSandboxes) -> sb.SandboxList:
        views: dict[str, domain.SandboxView] = {}
        async for stored in self.store.replay(sb.tenant_filter(req.tenant)):
            domain.evolve(views, req.tenant, stored.envelope.data)
        items = [
            sb.SandboxInfo(
                sandbox=v.sandbox,
                tenant=v.tenant,
                provider=v.provider,
                replica=v.replica,
                status=v.status,
                workspace=v.workspace,
                parent=v.parent,
                labels=v.labels,
                contexts=list(v.contexts),
                stopped_reason=v.stopped_reason,
            )
            for v in views.values()
            if v.status != "deleted"
            and (req.session is None or v.labels.get("session") == req.session)
        ]
        return sb.SandboxList(items=items)

    async def views(self, filter_subject: str) -> dict[str, domain.SandboxView]:
        views: dict[str, domain.SandboxView] = {}
        async for stored in self.store.replay(filter_subject):
            domain.evolve(views, stored.envelope.tenant, stored.envelope.data)
        return views

    async def resume(self, req: sb.ResumeSandbox) -> sb.SandboxInfo:
        """The session's sandbox if some replica holds it running; else a replacement on the
        same volume and subpath (REPL memory lost, files on the volume kept)."""
        ask = sb.GetSandbox(request_id=new_id(), tenant=req.tenant, sandbox=req.sandbox)
        try:
            info = await rpc.call_verb(
                self.ctx.nc, bus.GET_SANDBOX, ask, target=req.sandbox, timeout=5
            )
            if info.status == "running":
                return info
            reason = f"its sandbox {req.sandbox} was stopped: {info.stopped_reason}"
        except (NoRespondersError, TimeoutError, NatsTimeout):
            reason = f"its sandbox {req.sandbox} is gone (no broker holds it)"
        except rpc.RemoteError as exc:
            raise SandboxNotFound(exc.message) from exc
        view = (await self.views(sb.sandbox_subject(req.tenant, req.sandbox))).get(req.sandbox)
        if view is None or view.status == "deleted":
            raise SandboxNotFound(f"no live sandbox {req.sandbox!r} for tenant {req.tenant!r}")
        if req.sandbox in self.held:
            await self._delete(self.held[req.sandbox], "replaced")
        held = await self._start(req.tenant, dict(view.labels), view.limits, view.spec)
        await self.append(req.tenant, held.box.id, sb.SandboxReplaced(
            sandbox=held.box.id, replaced=req.sandbox,
            reason=f"{reason}; REPL memory is lost, files on the volume are kept",
        ), held.labels)  # fmt: skip
        return self.info(held.box.id, held)

    async def volume_list(self, req: sb.ListVolume) -> sb.VolumeListing:
        return await asyncio.to_thread(
            self.volumes.listing, req.tenant, req.volume, req.path, min(req.max_entries, 10_000)
        )

    async def volume_read(self, req: sb.ReadVolumeFile) -> sb.FileContent:
        cap = min(req.max_bytes, self.settings.max_request_bytes - 4096)
        data = await asyncio.to_thread(self.volumes.read, req.tenant, req.volume, req.path, cap)
        return sb.FileContent(path=req.path, size=len(data), sha256=sha256_hex(data), data=data)

    async def close(self) -> None:
        """Stop every sandbox at once and record nothing: NATS may already be gone, and the
        log rightly still shows them, so a restart under this name reaps or revives them."""
        self._closing = True
        if self._reconciling is not None:
            self._reconciling.cancel()
        await self.pool.close()
        await asyncio.gather(
            *(held.box.stop("the broker stopped", "exited") for held in self.held.values()),
            return_exceptions=True,
        )
