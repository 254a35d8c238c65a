"""The common life of a service process: connect, answer ping, serve, stop on SIGTERM.

Each service's `app.py` gives a `setup(ctx)` coroutine that registers its subscriptions on
`ctx`; `run(...)` is the whole process. Nothing connects at import time.
"""

import asyncio
import logging
import os
import signal
import socket
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from nats.aio.client import Client
from nats.js import JetStreamContext

from fleet_events import Actor, bus
from fleet_events.bus import Ping, Pong, Verb
from fleet_mesh import logs, rpc
from fleet_mesh.connection import connect, server_address

Req = TypeVar("Req")
Rep = TypeVar("Rep")

__all__ = ["Ping", "Pong", "ServiceContext", "run", "serve_forever"]


@dataclass
class ServiceContext:
    name: str
    replica: str
    nc: Client
    js: JetStreamContext
    log: logging.Logger
    started: float = field(default_factory=time.monotonic)
    served: list[rpc.Served] = field(default_factory=list)
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


def replica_id(service: str) -> str:
    explicit = os.environ.get("FLEET_REPLICA")
    if explicit:
        return explicit
    return f"{socket.gethostname()[:24]}-{os.getpid()}-{uuid.uuid4().hex[:6]}".replace(".", "-")


async def serve_forever(
    name: str,
    setup: Callable[[ServiceContext], Awaitable[None]],
    *,
    url: str | None = None,
    stop: asyncio.Event | None = None,
) -> None:
    replica = replica_id(name)
    log = logs.configure(name, replica, os.environ.get("FLEET_LOG_LEVEL", "INFO"))
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)

    nc = await connect(url, name=f"{name}:{replica}")
    ctx = ServiceContext(name=name, replica=replica, nc=nc, js=nc.jetstream(), log=log)

    async def pong(_: Ping) -> Pong:
        return Pong(
            service=name,
            replica=replica,
            pid=os.getpid(),
            uptime_s=round(time.monotonic() - ctx.started, 3),
            details=ctx.ping_details(),
        )

    await setup(ctx)
    # Ping last: a service that answers ping has every subscription of its setup live.
    await ctx.serve(bus.ping(name), pong)
    log.info("started", extra={"server": server_address(nc)})
    await stop.wait()
    log.info("stopping")
    # Every phase is bounded: with NATS gone (a mesh stopping around us) a drain or an
    # in-flight reply would otherwise wait for a server that is not coming back.
    await _bounded(asyncio.gather(*(s.stop() for s in ctx.served)), STOP_GRACE_S, "requests", log)
    for hook in reversed(ctx.on_stop):
        await _bounded(hook(), STOP_GRACE_S, "a stop hook", log)
    if nc.is_connected:
        await _bounded(nc.drain(), DRAIN_S, "the NATS drain", log)
    if not nc.is_closed:
        await nc.close()
    log.info("stopped")


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
    """The body of every service's `main()`."""
    asyncio.run(serve_forever(name, setup))
