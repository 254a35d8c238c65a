"""Composition root of the sandbox broker, built the same way in tests."""

import asyncio
from collections.abc import Callable
from typing import Any

from fleet_events import streams
from fleet_events.codec import Codec
from fleet_mesh import service
from fleet_mesh.blobs import JetStreamBlobs
from fleet_mesh.runtime_config import RuntimeConfig
from fleet_mesh.store import EventStore
from fleet_sandbox_broker import lifecycle
from fleet_sandbox_broker.broker import Broker
from fleet_sandbox_broker.config import BrokerSettings
from fleet_sandbox_broker.providers.base import Provider
from fleet_sandbox_broker.providers.local import LocalProvider, LocalSettings
from fleet_sandbox_broker.providers.uids import sweep_orphans
from fleet_sandbox_broker.subscribers import Routes
from fleet_sandbox_broker.view import SandboxesView


async def setup(ctx: service.ServiceContext, settings: BrokerSettings | None = None) -> Broker:
    settings = settings or BrokerSettings()
    providers = await _providers(ctx, settings)
    provider = providers[settings.provider]  # the warm pool's
    blobs = await JetStreamBlobs.open(ctx.js)
    store = EventStore(ctx.js, streams.SANDBOXES, Codec(blobs))
    config = await RuntimeConfig.open(ctx.js)
    sessions = EventStore(ctx.js, streams.SESSIONS, Codec(blobs))
    # caught up with the log before serving: list and the quota answer from it
    view = SandboxesView(ctx.js, Codec(blobs))
    await view.start()
    broker = Broker(ctx, provider, store, blobs, settings, config, view, sessions, providers)
    routes = Routes(
        ctx, broker, max_request=settings.max_request_bytes, max_reply=settings.max_reply_bytes,
        cache_bytes=settings.reply_cache_bytes,
    )  # fmt: skip
    await routes.start()
    reconciling = asyncio.create_task(lifecycle.reconcile_until_done(broker), name="reconcile")
    broker.pool.start()

    async def stop() -> None:
        reconciling.cancel()
        await broker.close()
        for each in providers.values():
            await each.close()

    ctx.on_stop.append(stop)
    # a provider with a remote service says how it is doing (Daytona's circuit), so a
    # degraded Daytona shows on every ping (and `/ready`) instead of as hung turns
    health: dict[str, Callable[[], dict[str, object]]] = {
        name: found for name, each in providers.items()
        if (found := getattr(each, "health", None)) is not None
    }  # fmt: skip

    def details() -> dict[str, Any]:
        found: dict[str, Any] = {
            "sandboxes": len(broker.held), "warm": broker.pool.ready,
            # a take shows here for good, where `warm` may be refilled before anyone looks
            "warm_started": broker.pool.refills,
            "providers": sorted(providers),
        }  # fmt: skip
        for name, report in health.items():
            found[name] = report()
        return found

    ctx.ping_details = details
    return broker


async def _providers(ctx: service.ServiceContext, settings: BrokerSettings) -> dict[str, Provider]:
    """Every provider this broker can start sandboxes on: `local`, and `daytona` when Daytona
    is configured (the SDK is not even imported otherwise: it reads `.env` and raises without
    a key at construction). A tenant's `sandbox_provider` setting picks one per create."""
    built: dict[str, Provider] = {}
    if settings.local:
        built["local"] = await _local(ctx, settings)
    if settings.daytona_configured:
        built["daytona"] = _daytona(ctx, settings)
    return built


def _daytona(ctx: service.ServiceContext, settings: BrokerSettings) -> Provider:
    from fleet_sandbox_broker.providers.daytona.provider import (
        DaytonaProvider,
        DaytonaSettings,
    )

    key = settings.daytona_api_key
    if key is None:  # daytona_configured says there is one; mypy cannot know
        raise RuntimeError("the daytona provider needs DAYTONA_API_KEY")
    return DaytonaProvider(
        DaytonaSettings(
            api_key=key.get_secret_value(),
            api_url=settings.daytona_api_url,
            target=settings.daytona_target,
            replica=ctx.replica,
            snapshot=settings.daytona_snapshot,
            image=settings.daytona_image,
            cpu=settings.daytona_cpu,
            disk_gb=settings.daytona_disk_gb,
            vm=settings.daytona_snapshot_is_vm,
            network_block_all=settings.daytona_network_block_all,
            deadline_s=settings.daytona_deadline_s,
            circuit_cool_s=settings.daytona_circuit_cool_s,
            max_tool_calls=settings.max_tool_calls,
            host_wait_s=settings.callback_timeout_s,
        )
    )


async def _local(ctx: service.ServiceContext, settings: BrokerSettings) -> Provider:
    swept = await asyncio.to_thread(
        sweep_orphans, settings.uid_locks, settings.uid_base, settings.uid_count
    )
    if swept:
        ctx.log.warning("killed processes left by a dead broker", extra={"uids": swept})
    local = LocalProvider(
        LocalSettings(
            root=settings.root,
            python=settings.python,
            uid_base=settings.uid_base,
            uid_count=settings.uid_count,
            max_frame=settings.max_frame_bytes,
            output_cap=settings.output_cap_chars,
            show=settings.show,
            hide=settings.hide,
            uid_locks=settings.uid_locks,
            max_tool_calls=settings.max_tool_calls,
            max_inodes=settings.max_inodes,
            inode_check_s=settings.inode_check_s,
            family_max=settings.family_max,
            task_cgroup=settings.task_cgroup,
            host_tasks=settings.host_tasks,
            family_disk_mb=settings.family_disk_mb,
            tenant_tasks=settings.tenant_tasks,
            disk_check_s=settings.disk_check_s,
        )
    )
    if not local.disks.on:
        ctx.log.warning(
            "no disk quota on sandboxes: a workspace is bounded by its inode count and the "
            "size of each file only",
            extra={"why": local.disks.why},
        )
    if local.tasks.procs is None:
        ctx.log.warning(
            "no host-wide bound on sandbox tasks: each fork family is bounded by its own "
            "process limit only",
            extra={"why": local.tasks.why},
        )
    return local


async def _setup(ctx: service.ServiceContext) -> None:
    await setup(ctx)


def main() -> None:
    service.run("sandbox-broker", _setup)
