"""The broker's bus API: routes, idempotence and error codes; the work is in `broker.py`.

Routing across replicas: `create`, `list`, `resume` and the volume verbs are served in the
queue group (any replica); a sandbox's processes live in the replica that created it, which
alone subscribes to `fleet.rpc.sandbox-broker.sandbox.<id>.*`. A request for a sandbox whose
replica is gone gets "no responders" from NATS, which the caller reports as the sandbox being
unreachable.

Every request carries a `request_id`; answers are remembered (and concurrent duplicates
joined), so a retry gets the original answer and never runs twice.
"""

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from fleet_events import bus
from fleet_events.ids import InvalidId, check_id
from fleet_mesh import rpc
from fleet_mesh.service import ServiceContext
from fleet_sandbox_broker.broker import Broker, Held
from fleet_sandbox_broker.errors import SandboxError

R = TypeVar("R")


class Routes:
    def __init__(self, ctx: ServiceContext, broker: Broker, max_request_bytes: int) -> None:
        self.ctx = ctx
        self.broker = broker
        self.max_request_bytes = max_request_bytes
        # Answers kept for retries. Execution replies can be megabytes (output, values), so
        # they get a small cache of their own: a retry is expected within seconds, not hours.
        self._answers = rpc.ReplyCache(capacity=4096)
        self._exec_answers = rpc.ReplyCache(capacity=64)
        self._running: dict[str, asyncio.Future[Any]] = {}
        broker.on_adopt = self.serve_sandbox
        broker.on_release = self.release

    async def start(self) -> None:
        b = self.broker
        routes: list[tuple[bus.Verb[Any, Any], Callable[[Any], Awaitable[Any]]]] = [
            (bus.CREATE_SANDBOX, b.create),
            (bus.LIST_SANDBOXES, b.list),
            (bus.RESUME_SANDBOX, b.resume),
            (bus.LIST_VOLUME, b.volume_list),
            (bus.READ_VOLUME_FILE, b.volume_read),
        ]
        for verb, handler in routes:
            self.ctx.served.append(await self._serve(verb, handler))

    async def serve_sandbox(self, held: Held) -> None:
        """Subscribe this replica (alone) to one sandbox's subjects."""
        b = self.broker
        routes: list[tuple[bus.Verb[Any, Any], Callable[[Any], Awaitable[Any]]]] = [
            (bus.FORK_SANDBOX, b.fork),
            (bus.BUILD_CHILD, b.build_child),
            (bus.OPEN_CONTEXT, b.open_context),
            (bus.CLOSE_CONTEXT, b.close_context),
            (bus.EXECUTE, b.execute),
            (bus.PUT_FILE, b.put_file),
            (bus.GET_FILE, b.get_file),
            (bus.GET_SANDBOX, b.get),
            (bus.DELETE_SANDBOX, b.delete),
        ]
        for verb, handler in routes:
            held.served.append(await self._serve(verb, handler, target=held.box.id))

    async def release(self, held: Held) -> None:
        for served in held.served:
            await served.stop(grace=0)

    async def _serve(
        self,
        verb: bus.Verb[Any, Any],
        handler: Callable[[Any], Awaitable[Any]],
        target: str | None = None,
    ) -> rpc.Served:
        subject = verb.subject(target)

        async def guarded(request: Any) -> Any:
            try:
                check_id("tenant", request.tenant)
                big = verb is bus.EXECUTE
                # A retry is the same request to the same place by the same tenant: keyed so,
                # a request id learnt (or reused) elsewhere never returns someone else's answer.
                key = f"{subject}|{request.tenant}|{request.request_id}"
                return await self._once(key, lambda: handler(request), big=big)
            except InvalidId as exc:
                raise rpc.BadRequest(str(exc)) from exc
            except SandboxError as exc:
                raise rpc.RpcError(exc.code, exc.message) from exc

        return await rpc.serve_verb(
            self.ctx.nc, verb, guarded, target=target, max_bytes=self.max_request_bytes
        )

    async def _once(self, key: str, work: Callable[[], Awaitable[R]], *, big: bool = False) -> R:
        answers = self._exec_answers if big else self._answers
        cached = answers.get(key)
        if cached is not None:
            return cached  # type: ignore[no-any-return]
        running = self._running.get(key)
        if running is not None:
            return await asyncio.shield(running)
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._running[key] = future
        try:
            answer = await work()
        except BaseException as exc:
            future.set_exception(exc)
            future.exception()
            raise
        finally:
            self._running.pop(key, None)
        future.set_result(answer)
        answers.put(key, answer)
        return answer
