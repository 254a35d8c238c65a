"""The common life of a service process: connect, answer ping, serve, consume, stop on SIGTERM.

Each service's `app.py` gives a `setup(ctx)` coroutine that registers what it serves
(`ctx.serve(verb, handler)`) and the durable consumers it takes work from
(`ctx.consume(spec, handler)`) on `ctx`; `run(...)` is the whole process. Everything registered
stops with the service, in the reverse order of its start. Nothing connects at import time.
A role that is no service (the checkpointer, `fleet_events.subjects.ROLES`) runs the same way
and answers no ping.
"""

import asyncio
import contextlib
import logging
import os
import signal
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from nats.aio.client import Client
from nats.js import JetStreamContext

from fleet_events import Actor, bus, subjects
from fleet_events.bus import Ping, Pong, Verb
from fleet_events.streams import ConsumerSpec
from fleet_mesh import logs, rpc
from fleet_mesh.connection import connect, require_permitted, server_address
from fleet_mesh.settings import BadSetting, MeshSettings, load_settings
from fleet_mesh.work import Handler, WorkConsumer

Req = TypeVar("Req")
Rep = TypeVar("Rep")

__all__ = ["Ping", "Pong", "ServiceContext", "run", "running", "serve_forever"]


@dataclass
class ServiceContext:
    name: str
    replica: str
    nc: Client
    js: JetStreamContext
    log: logging.Logger
    started: float = field(default_factory=time.monotonic)
    served: list[rpc.Served] = field(default_factory=list)
    consumers: list[WorkConsumer] = field(default_factory=list)
    on_stop: list[Callable[[], Awaitable[None]]] = field(default_factory=list)
    ping_details: Callable[[], dict[str, Any]] = field(default=dict)

    @property
    def actor(self) -> Actor:
        return Actor(service=self.name, replica=self.replica)

    async def serve(
        self,
        verb: Verb[Req, Rep],
        handler: Callable[[Req], Awaitable[Rep]],
        *,
        target: str | None = None,
        max_bytes: int = rpc.MAX_REQUEST_BYTES,
        concurrency: int = 64,
    ) -> rpc.Served:
        """Serve one of this service's catalog verbs until the service stops: a queue-group
        verb has one replica answer each request; up to `concurrency` run at once."""
        if verb.service != self.name:
            raise ValueError(f"{self.name} cannot serve {verb.key}: it is {verb.service}'s verb")
        served = await rpc.serve_verb(
            self.nc, verb, handler, target=target, max_bytes=max_bytes, concurrency=concurrency
        )
        self.served.append(served)
        return served

    async def consume(
        self,
        spec: ConsumerSpec,
        handler: Handler,
        *,
        slots: int = 1,
        batch: int = 1,
        sync_ack: bool = True,
        progress_every_s: float | None = None,
        poll_s: float = 5.0,
        grace_s: float = 5.0,
    ) -> WorkConsumer:
        """Take messages from a shared durable consumer until the service stops: the consumer
        is brought in line with `spec` (ack deadline, delivery bound), each message goes to
        `handler` in one of `slots`, and is settled as it answers (`fleet_mesh.work`). On
        stop, running handlers get `grace_s` before their messages are handed back."""
        consumer = WorkConsumer(
            self.js, spec, handler, slots=slots, log=self.log, progress_every_s=progress_every_s,
            poll_s=poll_s, batch=batch, sync_ack=sync_ack,
        )  # fmt: skip
        await consumer.start()
        self.consumers.append(consumer)

        async def stop() -> None:
            await consumer.stop(grace_s)

        self.on_stop.append(stop)
        return consumer


