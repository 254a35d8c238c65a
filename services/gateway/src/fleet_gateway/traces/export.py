"""Live OTLP export: with `OTEL_EXPORTER_OTLP_ENDPOINT` (or `..._TRACES_ENDPOINT`) set, each
turn's trace is POSTed to the collector (OTLP/HTTP, protobuf unless `OTEL_EXPORTER_OTLP_
PROTOCOL` is `http/json`) as soon as the turn ends.

Which process exports: the gateways, through one durable pull consumer (`gateway-otel-export`)
on the session logs that every replica binds to, so each ended turn is exported by exactly one
replica, and a turn that ends while no gateway runs is exported when one starts. A message is
acked only once the collector answered 2xx; a refusal or an unreachable collector is retried
with a growing delay (`MAX_DELIVER` tries, then logged as dropped). The ids are derived from
the log, so a retried export (or a later `trace-export` of the same turn) repeats the same
trace and span ids and a viewer shows one trace, not two.
"""

import asyncio
import contextlib
import logging
import os
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import httpx
from nats.aio.msg import Msg
from nats.errors import TimeoutError as NatsTimeout
from nats.js import JetStreamContext
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

from fleet_events import streams
from fleet_events.binding import subject_tenant
from fleet_events.chain import TYPE_HEADER
from fleet_events.codec import Codec, CodecError
from fleet_events.envelope import Event
from fleet_events.session import TurnCancelled, TurnCompleted, TurnFailed
from fleet_gateway.traces import otlp, reading
from fleet_gateway.traces.tree import build
from fleet_mesh.store import EventStore, StoreError

log = logging.getLogger("fleet.gateway.otel")

DURABLE = "gateway-otel-export"
LOGS = "fleet.session.*.*.log"
MAX_DELIVER = 8
ACK_WAIT_S = 60.0
FETCH = 32
POST_TIMEOUT_S = 10.0


def _tag(kind: type[Event]) -> str:
    return str(kind.__struct_config__.tag)


ENDED = frozenset(_tag(kind) for kind in (TurnCompleted, TurnFailed, TurnCancelled))


PROTOCOLS = ("http/protobuf", "http/json")


@dataclass(frozen=True)
class OtlpTarget:
    url: str
    headers: dict[str, str]
    protocol: str = "http/protobuf"

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> "OtlpTarget | None":
        """OpenTelemetry's own variables: the traces endpoint as is, or the base endpoint plus
        `/v1/traces`; `OTEL_EXPORTER_OTLP_HEADERS` as `k=v,k2=v2`; `..._PROTOCOL`
        `http/protobuf` (the default, as OpenTelemetry's) or `http/json`. Neither endpoint
        set: no export. Another protocol (`grpc`) is refused, naming the allowed ones."""
        env = os.environ if env is None else env
        url = env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "").strip()
        if not url:
            base = env.get("OTEL_EXPORTER_OTLP_ENDPOINT", "").strip()
            if not base:
                return None
            url = base.rstrip("/") + "/v1/traces"
        headers = {}
        raw = env.get("OTEL_EXPORTER_OTLP_TRACES_HEADERS") or env.get(
            "OTEL_EXPORTER_OTLP_HEADERS", ""
        )
        for pair in raw.split(","):
            key, _, value = pair.partition("=")
            if key.strip() and value.strip():
                headers[key.strip()] = value.strip()
        protocol = (
            env.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
            or env.get("OTEL_EXPORTER_OTLP_PROTOCOL")
            or "http/protobuf"
        ).strip()
        if protocol not in PROTOCOLS:
            raise ValueError(
                f"OTEL_EXPORTER_OTLP_PROTOCOL {protocol!r} is not served by the gateway's trace "
                f"export: use one of {', '.join(PROTOCOLS)} (gRPC is not)"
            )
        return cls(url=url, headers=headers, protocol=protocol)

    @property
    def shown(self) -> str:
        """The URL as logs show it: no user, password or query (a token may ride in any)."""
        parts = urlsplit(self.url)
        host = parts.hostname or ""
        port = f":{parts.port}" if parts.port else ""
        return f"{parts.scheme}://{host}{port}{parts.path}"


class ExportFailed(Exception):
    pass


