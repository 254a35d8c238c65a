"""Listing a KV bucket's keys and a key's history, deterministically.

Why not nats-py's `KeyValue.keys()`, `history()` or a `watch()` read up to its first `None`:
that marker is decided by comparing the consumer's pending count with the messages the client
has *processed*. Under load the server has pushed every message (pending 0) before the client's
callback has run once (processed 0), so the marker comes first and the listing is empty while
the keys exist. It failed CI once (`tests/integration/gateway/test_runtime_profiles.py`: a
profile written a moment before had "no keys"), and the gateway's token and profile listings
used the same marker.

Here an ephemeral *pull* consumer is created and nothing is delivered until we fetch, so its
pending count is exactly what matched when it was created; we fetch until we hold that many.
Keys written after the call began may or may not be included; nothing written before is missed.
"""

import contextlib
from dataclasses import dataclass

from nats.errors import Error as NatsError
from nats.errors import TimeoutError as NatsTimeout
from nats.js import JetStreamContext
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy
from nats.js.errors import NotFoundError, ServiceUnavailableError

from fleet_mesh.store.errors import StoreUnavailable

_OPERATION = "KV-Operation"
_REMOVED = ("DEL", "PURGE")
_BATCH = 256


@dataclass(frozen=True)
class KvEntry:
    key: str
    value: bytes
    revision: int
    deleted: bool
    """A delete or purge marker: the key has no value at this revision."""


async def _scan(
    js: JetStreamContext, bucket: str, key_filter: str, policy: DeliverPolicy, timeout: float
) -> list[KvEntry]:
    stream, prefix = f"KV_{bucket}", f"$KV.{bucket}."
    config = ConsumerConfig(
        deliver_policy=policy,
        ack_policy=AckPolicy.NONE,
        filter_subject=prefix + key_filter,
        inactive_threshold=30.0,  # the server removes it if this process dies mid-scan
        mem_storage=True,
    )
    try:
        created = await js.add_consumer(stream, config)
    except NotFoundError as exc:
        raise StoreUnavailable(f"KV bucket {bucket!r} does not exist: run bootstrap") from exc
    except (ServiceUnavailableError, TimeoutError) as exc:  # JetStream down, or no leader yet
        raise StoreUnavailable(
            f"KV bucket {bucket!r} did not answer (JetStream is down or has no leader)"
        ) from exc
    wanted = created.num_pending or 0  # counted when the consumer was made, before any delivery
    entries: list[KvEntry] = []
    sub = await js.pull_subscribe_bind(created.name, stream=stream)
    try:
        while len(entries) < wanted:
            try:
                msgs = await sub.fetch(min(_BATCH, wanted - len(entries)), timeout=timeout)
            except (TimeoutError, NatsTimeout) as exc:
                if await _drained(sub):
                    break  # the rest expired (a bucket with a TTL) or was purged meanwhile
                raise StoreUnavailable(
                    f"listing {bucket}/{key_filter}: {len(entries)} of {wanted} keys came back "
                    f"within {timeout}s"
                ) from exc
            for msg in msgs:
                operation = (msg.headers or {}).get(_OPERATION, "")
                entries.append(
                    KvEntry(
                        key=msg.subject[len(prefix) :],
                        value=msg.data or b"",
                        revision=msg.metadata.sequence.stream,
                        deleted=operation in _REMOVED,
                    )
                )
    finally:
        await sub.unsubscribe()
        with contextlib.suppress(NotFoundError):
            await js.delete_consumer(stream, created.name)
    return entries


async def _drained(sub: JetStreamContext.PullSubscription) -> bool:
    """Nothing is left for the scan to fetch (False too when the server cannot say)."""
    try:
        return (await sub.consumer_info()).num_pending == 0
    except (NatsError, TimeoutError):
        return False


async def latest(
    js: JetStreamContext, bucket: str, key_filter: str = ">", *, timeout: float = 5.0
) -> list[KvEntry]:
    """Each key matching `key_filter` (NATS wildcards) that has a value now, with that value,
    in stream order (deleted and purged keys are left out)."""
    found = await _scan(js, bucket, key_filter, DeliverPolicy.LAST_PER_SUBJECT, timeout)
    return [entry for entry in found if not entry.deleted]


async def history(
    js: JetStreamContext, bucket: str, key: str, *, timeout: float = 5.0
) -> list[KvEntry]:
    """Every revision the bucket still keeps of `key`, oldest first, delete markers included."""
    return await _scan(js, bucket, key, DeliverPolicy.ALL, timeout)
