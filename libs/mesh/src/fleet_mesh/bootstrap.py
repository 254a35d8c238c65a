"""Create or update streams, KV buckets and the object store, idempotently.

Never FastStream's `declare=True`, which overwrites a stream's config: here an existing stream
keeps every limit an operator set (max age, max bytes, replicas...) and only the fields our
guarantees depend on (subjects, atomic batches, dedup window, direct get) are brought in line.
"""

import logging
from collections.abc import Mapping
from dataclasses import dataclass, replace

from nacl.public import PublicKey
from nats.js import JetStreamContext
from nats.js.api import (
    AckPolicy,
    ConsumerConfig,
    DeliverPolicy,
    KeyValueConfig,
    ObjectStoreConfig,
    RetentionPolicy,
    StorageType,
    StreamConfig,
)
from nats.js.errors import BucketNotFoundError, NotFoundError

from fleet_events import streams
from fleet_events.streams import ConsumerSpec, KvSpec, ObjectStoreSpec, StreamSpec
from fleet_mesh.runtime_config import seed_from_env, seed_llm_from_env
from fleet_mesh.secrets import public_key_from_env

log = logging.getLogger("fleet.bootstrap")


class BootstrapError(RuntimeError):
    """An existing stream or bucket that cannot be brought in line without losing data."""


@dataclass(frozen=True)
class BootstrapReport:
    created: tuple[str, ...]
    updated: tuple[str, ...]
    unchanged: tuple[str, ...]
    seeded: tuple[str, ...] = ()


def stream_config(spec: StreamSpec, replicas: int) -> StreamConfig:
    return StreamConfig(
        name=spec.name,
        description=spec.description,
        subjects=list(spec.subjects),
        retention=RetentionPolicy.WORK_QUEUE
        if spec.retention == "workqueue"
        else RetentionPolicy.LIMITS,
        storage=StorageType.FILE,
        num_replicas=replicas,
        duplicate_window=spec.duplicate_window_s,
        max_msg_size=spec.max_msg_size,
        allow_direct=True,
        allow_atomic=spec.allow_atomic,
    )


async def _ensure_stream(js: JetStreamContext, spec: StreamSpec, replicas: int) -> str:
    wanted = stream_config(spec, replicas)
    try:
        info = await js.stream_info(spec.name)
    except NotFoundError:
        await js.add_stream(wanted)
        return "created"
    current = info.config
    if current.retention != wanted.retention:
        raise BootstrapError(
            f"stream {spec.name} exists with {current.retention} retention; fleet-rlm needs "
            f"{wanted.retention}. Retention cannot change in place: move its data and delete "
            "the stream, then run the bootstrap again"
        )
    merged = replace(
        current,
        subjects=sorted(set(current.subjects or []) | set(spec.subjects)),
        allow_direct=True,
        allow_atomic=spec.allow_atomic,
        duplicate_window=max(current.duplicate_window or 0, spec.duplicate_window_s),
        description=current.description or spec.description,
    )
    if merged == current:
        return "unchanged"
    await js.update_stream(merged)
    return "updated"


def consumer_config(spec: ConsumerSpec) -> ConsumerConfig:
    return ConsumerConfig(
        name=spec.durable,
        durable_name=spec.durable,
        description=spec.description,
        filter_subject=spec.filter_subject,
        deliver_policy=DeliverPolicy.ALL if spec.deliver == "all" else DeliverPolicy.NEW,
        ack_policy=AckPolicy.EXPLICIT,
        ack_wait=spec.ack_wait_s,
        max_deliver=spec.max_deliver,
        max_ack_pending=spec.max_ack_pending,
    )


async def ensure_consumer(js: JetStreamContext, spec: ConsumerSpec, *, update: bool = False) -> str:
    """Create a shared durable consumer. An existing one keeps its ack deadline and delivery
    bound (the owning service sets those from its settings, `update=True`); its filter and
    explicit acks, which the guarantees depend on, are always brought in line."""
    wanted = consumer_config(spec)
    try:
        info = await js.consumer_info(spec.stream, spec.durable)
    except NotFoundError:
        await js.add_consumer(spec.stream, wanted)
        return "created"
    current = info.config
    if update:
        merged = replace(
            current,
            filter_subject=spec.filter_subject,
            ack_policy=AckPolicy.EXPLICIT,
            ack_wait=spec.ack_wait_s,
            max_deliver=spec.max_deliver,
            max_ack_pending=spec.max_ack_pending,
        )
    else:
        merged = replace(current, filter_subject=spec.filter_subject, ack_policy=AckPolicy.EXPLICIT)
    if merged == current:
        return "unchanged"
    await js.add_consumer(spec.stream, merged)
    return "updated"