class LiveExporter:
    def __init__(
        self,
        js: JetStreamContext,
        store: EventStore,
        codec: Codec,
        target: OtlpTarget,
        *,
        replica: str,
        version: str,
    ) -> None:
        self._js, self._store, self._codec, self._target = js, store, codec, target
        self._replica, self._version = replica, version
        self.stopping = asyncio.Event()
        self.exported = 0
        # a session's next ended turn reads only what was stored since (its own cache: the
        # routes' is the app's, and the exporter runs without one)
        self._sessions = reading.SessionCache(max_events=20_000)

    async def _subscription(self) -> Any:
        config = ConsumerConfig(
            durable_name=DURABLE,
            filter_subject=LOGS,
            deliver_policy=DeliverPolicy.NEW,
            ack_policy=AckPolicy.EXPLICIT,
            ack_wait=ACK_WAIT_S,
            max_deliver=MAX_DELIVER,
        )
        # creating an existing durable with the same config is a no-op: every replica may ask
        await self._js.add_consumer(streams.SESSIONS.name, config)
        return await self._js.pull_subscribe_bind(DURABLE, stream=streams.SESSIONS.name)

    async def run(self) -> None:
        sub = await self._subscription()
        try:
            async with httpx.AsyncClient(timeout=POST_TIMEOUT_S) as client:
                while not self.stopping.is_set():
                    try:
                        messages = await sub.fetch(FETCH, timeout=1.0)
                    except (TimeoutError, NatsTimeout):
                        continue
                    for msg in messages:
                        await self._handle(client, msg)
        finally:  # a pull subscription left open holds the connection's drain to its timeout
            with contextlib.suppress(Exception):
                await sub.unsubscribe()

    def stop(self) -> None:
        self.stopping.set()

    async def _handle(self, client: httpx.AsyncClient, msg: Msg) -> None:
        if (msg.headers or {}).get(TYPE_HEADER, "") not in ENDED:
            await msg.ack()
            return
        try:
            await self.export_turn(client, msg.data, msg.subject)
        except (ExportFailed, StoreError, CodecError, httpx.HTTPError) as exc:
            # an HTTP client error may quote the URL, credentials and all: only its kind
            error = str(exc)[:300] if isinstance(exc, ExportFailed) else type(exc).__name__
            tries = msg.metadata.num_delivered
            if tries >= MAX_DELIVER:
                log.error(
                    "trace not exported; giving up",
                    extra={"subject": msg.subject, "tries": tries, "error": error},
                )
                await msg.term()
                return
            log.warning(
                "trace export failed; will retry",
                extra={"subject": msg.subject, "tries": tries, "error": error},
            )
            await msg.nak(delay=min(30.0, 0.5 * 2**tries))
            return
        await msg.ack()

    async def export_turn(self, client: httpx.AsyncClient, data: bytes, subject: str) -> None:
        tenant = subject_tenant(subject)
        envelope = await self._codec.decode(data, tenant=tenant)
        session, turn = envelope.session, envelope.turn
        if tenant is None or session is None or turn is None:
            return
        events = await self._sessions.events(self._store, self._codec, tenant, session)
        trace = build(tenant, session, turn, reading.by_turn(events).get(turn, []))
        body = otlp.export_request([trace], service_version=self._version, replica=self._replica)
        headers = {**self._target.headers, "User-Agent": f"fleet-rlm-gateway/{self._version}"}
        if self._target.protocol == "http/json":
            response = await client.post(self._target.url, json=body, headers=headers)
        else:
            headers["Content-Type"] = "application/x-protobuf"
            content = otlp.protobuf(body)
            response = await client.post(self._target.url, content=content, headers=headers)
        if response.status_code // 100 != 2:
            raise ExportFailed(f"{self._target.shown} answered {response.status_code}")
        self.exported += 1


async def start(
    js: JetStreamContext, store: EventStore, codec: Codec, *, replica: str, version: str
) -> Callable[[], Awaitable[None]] | None:
    """Start the exporter when the environment names a collector; the coroutine function it
    returns stops it. None: no collector configured, nothing started."""
    try:
        target = OtlpTarget.from_env()
    except ValueError as exc:  # telemetry misconfigured: said loudly, the gateway serves on
        log.error("trace export is off", extra={"problem": str(exc)})
        return None
    if target is None:
        return None
    exporter = LiveExporter(js, store, codec, target, replica=replica, version=version)
    task = asyncio.create_task(_supervised(exporter))
    log.info("exporting traces live", extra={"url": target.shown})

    async def stop() -> None:
        exporter.stop()
        await asyncio.wait([task], timeout=5.0)
        if not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    return stop


async def _supervised(exporter: LiveExporter) -> None:
    """A lost connection or a consumer gone with a server restart: bind again after a pause."""
    while not exporter.stopping.is_set():
        try:
            await exporter.run()
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # logged, then retried: the exporter must not die
            log.warning("trace exporter restarting", extra={"error": type(exc).__name__})
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(exporter.stopping.wait(), timeout=2.0)
