"""The broker's bus API: thin adapters from requests to the provider, the log and replies.

Routing across replicas: `create` and `list` are served in the queue group (any replica);
a sandbox's processes live in the replica that created it, which alone subscribes to
`fleet.rpc.sandbox-broker.sandbox.<id>.*`. A request for a sandbox whose replica is gone gets
"no responders" from NATS, which the caller reports as the sandbox being unreachable.

Every request carries a `request_id`; answers are remembered (and concurrent duplicates
joined), so a retry gets the original answer and never runs twice.
"""

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from nats.errors import NoRespondersError
from nats.errors import TimeoutError as NatsTimeout

from fleet_events import sandbox as sb
from fleet_events import subjects
from fleet_events.codec import BlobStore, sha256_hex
from fleet_events.envelope import Envelope, Event, new_id, utc_now
from fleet_events.ids import InvalidId, check_id
from fleet_mesh import rpc
from fleet_mesh.service import ServiceContext
from fleet_mesh.store import EventStore, Head
from fleet_sandbox_broker import domain
from fleet_sandbox_broker.config import BrokerSettings
from fleet_sandbox_broker.errors import SandboxError, SandboxNotFound, SandboxStopped, TooLarge
from fleet_sandbox_broker.providers.local import LocalProvider, LocalSandbox

R = TypeVar("R")


@dataclass
class Held:
    """A sandbox this replica holds."""

    tenant: str
    box: LocalSandbox
    labels: dict[str, str]
    parent: str | None = None
    interpreters: dict[str, str | None] = field(default_factory=dict)
    children: set[str] = field(default_factory=set)
    served: list[rpc.Served] = field(default_factory=list)