@contextlib.asynccontextmanager
async def running(
    name: str,
    setup: Callable[[ServiceContext], Awaitable[None]],
    *,
    settings: MeshSettings,
    log: logging.Logger | None = None,
) -> AsyncIterator[ServiceContext]:
    """A service's life on the bus without the process around it (signals, log set-up): what
    `serve_forever` runs, and what a test mounts to run a service inside its own loop."""
    replica = settings.replica_for(name)
    log = log or logging.getLogger(f"fleet.{name}")
    log.info("connecting")
    nc = await connect(
        settings.nats_url, name=f"{name}:{replica}", credentials=settings.credentials
    )
    ctx = ServiceContext(name=name, replica=replica, nc=nc, js=nc.jetstream(), log=log)

    async def pong(_: Ping) -> Pong:
        return Pong(
            service=name,
            replica=replica,
            pid=os.getpid(),
            uptime_s=round(time.monotonic() - ctx.started, 3),
            details=ctx.ping_details(),
        )

    try:
        await setup(ctx)
        # Ping last: a service that answers ping has every subscription of its setup live.
        if name in subjects.SERVICES:
            await ctx.serve(bus.ping(name), pong)
        # Started with another role's credentials, it stops here naming what was refused,
        # rather than serve half its verbs.
        await require_permitted(nc, f"{name} (replica {replica})")
        log.info("started", extra={"server": server_address(nc)})
        yield ctx
    finally:
        log.info("stopping")
        await _stop(ctx, log)
        log.info("stopped")


async def _stop(ctx: ServiceContext, log: logging.Logger) -> None:
    # Every phase is bounded: with NATS gone (a mesh stopping around us) a drain or an
    # in-flight reply would otherwise wait for a server that is not coming back.
    await _bounded(asyncio.gather(*(s.stop() for s in ctx.served)), STOP_GRACE_S, "requests", log)
    for hook in reversed(ctx.on_stop):
        await _bounded(hook(), STOP_GRACE_S, "a stop hook", log)
    if ctx.nc.is_connected:
        await _bounded(ctx.nc.drain(), DRAIN_S, "the NATS drain", log)
    if not ctx.nc.is_closed:
        await ctx.nc.close()


async def serve_forever(
    name: str,
    setup: Callable[[ServiceContext], Awaitable[None]],
    *,
    url: str | None = None,
    stop: asyncio.Event | None = None,
    settings: MeshSettings | None = None,
) -> None:
    settings = settings or load_settings()
    if url is not None:
        settings = settings.model_copy(update={"nats_url": url})
    # The replica is fixed here, once, so the log lines and the bus agree on it.
    settings = settings.model_copy(update={"replica": settings.replica_for(name)})
    log = logs.configure(name, settings.replica_for(name), settings.log_level)
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    started = asyncio.Event()

    async def live() -> None:
        async with running(name, setup, settings=settings, log=log):
            started.set()
            await stop.wait()

    # A stop asked for before the service is up (nats-py retries its first connection forever)
    # cancels the start: nothing else would wait on `stop` until the connection is made.
    life = asyncio.create_task(live())
    asked = asyncio.create_task(stop.wait())
    await asyncio.wait({life, asked}, return_when=asyncio.FIRST_COMPLETED)
    asked.cancel()
    if not life.done() and not started.is_set():
        log.info("stopped before starting")
        life.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await life
        return
    await life


STOP_GRACE_S = 10.0
DRAIN_S = 5.0


async def _bounded(work: Awaitable[object], seconds: float, what: str, log: logging.Logger) -> None:
    try:
        await asyncio.wait_for(work, seconds)
    except TimeoutError:
        log.warning(f"{what} did not finish within {seconds}s; stopping anyway")
    except Exception:
        log.exception(f"{what} failed while stopping")


def run(name: str, setup: Callable[[ServiceContext], Awaitable[None]]) -> None:
    """The body of every service's `main()`. A bad setting ends the process before anything
    starts, with the one line that says what to fix (exit code 1)."""
    try:
        settings = load_settings()
    except BadSetting as exc:
        sys.exit(f"{name}: {exc}")
    asyncio.run(serve_forever(name, setup, settings=settings))
