"""Composition root of the gateway: a service on the common runtime, with HTTP inside it.

`main()` is `fleet_mesh.service.run` like every other service: the runtime connects, answers
ping, owns SIGTERM/SIGINT, runs the stop hooks and drains. `setup` starts uvicorn on that
runtime's loop (its own signal handlers off) and registers its stop as a hook, so HTTP is
closed before NATS is drained. `create_app` is the same app mounted on its own, for tests and
any ASGI host: its lifespan runs the same runtime (`service.running`) in the host's loop.
"""

import asyncio
import contextlib
import functools
import logging
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any

import uvicorn
from fastapi import APIRouter, FastAPI
from fastapi.responses import JSONResponse

from fleet_events.asyncapi import asyncapi
from fleet_gateway import components, errors, ui
from fleet_gateway.config import GatewaySettings
from fleet_gateway.limits import BodyLimit
from fleet_gateway.routes import audit as audit_routes
from fleet_gateway.routes import auth as auth_routes
from fleet_gateway.routes import daytona as daytona_routes
from fleet_gateway.routes import documents as document_routes
from fleet_gateway.routes import llm_profiles as llm_profile_routes
from fleet_gateway.routes import probes as probe_routes
from fleet_gateway.routes import purge as purge_routes
from fleet_gateway.routes import runtime as runtime_routes
from fleet_gateway.routes import sandboxes as sandbox_routes
from fleet_gateway.routes import session_errors
from fleet_gateway.routes import session_state as session_state_routes
from fleet_gateway.routes import sessions as session_routes
from fleet_gateway.routes import transfer as transfer_routes
from fleet_gateway.routes import turns as turn_routes
from fleet_gateway.routes import ws as ws_routes
from fleet_gateway.slow_clients import with_head_deadline
from fleet_gateway.state import GatewayState
from fleet_mesh import service
from fleet_mesh.settings import BadSetting, load_settings, read_settings

ROUTES: tuple[APIRouter, ...] = (
    auth_routes.router,
    session_routes.router,
    turn_routes.router,
    session_state_routes.router,
    purge_routes.router,
    transfer_routes.router,
    audit_routes.router,
    ws_routes.router,
    document_routes.router,
    runtime_routes.router,
    llm_profile_routes.router,
    llm_profile_routes.roles_router,
    sandbox_routes.router,
    daytona_routes.router,
    probe_routes.router,
)
"""The one route table: every router the gateway serves, in the order they are matched (the
UI's catch-all is mounted after all of them)."""

SERVICE = "gateway"
HTTP_START_S = 10.0
HTTP_GRACE_S = 5

log = logging.getLogger("fleet.gateway")


def _build(state: GatewayState, lifespan: Any = None) -> FastAPI:
    app = FastAPI(title="fleet-rlm gateway", lifespan=lifespan)
    app.state.gateway = state
    errors.install(app)
    session_errors.install(app)
    app.add_middleware(BodyLimit, limit_for=state.body_limit_for)
    for router in ROUTES:
        app.include_router(router)
    state.body_limits.update(transfer_routes.BODY_LIMITS | document_routes.BODY_LIMITS)
    document = asyncapi()  # the catalog is fixed for the life of the process

    @app.get("/asyncapi.json")
    async def bus_document() -> JSONResponse:
        """The bus beside the HTTP API: every verb, event subject and work queue (AsyncAPI 3),
        generated from the same catalog both sides of every request are written against."""
        return JSONResponse(document)

    ui.mount_ui(app, ui.default_dist())  # last: its catch-all must not shadow a route above
    return app


def create_app(
    settings: GatewaySettings | None = None,
    *,
    replica: str | None = None,
    nats_url: str | None = None,
) -> FastAPI:
    """The gateway app on its own: its lifespan runs the gateway's runtime in the host's loop
    (the environment's `MeshSettings`, with `replica` and `nats_url` over them when given)."""
    mesh = load_settings()
    mesh = mesh.model_copy(
        update={
            "replica": replica or mesh.replica_for(SERVICE),
            "nats_url": nats_url or mesh.nats_url,
        }
    )
    state = GatewayState(settings=settings or GatewaySettings(), replica=mesh.replica_for(SERVICE))

    async def attach(ctx: service.ServiceContext) -> None:
        state.nc = ctx.nc
        await components.attach(state, ctx)

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        async with service.running(SERVICE, attach, settings=mesh, log=log):
            yield
        state.nc = None

    return _build(state, lifespan)


class _EmbeddedServer(uvicorn.Server):
    """uvicorn on the runtime's loop, without its signal capture: that swaps the process's
    Python-level handlers for its own while it serves and re-raises the signal once it has
    shut down, which kills the process (exit -15, not 0) whenever that comes after the runtime
    has let go of its handlers. The runtime decides when to stop; a stop hook stops uvicorn."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


async def serve_http(app: FastAPI, settings: GatewaySettings) -> Callable[[], Awaitable[None]]:
    """Start uvicorn and return once it listens; the returned coroutine function stops it."""
    config = uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port,
        log_config=None,
        access_log=False,
        lifespan="off",  # the runtime is the lifespan: nothing to start per app
        timeout_graceful_shutdown=HTTP_GRACE_S,
        ws_per_message_deflate=settings.ws_per_message_deflate,
        http=with_head_deadline(settings.header_timeout_s),
    )
    server = _EmbeddedServer(config)

    async def serve() -> None:
        # uvicorn calls sys.exit when it cannot bind; a SystemExit out of a task escapes the
        # loop itself and skips the runtime's stop, so it becomes an ordinary start failure.
        try:
            await server.serve()
        except SystemExit as exc:
            raise RuntimeError(
                f"HTTP could not start on {settings.host}:{settings.port} (uvicorn exit "
                f"{exc.code}): is the port taken? Set FLEET_GATEWAY_PORT to a free one"
            ) from None

    serving = asyncio.create_task(serve())
    loop = asyncio.get_running_loop()
    deadline = loop.time() + HTTP_START_S
    while not server.started:
        if serving.done():
            await serving  # raises what stopped it, if anything did
            raise RuntimeError(f"HTTP on {settings.host}:{settings.port} ended while starting")
        if loop.time() > deadline:
            serving.cancel()
            raise RuntimeError(
                f"HTTP on {settings.host}:{settings.port} did not start within {HTTP_START_S}s"
            )
        await asyncio.sleep(0.01)

    async def stop() -> None:
        server.should_exit = True
        await serving

    return stop


async def setup(ctx: service.ServiceContext, settings: GatewaySettings) -> None:
    state = GatewayState(settings=settings, replica=ctx.replica, nc=ctx.nc)
    await components.attach(state, ctx)  # its stop hook runs after HTTP's (hooks run reversed)
    ctx.on_stop.append(await serve_http(_build(state), settings))
    ctx.log.info("listening", extra={"host": settings.host, "port": settings.port})


def main() -> None:
    """Serve the gateway until SIGTERM/SIGINT (exit 0), like every service; a bad setting
    ends it at once with the one line that says what to fix (exit 1)."""
    try:
        settings = read_settings(GatewaySettings)
    except BadSetting as exc:
        sys.exit(f"{SERVICE}: {exc}")
    service.run(SERVICE, functools.partial(setup, settings=settings))