class Broker:
    def __init__(
        self,
        ctx: ServiceContext,
        provider: LocalProvider,
        store: EventStore,
        blobs: BlobStore,
        settings: BrokerSettings,
    ) -> None:
        self.ctx = ctx
        self.provider = provider
        self.store = store
        self.blobs = blobs
        self.settings = settings
        self.held: dict[str, Held] = {}
        self._heads: dict[str, Head] = {}
        self._answers = rpc.ReplyCache()
        self._running: dict[str, asyncio.Future[Any]] = {}

    # -- plumbing ----------------------------------------------------------------------------

    async def _serve(self, subject: str, kind: type[Any], handler: Any, queue: str) -> rpc.Served:
        async def guarded(request: Any) -> Any:
            try:
                check_id("tenant", request.tenant)
                return await self._once(request.request_id, lambda: handler(request))
            except InvalidId as exc:
                raise rpc.BadRequest(str(exc)) from exc
            except SandboxError as exc:
                raise rpc.RpcError(exc.code, exc.message) from exc

        return await rpc.serve(
            self.ctx.nc, subject, kind, guarded, queue=queue,
            max_bytes=self.settings.max_request_bytes,
        )  # fmt: skip

    async def _once(self, request_id: str, work: Callable[[], Awaitable[R]]) -> R:
        cached = self._answers.get(request_id)
        if cached is not None:
            return cached  # type: ignore[no-any-return]
        running = self._running.get(request_id)
        if running is not None:
            return await asyncio.shield(running)
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._running[request_id] = future
        try:
            answer = await work()
        except BaseException as exc:
            future.set_exception(exc)
            future.exception()
            raise
        finally:
            self._running.pop(request_id, None)
        future.set_result(answer)
        self._answers.put(request_id, answer)
        return answer

    async def _append(
        self, tenant: str, sandbox: str, event: Event, labels: dict[str, str]
    ) -> None:
        subject = sb.sandbox_subject(tenant, sandbox)
        envelope: Envelope[Event] = Envelope(
            id=new_id(), tenant=tenant, actor=self.ctx.actor, ts=utc_now(), data=event,
            session=labels.get("session"), run=labels.get("run"),
        )  # fmt: skip
        appended = await self.store.append(subject, envelope, expect=self._heads.get(subject))
        self._heads[subject] = appended.head

    def _get(self, tenant: str, sandbox: str) -> Held:
        held = self.held.get(sandbox)
        if held is None or held.tenant != tenant:
            raise SandboxNotFound(f"no sandbox {sandbox!r} for tenant {tenant!r} on this replica")
        return held

    def _info(self, sandbox: str, held: Held) -> sb.SandboxInfo:
        box = held.box
        return sb.SandboxInfo(
            sandbox=sandbox, tenant=held.tenant, provider=self.provider.name,
            replica=self.ctx.replica, status="running" if box.running else "stopped",
            workspace=str(box.workspace), parent=held.parent, labels=held.labels,
            contexts=sorted(box.contexts), stopped_reason=box.stopped_reason, pid=box.pid,
            uid=box.uid, capabilities=self.provider.capabilities,
        )  # fmt: skip

    # -- start -------------------------------------------------------------------------------

    async def start(self) -> None:
        queue = self.ctx.name
        self.ctx.served.append(
            await self._serve(sb.broker_rpc("create"), sb.CreateSandbox, self.create, queue)
        )
        self.ctx.served.append(
            await self._serve(sb.broker_rpc("list"), sb.ListSandboxes, self.list, queue)
        )

    async def _adopt(self, tenant: str, box: LocalSandbox, labels: dict[str, str],
                     parent: str | None) -> Held:  # fmt: skip
        held = Held(tenant=tenant, box=box, labels=labels, parent=parent)
        self.held[box.id] = held
        box.on_stop.append(self._on_stop)
        routes: list[tuple[str, type[Any], Any]] = [
            ("fork", sb.ForkSandbox, self.fork),
            ("open", sb.OpenContext, self.open_context),
            ("close", sb.CloseContext, self.close_context),
            ("exec", sb.Execute, self.execute),
            ("put", sb.PutFile, self.put_file),
            ("read", sb.GetFile, self.get_file),
            ("info", sb.GetSandbox, self.get),
            ("delete", sb.DeleteSandbox, self.delete),
        ]
        for verb, kind, handler in routes:
            held.served.append(await self._serve(sb.sandbox_rpc(box.id, verb), kind,
                                                        handler, ""))  # fmt: skip
        return held

    async def _on_stop(self, box: LocalSandbox) -> None:
        held = self.held.get(box.id)
        limit = box.stopped_limit
        if held is None or (limit in (None, "exited") and box.stopped_reason == "deleted"):
            return
        assert limit is not None
        event = sb.LimitExceeded(
            sandbox=box.id,
            limit=limit,  # type: ignore[arg-type]
            detail=box.stopped_reason or "",
        )
        try:
            await self._append(held.tenant, box.id, event, held.labels)
        except Exception:
            self.ctx.log.exception("could not record a sandbox stop", extra={"sandbox": box.id})

    # -- verbs -------------------------------------------------------------------------------

    async def create(self, req: sb.CreateSandbox) -> sb.SandboxInfo:
        limits = req.limits or self.settings.default_limits()
        sandbox = new_id()
        box = await self.provider.create(sandbox, limits, fork_ready=req.fork_ready)
        held = await self._adopt(req.tenant, box, dict(req.labels), None)
        for path, ref in req.context_files.items():
            await box.write_file(path, await self.blobs.get(req.tenant, ref.sha256))
        await self._append(req.tenant, sandbox, sb.SandboxCreated(
            sandbox=sandbox, provider=self.provider.name, replica=self.ctx.replica,
            workspace=str(box.workspace), labels=held.labels, limits=limits,
        ), held.labels)  # fmt: skip
        return self._info(sandbox, held)

    async def fork(self, req: sb.ForkSandbox) -> sb.SandboxInfo:
        parent = self._get(req.tenant, req.sandbox)
        child_id = new_id()
        box = await self.provider.fork(parent.box, child_id)
        labels = {**parent.labels, **req.labels, "parent": req.sandbox}
        held = await self._adopt(req.tenant, box, labels, req.sandbox)
        held.interpreters = dict.fromkeys(parent.interpreters)
        parent.children.add(child_id)
        await self._append(req.tenant, child_id, sb.SandboxForked(
            sandbox=child_id, parent=req.sandbox, provider=self.provider.name,
            replica=self.ctx.replica, workspace=str(box.workspace), labels=labels,
            limits=box.limits,
        ), labels)  # fmt: skip
        return self._info(child_id, held)

    async def open_context(self, req: sb.OpenContext) -> sb.Ack:
        held = self._get(req.tenant, req.sandbox)
        check_id("context", req.context)
        if req.interpreter is not None:
            check_id("interpreter", req.interpreter)
        await held.box.open_context(req.context)
        held.interpreters[req.context] = req.interpreter
        await self._append(req.tenant, req.sandbox, sb.ContextOpened(
            sandbox=req.sandbox, context=req.context, interpreter=req.interpreter
        ), held.labels)  # fmt: skip
        return sb.Ack()

    async def close_context(self, req: sb.CloseContext) -> sb.Ack:
        held = self._get(req.tenant, req.sandbox)
        if held.interpreters.pop(req.context, "absent") == "absent":
            return sb.Ack(ok=False)
        await held.box.close_context(req.context)
        await self._append(req.tenant, req.sandbox, sb.ContextClosed(
            sandbox=req.sandbox, context=req.context
        ), held.labels)  # fmt: skip
        return sb.Ack()

    async def execute(self, req: sb.Execute) -> sb.ExecuteReply:
        held = self._get(req.tenant, req.sandbox)
        if req.context not in held.interpreters:
            raise SandboxNotFound(f"no open context {req.context!r} in sandbox {req.sandbox!r}")
        interpreter = held.interpreters[req.context]
        limit = held.box.limits.wall_s
        wall = limit if req.wall_s is None else min(req.wall_s, limit)
        try:
            return await held.box.execute(
                context=req.context, code=req.code, variables=req.variables, blobs=req.blobs,
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
                return await rpc.call(
                    self.ctx.nc, subjects.callback(interpreter), call, sb.ToolReply,
                    timeout=timeout,
                )  # fmt: skip
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
        held = self._get(req.tenant, req.sandbox)
        if req.blob is not None:
            data = await self.blobs.get(req.tenant, req.blob.sha256)
        elif req.data is not None:
            data = req.data
        else:
            raise rpc.BadRequest("put needs `data` or `blob`")
        await held.box.write_file(req.path, data)
        return sb.FileInfo(path=req.path, size=len(data), sha256=sha256_hex(data))

    async def get_file(self, req: sb.GetFile) -> sb.FileContent:
        held = self._get(req.tenant, req.sandbox)
        data = await held.box.read_file(req.path, req.max_bytes)
        digest = sha256_hex(data)
        if req.via_blob:
            ref = await self.blobs.put(req.tenant, data)
            return sb.FileContent(path=req.path, size=len(data), sha256=digest, blob=ref)
        if len(data) > self.settings.max_request_bytes - 4096:
            raise TooLarge(f"{req.path!r} is {len(data)} bytes: ask with via_blob=true")
        return sb.FileContent(path=req.path, size=len(data), sha256=digest, data=data)

    async def get(self, req: sb.GetSandbox) -> sb.SandboxInfo:
        return self._info(req.sandbox, self._get(req.tenant, req.sandbox))

    async def delete(self, req: sb.DeleteSandbox) -> sb.Ack:
        await self._delete(self._get(req.tenant, req.sandbox), req.reason)
        return sb.Ack()

    async def _delete(self, held: Held, reason: str) -> None:
        box = held.box
        for child in sorted(held.children):
            if child in self.held:
                await self._delete(self.held[child], f"parent {box.id} deleted")
        await box.destroy()
        for served in held.served:
            await served.stop(grace=0)
        self.held.pop(box.id, None)
        if held.parent in self.held:
            self.held[held.parent].children.discard(box.id)
        await self._append(held.tenant, box.id, sb.SandboxDeleted(sandbox=box.id, reason=reason),
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

    async def close(self) -> None:
        for held in list(self.held.values()):
            await held.box.stop("the broker stopped", "exited")
