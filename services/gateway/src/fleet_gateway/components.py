"""What the gateway opens once it is on the bus: the authenticator, the ticket bucket, the
gateway's KV (API tokens, upload allowances), the event store and the one writer to session
logs (`sessionlog.SessionLog`), this replica's read models and their projector. `attach` runs
in both compositions (the process's `setup` and `create_app`'s lifespan), and stops what it
started.
"""

import asyncio
import contextlib
from pathlib import Path

from nats.errors import Error as NatsError
from nats.js.errors import BucketNotFoundError, NotFoundError, ObjectNotFoundError

from fleet_events import streams
from fleet_events.codec import Codec
from fleet_gateway.api_tokens import ApiTokens
from fleet_gateway.auth import Authenticator
from fleet_gateway.errors import ApiError
from fleet_gateway.projections import ProjectionStore, Projector
from fleet_gateway.quotas import UploadQuota
from fleet_gateway.routes.common import version
from fleet_gateway.sessionlog import open_log
from fleet_gateway.sessions.commands import SessionCommands
from fleet_gateway.state import GatewayState
from fleet_gateway.tickets import Tickets
from fleet_gateway.traces import export as otel_export
from fleet_mesh import service
from fleet_mesh.blobs import JetStreamBlobs
from fleet_mesh.store import EventStore, open_store


def projection_path(data_dir: Path | None, replica: str) -> Path | None:
    """One database per replica (each folds the log itself): `<data dir>/projections-<replica>
    .sqlite`; no data dir, an in-memory one rebuilt on every start."""
    if data_dir is None:
        return None
    data_dir.mkdir(parents=True, exist_ok=True)
    return data_dir / f"projections-{replica}.sqlite"


RETRY_S = 1.0
STOP_S = 5.0


async def _open(state: GatewayState, ctx: service.ServiceContext) -> None:
    settings = state.settings
    tickets = Tickets(await ctx.js.key_value(streams.TICKETS.bucket), settings.ticket_ttl_s)
    shared = await ctx.js.key_value(streams.GATEWAY.bucket)
    state.api_tokens = ApiTokens(ctx.js, shared, streams.GATEWAY.bucket)
    state.uploads = UploadQuota(
        shared, settings.tenant_upload_bytes, settings.tenant_upload_window_s
    )
    store = await open_store(ctx.js, streams.SESSIONS)
    blobs = await JetStreamBlobs.open(ctx.js)
    codec = Codec(blobs)
    projections = ProjectionStore(projection_path(settings.data_dir, state.replica))
    state.log = open_log(ctx.nc, store, blobs, codec, state.replica)
    state.commands = SessionCommands(
        state.log, projections.active_turns, settings.tenant_concurrent_turns
    )
    state.tickets, state.store, state.projections = tickets, store, projections
    state.projector = Projector(ctx.nc, store, codec, projections)
    # OTEL_EXPORTER_OTLP_ENDPOINT set: each ended turn's trace is exported (docs/traces.md)
    stop_export = await otel_export.start(
        ctx.js, store, codec, replica=state.replica, version=version()
    )
    if stop_export is not None:
        ctx.on_stop.append(stop_export)
    if state.auth is not None:
        state.auth.api_tokens = state.api_tokens


async def attach(state: GatewayState, ctx: service.ServiceContext) -> None:
    """Open everything and start the projector. On a server not bootstrapped yet (no ticket
    bucket, no stream) the gateway still serves `/health` and `/ready` (which names what is
    missing), its API answers 503 `not_ready`, and it keeps trying every `RETRY_S`."""
    state.auth = Authenticator(state.settings)

    async def life() -> None:
        while True:
            if not ctx.nc.is_connected:  # asking now would only fill the reconnect buffer
                await asyncio.sleep(RETRY_S)
                continue
            try:
                await _open(state, ctx)
                break
            except (BucketNotFoundError, NotFoundError, ObjectNotFoundError) as exc:
                ctx.log.warning("mesh not bootstrapped yet", extra={"missing": type(exc).__name__})
            except (NatsError, TimeoutError) as exc:
                ctx.log.warning("opening the gateway's stores", extra={"error": type(exc).__name__})
            await asyncio.sleep(RETRY_S)
        assert state.projector is not None
        await state.projector.run()

    try:
        await _open(state, ctx)
    except (BucketNotFoundError, NotFoundError, ObjectNotFoundError):
        ctx.log.warning("mesh not bootstrapped yet: the API answers 503 until it is")
    task = asyncio.create_task(life() if state.projector is None else state.projector.run())

    async def stop() -> None:
        if state.projector is not None:
            state.projector.stop()
        await asyncio.wait([task], timeout=STOP_S)
        if not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if state.projections is not None:
            state.projections.close()

    ctx.on_stop.append(stop)


def ready(state: GatewayState) -> tuple[Tickets, EventStore, ProjectionStore]:
    """The handles a route needs, or 503 while the mesh is not bootstrapped."""
    if state.tickets is None or state.store is None or state.projections is None:
        raise ApiError(
            503,
            "not_ready",
            "the gateway is waiting for the mesh's streams and buckets (run the bootstrap: "
            "`python -m fleet_mesh.bootstrap`, which `fleet up` does); see GET /ready",
            headers={"Retry-After": "1"},
        )
    return state.tickets, state.store, state.projections
