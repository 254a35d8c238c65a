"""What `/ready` reports: NATS, every stream, KV bucket and object store, every service's ping,
the sandbox broker's remote providers (Daytona's circuit, read from the broker's ping), and the
embedded model (`llm`) when `fleet up` runs one: its state from the config bucket (installing,
building, loading, up with its speed, failed) and, when up, whether its server answers.

All probes run concurrently, each under its own short deadline, so a dead service costs one
timeout and cannot hold the answer hostage. A provider whose circuit is open is `degraded`:
named in `degraded` and in its component, while `ready` stays what the mesh is (sandbox calls
to it fail fast with `unavailable`; tenants on other providers are served). The embedded model
installing (the first `fleet up` on a machine) is `starting`, with how long it still needs:
named in `starting`, while `ready` stays true (the mesh serves; model calls wait for it).
"""

import asyncio
import ipaddress
import time
from collections.abc import Awaitable
from typing import Any, Literal
from urllib.parse import urlsplit

import httpx
from nats.aio.client import Client
from nats.errors import Error as NatsError
from nats.errors import NoRespondersError
from nats.js.errors import KeyNotFoundError, NotFoundError
from pydantic import BaseModel

from fleet_events import bus, streams
from fleet_events.bus import Ping
from fleet_events.llm import LOCAL_MODEL_KEY, STARTING, decode_local_state, local_state_line
from fleet_mesh import rpc
from fleet_mesh.connection import server_address

State = Literal["up", "down", "degraded", "starting"]
"""`starting`: on its way up and not needed yet (the embedded model installing: the mesh serves,
model calls wait for it); it does not make the mesh unready."""
Kind = Literal["nats", "stream", "kv", "object_store", "service", "provider", "llm"]
BROKER = "sandbox-broker"
REMOTE_PROVIDERS = ("daytona",)  # providers whose health the broker's ping carries


class Component(BaseModel):
    name: str
    kind: Kind
    state: State
    detail: str = ""
    replica: str | None = None
    latency_ms: float | None = None


class Readiness(BaseModel):
    ready: bool
    components: list[Component]
    degraded: list[str] = []
    """Components that answer but fail fast (a provider's open circuit)."""
    starting: list[str] = []
    """Components on their way up (the embedded model installing, with how long it needs)."""


def _stores() -> list[tuple[str, Kind, str]]:
    """(name shown, kind, the JetStream stream that backs it)."""
    found: list[tuple[str, Kind, str]] = [(s.name, "stream", s.name) for s in streams.STREAMS]
    found += [(kv.bucket, "kv", f"KV_{kv.bucket}") for kv in streams.KV_BUCKETS]
    found += [(obj.bucket, "object_store", f"OBJ_{obj.bucket}") for obj in streams.OBJECT_STORES]
    return found


async def _store(nc: Client, name: str, kind: Kind, stream: str, timeout: float) -> Component:
    try:
        await nc.jetstream(timeout=timeout).stream_info(stream)
    except NotFoundError:
        return Component(name=name, kind=kind, state="down", detail="missing: run the bootstrap")
    except (TimeoutError, NatsError) as exc:  # includes timeouts and a reconnecting client
        return Component(name=name, kind=kind, state="down", detail=type(exc).__name__)
    return Component(name=name, kind=kind, state="up")


async def _service(
    nc: Client, service: str, timeout: float, details: dict[str, Any] | None = None
) -> Component:
    """One service's ping; `details` (when given) gets what the pong carried."""
    started = time.perf_counter()
    try:
        pong = await rpc.call_verb(nc, bus.ping(service), Ping(), timeout=timeout)
    except NoRespondersError:
        return Component(name=service, kind="service", state="down", detail="no replica running")
    except TimeoutError:  # nats' own TimeoutError subclasses the builtin one
        return Component(
            name=service, kind="service", state="down", detail=f"no answer within {timeout}s"
        )
    except (rpc.RemoteError, NatsError) as exc:
        return Component(name=service, kind="service", state="down", detail=str(exc))
    if details is not None:
        details.update(pong.details)
    return Component(
        name=service,
        kind="service",
        state="up",
        replica=pong.replica,
        latency_ms=round((time.perf_counter() - started) * 1000, 2),
    )


