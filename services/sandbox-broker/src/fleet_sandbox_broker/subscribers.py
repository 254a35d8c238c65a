"""The broker's bus API: routes, idempotence, reply sizes and error codes; the work is in
`sandboxes.py`, `repl.py` and `files.py`.

Routing across replicas: `create`, `list`, `resume` and the volume verbs are served in the
queue group (any replica); a sandbox's processes live in the replica that created it, which
alone subscribes to `fleet.rpc.sandbox-broker.sandbox.<id>.*`. A request for a sandbox whose
replica is gone gets "no responders" from NATS, which the caller reports as the sandbox being
unreachable.

Every request carries a `request_id`; answers are remembered by encoded size (and concurrent
duplicates joined), so a retry gets the original answer and never runs twice. A reused id
with a different body is refused as a `conflict`, as payment APIs refuse a reused idempotency
key. Every answer is checked against the reply limit before it is remembered or sent, so an
answer too big to send is a clear error every time, never a cached failure.
"""

import asyncio
from collections.abc import Awaitable, Callable
from functools import partial
from typing import Any

import msgspec

from fleet_events import bus
from fleet_events.codec import sha256_hex
from fleet_events.ids import InvalidId, check_id
from fleet_mesh import rpc
from fleet_mesh.service import ServiceContext
from fleet_sandbox_broker.archive import Archives
from fleet_sandbox_broker.broker import Broker, Held
from fleet_sandbox_broker.errors import Conflict, SandboxError, TooLarge
from fleet_sandbox_broker.files import Files
from fleet_sandbox_broker.repl import Repl
from fleet_sandbox_broker.sandboxes import Sandboxes

Handler = Callable[[Any], Awaitable[Any]]

# what to do instead when an answer is over the reply limit
TOO_LARGE_HINTS = {
    bus.GET_FILE.name: "ask with via_blob=true (the object store has no such limit)",
    bus.READ_VOLUME_FILE.name: "ask for fewer bytes (max_bytes)",
    bus.LIST_SANDBOXES.name: "ask for a smaller page (limit)",
    bus.LIST_VOLUME.name: "ask for fewer entries (max_entries)",
}

_encoder = msgspec.json.Encoder()


class Routes:
    def __init__(
        self, ctx: ServiceContext, broker: Broker, *, max_request: int, max_reply: int,
        cache_bytes: int,
    ) -> None:  # fmt: skip
        self.ctx = ctx
        self.max_request = max_request
        # the smaller of the setting and what this server takes (headers need room too)
        self.max_reply = min(max_reply, ctx.nc.max_payload - 4096)
        self.sandboxes = Sandboxes(broker)
        self.repl = Repl(broker, self.max_reply)
        self.files = Files(broker, self.max_reply)
        self.archives = Archives(broker)
        self._answers = rpc.ReplyCache(max_bytes=cache_bytes, max_entry_bytes=self.max_reply)
        self._running: dict[str, tuple[str, asyncio.Future[bytes]]] = {}
        broker.on_adopt = self.serve_sandbox
        broker.on_release = self.release

    async def start(self) -> None:
        s, f = self.sandboxes, self.files
        routes: list[tuple[bus.Verb[Any, Any], Handler]] = [
            (bus.CREATE_SANDBOX, s.create),
            (bus.LIST_SANDBOXES, s.list),
            (bus.RESUME_SANDBOX, s.resume),
            (bus.LIST_VOLUME, f.volume_list),
            (bus.READ_VOLUME_FILE, f.volume_read),
            (bus.TEST_DAYTONA, s.test_daytona),
        ]
        for verb, handler in routes:
            self.ctx.served.append(await self._serve(verb, handler))

    async def serve_sandbox(self, held: Held) -> None:
        """Subscribe this replica (alone) to one sandbox's subjects."""
        s, r, f = self.sandboxes, self.repl, self.files
        routes: list[tuple[bus.Verb[Any, Any], Handler]] = [
            (bus.FORK_SANDBOX, s.fork),
            (bus.BUILD_CHILD, s.build_child),
            (bus.OPEN_CONTEXT, r.open_context),
            (bus.CLOSE_CONTEXT, r.close_context),
            (bus.EXECUTE, r.execute),
            (bus.INTERRUPT_CELL, r.interrupt),
            (bus.PUT_FILE, f.put_file),
            (bus.GET_FILE, f.get_file),
            (bus.GET_SANDBOX, s.get),
            (bus.DELETE_SANDBOX, s.delete),
            (bus.ARCHIVE_SANDBOX, self.archives.archive),
        ]
        for verb, handler in routes:
            held.served.append(await self._serve(verb, handler, target=held.box.id))

    async def release(self, held: Held) -> None:
        for served in held.served:
            await served.stop(grace=0)

    async def _serve(
        self, verb: bus.Verb[Any, Any], handler: Handler, target: str | None = None
    ) -> rpc.Served:
        subject = verb.subject(target)

        async def guarded(request: Any) -> Any:
            try:
                check_id("tenant", request.tenant)
                # A retry is the same request to the same place by the same tenant: keyed so,
                # a request id learnt (or reused) elsewhere never returns someone else's answer.
                key = f"{subject}|{request.tenant}|{request.request_id}"
                digest = sha256_hex(_encoder.encode(request))
                payload = await self._once(
                    key, digest, request.request_id, partial(self._encoded, verb, handler, request)
                )
                return msgspec.Raw(payload)  # sent as is: the bytes remembered are the bytes sent
            except InvalidId as exc:
                raise rpc.BadRequest(str(exc)) from exc
            except SandboxError as exc:
                raise rpc.RpcError(exc.code, exc.message) from exc

        return await rpc.serve_verb(
            self.ctx.nc, verb, guarded, target=target, max_bytes=self.max_request
        )

    async def _encoded(self, verb: bus.Verb[Any, Any], handler: Handler, request: Any) -> bytes:
        payload = _encoder.encode(await handler(request))
        if len(payload) > self.max_reply:
            hint = TOO_LARGE_HINTS.get(verb.name, "ask for less")
            raise TooLarge(
                f"the answer to {verb.name} is {len(payload)} bytes, over the "
                f"{self.max_reply}-byte reply limit: {hint}"
            )
        return payload

    async def _once(
        self, key: str, digest: str, request_id: str, work: Callable[[], Awaitable[bytes]]
    ) -> bytes:
        cached = self._answers.get(key)
        if cached is not None:
            _same_body(cached.digest, digest, request_id)
            return cached.payload
        running = self._running.get(key)
        if running is not None:
            _same_body(running[0], digest, request_id)
            return await asyncio.shield(running[1])
        future: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()
        self._running[key] = (digest, future)
        try:
            answer = await work()
        except BaseException as exc:
            future.set_exception(exc)
            future.exception()
            raise
        finally:
            self._running.pop(key, None)
        future.set_result(answer)
        self._answers.put(key, digest, answer)
        return answer


def _same_body(remembered: str, digest: str, request_id: str) -> None:
    if remembered != digest:
        raise Conflict(
            f"request_id {request_id!r} was already used for a different request: a retry must "
            "resend the same body; use a new request_id for a new request"
        )
