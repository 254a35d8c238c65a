"""Composition root of the gateway: `create_app(settings)` is what `main()` serves and what
tests mount. NATS is connected in the lifespan, never at import."""

import asyncio
import logging
import os
import signal
import time
from collections.abc import AsyncIterator, Awaitable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from types import FrameType

import uvicorn
from fastapi import FastAPI
from fastapi.responses import JSONResponse
from nats.aio.client import Client
from nats.errors import Error as NatsError

from fleet_events import bus
from fleet_events.bus import Ping, Pong
from fleet_gateway.config import GatewaySettings
from fleet_gateway.readiness import Readiness, check
from fleet_mesh import logs, rpc
from fleet_mesh.connection import connect
from fleet_mesh.service import replica_id

SERVICE = "gateway"
STOP_GRACE_S = 5.0

log = logging.getLogger("fleet.gateway")


@dataclass
class GatewayState:
    settings: GatewaySettings
    replica: str
    started: float = field(default_factory=time.monotonic)
    nc: Client | None = None
    served: list[rpc.Served] = field(default_factory=list)


async def _open(state: GatewayState) -> None:
    nc = await connect(state.settings.nats_url, name=f"{SERVICE}:{state.replica}")
    state.nc = nc

    async def pong(_: Ping) -> Pong:
        return Pong(
            service=SERVICE,
            replica=state.replica,
            pid=os.getpid(),
            uptime_s=round(time.monotonic() - state.started, 3),
        )

    state.served.append(await rpc.serve_verb(nc, bus.ping(SERVICE), pong))


async def _close(state: GatewayState) -> None:
    """Every phase is bounded: when the whole mesh stops, NATS may vanish mid-drain, and an
    unbounded drain would wait for a server that is not coming back."""
    nc, state.nc = state.nc, None
    served, state.served = state.served, []
    await _bounded(asyncio.gather(*(one.stop(grace=STOP_GRACE_S) for one in served)), "pings")
    if nc is None or nc.is_closed:
        return
    if nc.is_connected:
        await _bounded(nc.drain(), "the NATS drain")  # finishes in-flight pings, then closes
    if not nc.is_closed:
        await nc.close()  # NATS is gone or the drain ran out of time: do not wait for it


async def _bounded(work: Awaitable[object], what: str) -> None:
    try:
        await asyncio.wait_for(work, STOP_GRACE_S)
    except TimeoutError:
        log.warning("%s did not finish within %ss; stopping anyway", what, STOP_GRACE_S)
    except NatsError as exc:
        log.warning("%s failed while stopping: %s", what, exc)


def create_app(settings: GatewaySettings | None = None, *, replica: str | None = None) -> FastAPI:
    settings = settings or GatewaySettings()
    state = GatewayState(settings=settings, replica=replica or replica_id(SERVICE))

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        await _open(state)
        try:
            yield
        finally:
            await _close(state)

    app = FastAPI(title="fleet-rlm gateway", lifespan=lifespan)
    app.state.gateway = state

    @app.get("/health")
    async def health() -> dict[str, str]:
        """The process is alive and serving HTTP; says nothing about its dependencies."""
        return {"status": "ok", "service": SERVICE, "replica": state.replica}

    @app.get("/ready", response_model=Readiness)
    async def ready() -> JSONResponse:
        report = await check(state.nc, settings.services, settings.probe_timeout_s)
        return JSONResponse(report.model_dump(), status_code=200 if report.ready else 503)

    return app


def _ignore(signum: int, frame: FrameType | None) -> None:
    """Placeholder handler: uvicorn re-raises the signal it shut down on into the handler it
    found at start; with this one there, a requested stop ends with exit 0 like every service."""


def main() -> None:
    """Serve the gateway; SIGTERM/SIGINT become a graceful shutdown (lifespan exit), exit 0."""
    settings = GatewaySettings()
    replica = replica_id(SERVICE)
    logs.configure(SERVICE, replica, os.environ.get("FLEET_LOG_LEVEL", "INFO"))
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, _ignore)
    config = uvicorn.Config(
        create_app(settings, replica=replica),
        host=settings.host,
        port=settings.port,
        log_config=None,
        access_log=False,
        timeout_graceful_shutdown=5,
    )
    log.info("listening", extra={"host": settings.host, "port": settings.port})
    uvicorn.Server(config).run()
    log.info("stopped")