def _providers(details: dict[str, Any]) -> list[Component]:
    """The broker's remote providers as it reported them (`ok`, `checks`, `guidance`,
    `latency_ms`: the circuit's health); none when the broker has no such provider."""
    found = []
    for name in REMOTE_PROVIDERS:
        health = details.get(name)
        if not isinstance(health, dict):
            continue
        ok = health.get("ok") is True
        latency = health.get("latency_ms")
        found.append(
            Component(
                name=name,
                kind="provider",
                state="up" if ok else "degraded",
                detail="circuit closed" if ok else str(health.get("guidance", "")),
                latency_ms=round(latency, 2) if isinstance(latency, int | float) else None,
            )
        )
    return found


async def _local_model(nc: Client, timeout: float) -> Component | None:
    """The embedded model, or None when this mesh runs none (no state stored)."""
    try:
        kv = await nc.jetstream(timeout=timeout).key_value(streams.CONFIG.bucket)
        entry = await kv.get(LOCAL_MODEL_KEY)
    except KeyNotFoundError:
        return None
    except (TimeoutError, NatsError) as exc:
        return Component(name="llm", kind="llm", state="down", detail=type(exc).__name__)
    state = decode_local_state(entry.value or b"")
    if state is None:
        return Component(name="llm", kind="llm", state="down", detail="its state is unreadable")
    line = local_state_line(state)
    if state.state in STARTING:
        return Component(name="llm", kind="llm", state="starting", detail=line)
    if state.state != "up":
        detail = f"{line}; {state.advice}" if state.advice else line
        return Component(name="llm", kind="llm", state="down", detail=detail)
    started = time.perf_counter()
    if not await _answers(state.api_base or "", timeout):
        return Component(
            name="llm", kind="llm", state="down",
            detail=f"{line}; but its server does not answer now (fleet up restarts it: see "
            "logs/llm.log)",
        )  # fmt: skip
    latency = round((time.perf_counter() - started) * 1000, 2)
    return Component(name="llm", kind="llm", state="up", detail=line, latency_ms=latency)


async def _answers(api_base: str, timeout: float) -> bool:
    """Any HTTP answer from `/models` (a 401 too: the server enforces its key); loopback only,
    the only place `fleet up` serves it."""
    try:
        if not ipaddress.ip_address(urlsplit(api_base).hostname or "").is_loopback:
            return False
    except ValueError:
        return False
    try:
        async with httpx.AsyncClient(timeout=timeout) as client:
            await client.get(f"{api_base.rstrip('/')}/models")
    except httpx.HTTPError:
        return False
    return True


def _nats(nc: Client | None) -> Component:
    if nc is None or not nc.is_connected:
        return Component(name="nats", kind="nats", state="down", detail="not connected")
    version = nc.connected_server_version
    url = server_address(nc)  # never the URL: it may carry credentials
    return Component(
        name="nats",
        kind="nats",
        state="up",
        detail=f"server {version.major}.{version.minor}.{version.patch} at {url}",
    )


async def check(nc: Client | None, services: tuple[str, ...], timeout: float) -> Readiness:
    nats = _nats(nc)
    if nc is None or nats.state == "down":
        others = [
            Component(name=name, kind=kind, state="down", detail="nats down")
            for name, kind, _ in _stores()
        ]
        others += [
            Component(name=s, kind="service", state="down", detail="nats down") for s in services
        ]
        return Readiness(ready=False, components=[nats, *others])
    probes: list[Awaitable[Component]] = [
        _store(nc, name, kind, stream, timeout) for name, kind, stream in _stores()
    ]
    broker: dict[str, Any] = {}
    probes += [
        _service(nc, service, timeout, broker if service == BROKER else None)
        for service in services
    ]
    results, model = await asyncio.gather(asyncio.gather(*probes), _local_model(nc, timeout))
    components = [nats, *results, *_providers(broker), *([model] if model else [])]
    return Readiness(
        ready=all(c.state != "down" for c in components),
        components=components,
        degraded=[c.name for c in components if c.state == "degraded"],
        starting=[c.name for c in components if c.state == "starting"],
    )