async def _ensure_kv(js: JetStreamContext, spec: KvSpec, replicas: int) -> str:
    try:
        await js.key_value(spec.bucket)
        return "unchanged"
    except BucketNotFoundError:
        # no direct gets (`direct` unset): every read goes to the stream's leader, so on a
        # cluster a ticket minted through one gateway is never "unknown" on another
        await js.create_key_value(
            KeyValueConfig(
                bucket=spec.bucket,
                description=spec.description,
                history=spec.history,
                max_value_size=spec.max_value_size,
                ttl=spec.ttl_s,
                storage=StorageType.FILE,
                replicas=replicas,
            )
        )
        return "created"


async def _ensure_object_store(js: JetStreamContext, spec: ObjectStoreSpec, replicas: int) -> str:
    try:
        await js.object_store(spec.bucket)
        return "unchanged"
    except (BucketNotFoundError, NotFoundError):
        await js.create_object_store(
            spec.bucket,
            config=ObjectStoreConfig(
                description=spec.description, storage=StorageType.FILE, replicas=replicas
            ),
        )
        return "created"


async def bootstrap(
    js: JetStreamContext,
    *,
    replicas: int = 1,
    env: Mapping[str, str] | None = None,
    secrets_public_key: PublicKey | None = None,
) -> BootstrapReport:
    """Streams, buckets, then settings and the default LLM profile seeded from `env` (default:
    the process environment) where the config bucket holds no value yet. `FLEET_LLM_API_KEY`
    is sealed with `secrets_public_key` (default: from `FLEET_SECRETS_PUBLIC_KEY` or
    `FLEET_SECRETS_KEY`), so the bootstrap never needs to be able to read a secret."""
    outcome: dict[str, list[str]] = {"created": [], "updated": [], "unchanged": []}
    for spec in streams.STREAMS:
        outcome[await _ensure_stream(js, spec, replicas)].append(f"stream {spec.name}")
    for consumer in streams.CONSUMERS:
        made = await ensure_consumer(js, consumer)
        outcome[made].append(f"consumer {consumer.stream}/{consumer.durable}")
    for kv in streams.KV_BUCKETS:
        outcome[await _ensure_kv(js, kv, replicas)].append(f"kv {kv.bucket}")
    for obj in streams.OBJECT_STORES:
        outcome[await _ensure_object_store(js, obj, replicas)].append(f"object store {obj.bucket}")
    seeded = await seed_from_env(js, env)
    if secrets_public_key is None:
        secrets_public_key = public_key_from_env(env)
    seeded += await seed_llm_from_env(js, env, public_key=secrets_public_key)
    report = BootstrapReport(
        tuple(outcome["created"]),
        tuple(outcome["updated"]),
        tuple(outcome["unchanged"]),
        tuple(seeded),
    )
    log.info(
        "bootstrap done",
        extra={"made": report.created, "brought_in_line": report.updated, "seeded": report.seeded},
    )
    return report


async def _main(argv: list[str] | None = None) -> None:
    import argparse

    from fleet_mesh.connection import connect

    parser = argparse.ArgumentParser(
        prog="python -m fleet_mesh.bootstrap",
        description="Create or update fleet-rlm's streams, KV buckets and object store.",
    )
    parser.add_argument("--url", default=None, help="NATS URL (default: $NATS_URL)")
    parser.add_argument("--replicas", type=int, default=1, help="1 locally, 3 in a cluster")
    args = parser.parse_args(argv)
    nc = await connect(args.url, name="fleet-bootstrap")
    try:
        report = await bootstrap(nc.jetstream(), replicas=args.replicas)
    finally:
        await nc.close()
    for kind in ("created", "updated", "unchanged", "seeded"):
        for item in getattr(report, kind):
            print(f"{kind:9} {item}")


if __name__ == "__main__":
    import asyncio

    asyncio.run(_main())
