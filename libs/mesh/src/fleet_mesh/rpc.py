"""Request/reply over core NATS with typed msgspec bodies and explicit, specific errors.

A reply is either the handler's Struct or an error carried in headers (`Fleet-Error` code,
body = message), so a caller always learns what was wrong, with which value, and what to do.
"""

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import msgspec
import stamina
from cachetools import LRUCache
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.errors import NoRespondersError
from nats.errors import TimeoutError as NatsTimeoutError

from fleet_events.bus import Verb

Req = TypeVar("Req")
Rep = TypeVar("Rep")

ERROR_HEADER = "Fleet-Error"
MAX_REQUEST_BYTES = 1024 * 1024

log = logging.getLogger("fleet.rpc")


class RpcError(Exception):
    """Raised by a handler to answer with a clear error; `code` is a stable word."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


class BadRequest(RpcError):
    def __init__(self, message: str) -> None:
        super().__init__("bad_request", message)


class RemoteError(Exception):
    """What a caller sees when the other side answered with an error."""

    def __init__(self, subject: str, code: str, message: str) -> None:
        super().__init__(f"{subject}: {code}: {message}")
        self.subject = subject
        self.code = code
        self.message = message


_encoder = msgspec.json.Encoder()


class Served:
    """One served subject: its subscription and the requests still being answered.

    nats-py runs a subscription's callback one message at a time, so a slow request (a long
    sandbox execution) would hold up every other. Each request runs in its own task instead,
    at most `concurrency` at once; past that, delivery waits (backpressure, nothing dropped).
    """

    def __init__(self, concurrency: int) -> None:
        self.subscription: Subscription | None = None
        self._slots = asyncio.Semaphore(concurrency)
        self._tasks: set[asyncio.Task[None]] = set()

    async def start(self, work: Awaitable[None]) -> None:
        await self._slots.acquire()
        task = asyncio.ensure_future(work)
        self._tasks.add(task)
        task.add_done_callback(self._done)

    def _done(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        self._slots.release()

    @property
    def in_flight(self) -> int:
        return len(self._tasks)

    async def stop(self, grace: float = 10.0) -> None:
        """Stop taking requests, then let those in flight finish (up to `grace` seconds)."""
        if self.subscription is not None:
            await self.subscription.unsubscribe()
        if self._tasks:
            await asyncio.wait(set(self._tasks), timeout=grace)


async def serve(
    nc: Client,
    subject: str,
    request_type: type[Req],
    handler: Callable[[Req], Awaitable[Any]],
    *,
    queue: str = "",
    max_bytes: int = MAX_REQUEST_BYTES,
    concurrency: int = 64,
) -> Served:
    decoder: msgspec.json.Decoder[Req] = msgspec.json.Decoder(request_type)
    served = Served(concurrency)

    async def on_msg(msg: Msg) -> None:
        if msg.reply:
            await served.start(answer(msg))

    async def answer(msg: Msg) -> None:
        try:
            if len(msg.data) > max_bytes:
                raise BadRequest(
                    f"request of {len(msg.data)} bytes is over the {max_bytes}-byte limit; "
                    "send large inputs as files through the object store"
                )
            try:
                request = decoder.decode(msg.data)
            except (msgspec.DecodeError, msgspec.ValidationError) as exc:
                raise BadRequest(f"malformed {request_type.__name__}: {exc}") from exc
            reply = await handler(request)
            await msg.respond(_encoder.encode(reply))
        except RpcError as exc:
            await nc.publish(msg.reply, exc.message.encode(), headers={ERROR_HEADER: exc.code})
        except Exception as exc:
            log.exception("handler failed", extra={"subject": subject})
            await nc.publish(
                msg.reply,
                f"internal error ({type(exc).__name__}); the request may be retried".encode(),
                headers={ERROR_HEADER: "internal"},
            )

    served.subscription = await nc.subscribe(subject, queue=queue, cb=on_msg)
    return served


async def call(
    nc: Client,
    subject: str,
    request: Any,
    reply_type: type[Rep],
    *,
    timeout: float,
    headers: dict[str, str] | None = None,
) -> Rep:
    """One request; raises `RemoteError` for an error reply and nats' TimeoutError on silence."""
    msg = await nc.request(subject, _encoder.encode(request), timeout=timeout, headers=headers)
    if msg.headers and ERROR_HEADER in msg.headers:
        raise RemoteError(subject, msg.headers[ERROR_HEADER], msg.data.decode(errors="replace"))
    return msgspec.json.decode(msg.data, type=reply_type)


async def serve_verb(
    nc: Client,
    verb: Verb[Req, Rep],
    handler: Callable[[Req], Awaitable[Rep]],
    *,
    target: str | None = None,
    max_bytes: int = MAX_REQUEST_BYTES,
    concurrency: int = 64,
) -> Served:
    """Serve one catalog verb on its subject and in its queue group (see `fleet_events.bus`)."""
    return await serve(
        nc,
        verb.subject(target),
        verb.request,
        handler,
        queue=verb.queue(),
        max_bytes=max_bytes,
        concurrency=concurrency,
    )


async def call_verb(
    nc: Client,
    verb: Verb[Req, Rep],
    request: Req,
    *,
    timeout: float,
    target: str | None = None,
    headers: dict[str, str] | None = None,
) -> Rep:
    """One request to a catalog verb, decoded as the verb's reply type."""
    return await call(
        nc, verb.subject(target), request, verb.reply, timeout=timeout, headers=headers
    )


async def call_verb_retrying(
    nc: Client,
    verb: Verb[Req, Rep],
    request: Req,
    *,
    attempt_timeout: float,
    deadline: float,
    target: str | None = None,
    retry_codes: frozenset[str] = frozenset({"internal", "unavailable"}),
    on_retry: Callable[[int], object] | None = None,
) -> Rep:
    """`call_retrying` for a catalog verb (the same request id on every attempt)."""
    return await call_retrying(
        nc,
        verb.subject(target),
        request,
        verb.reply,
        attempt_timeout=attempt_timeout,
        deadline=deadline,
        retry_codes=retry_codes,
        on_retry=on_retry,
    )


async def call_reaching(
    nc: Client,
    subject: str,
    request: Any,
    reply_type: type[Rep],
    *,
    timeout: float,
    reach_s: float,
    on_retry: Callable[[int], object] | None = None,
) -> Rep:
    """`call`, sent again while "no responders" answers it, for up to `reach_s` (backoff from
    50 ms to 1 s); then that error is raised. Only that answer is resent: it means no one
    received the request, so sending it again never does the work twice, whatever the verb
    (a service reconnecting after a NATS restart holds no subscription for a moment). Silence
    and error replies are final, as with `call`: the request may be under way."""
    give_up = time.monotonic() + reach_s
    wait = 0.05
    attempt = 1
    while True:
        try:
            return await call(nc, subject, request, reply_type, timeout=timeout)
        except NoRespondersError:
            left = give_up - time.monotonic()
            if left <= 0:
                raise
            await asyncio.sleep(min(wait, left))
            wait = min(wait * 2, 1.0)
            attempt += 1
            if on_retry is not None:
                on_retry(attempt)


async def call_verb_reaching(
    nc: Client,
    verb: Verb[Req, Rep],
    request: Req,
    *,
    timeout: float,
    reach_s: float,
    target: str | None = None,
) -> Rep:
    """`call_reaching` for a catalog verb."""
    return await call_reaching(
        nc, verb.subject(target), request, verb.reply, timeout=timeout, reach_s=reach_s
    )


class NoFinalAnswer(TimeoutError):
    """A retried request got no final answer before its overall deadline."""


class _Resend(Exception):
    pass


async def call_retrying(
    nc: Client,
    subject: str,
    request: Any,
    reply_type: type[Rep],
    *,
    attempt_timeout: float,
    deadline: float,
    retry_codes: frozenset[str] = frozenset({"internal", "unavailable"}),
    on_retry: Callable[[int], object] | None = None,
) -> Rep:
    """Resend the *same* request (same `request_id`) until a final answer or `deadline`.

    Silence, "no responders" and the `retry_codes` are worth another attempt (with backoff
    from 50 ms to 1 s): the server side answers a retried id with its original answer, so a
    resend never does the work twice. Any other error is final and raised at once.
    """
    last: BaseException | None = None
    give_up = time.monotonic() + deadline
    try:
        async for attempt in stamina.retry_context(
            on=_Resend, attempts=None, timeout=deadline, wait_initial=0.05, wait_max=1.0
        ):
            with attempt:
                if attempt.num > 1 and on_retry is not None:
                    on_retry(attempt.num)
                remaining = give_up - time.monotonic()
                if remaining <= 0:
                    break
                try:
                    return await call(
                        nc, subject, request, reply_type, timeout=min(attempt_timeout, remaining)
                    )
                except RemoteError as exc:
                    if exc.code not in retry_codes:
                        raise
                    last = exc
                    raise _Resend from exc
                except (NatsTimeoutError, NoRespondersError) as exc:
                    last = exc
                    raise _Resend from exc
    except _Resend:
        pass
    raise NoFinalAnswer(f"{subject}: no final answer within {deadline}s (last: {last!r})")


@dataclass(frozen=True, slots=True)
class Remembered:
    """One answer kept for retries: the digest of the request it answered, and its bytes."""

    digest: str
    payload: bytes
    weight: int = 0
    """What it costs the cache: its key, digest and payload."""


class ReplyCache:
    """Answers by request key, so a retry gets the original answer: bounded by the bytes they
    hold, not their count (one answer can be a megabyte), least recently used out first.

    The encoded answer is kept, not the object: its size is what is bounded, and a retry is
    sent the very bytes the first answer was. An answer bigger than `max_entry_bytes` is not
    kept at all (the request then runs again on a retry)."""

    def __init__(self, max_bytes: int = 64 * 1024 * 1024, max_entry_bytes: int | None = None):
        self.max_bytes = max_bytes
        self.max_entry_bytes = max_bytes // 8 if max_entry_bytes is None else max_entry_bytes
        self._items: LRUCache[str, Remembered] = LRUCache(max_bytes, getsizeof=_weight_of)

    @property
    def size(self) -> int:
        """What the kept answers weigh, keys and digests included."""
        return int(self._items.currsize)

    def __len__(self) -> int:
        return len(self._items)

    def get(self, key: str) -> Remembered | None:
        return self._items.get(key)  # a hit is the most recently used now

    def put(self, key: str, digest: str, payload: bytes) -> bool:
        """Keep an answer; False when it is too big to keep."""
        weight = _weight(key, digest, payload)
        if weight > min(self.max_entry_bytes, self.max_bytes):
            return False
        self._items[key] = Remembered(digest, payload, weight)  # the oldest go to make room
        return True


def _weight_of(item: Remembered) -> int:
    return item.weight


def _weight(key: str, digest: str, payload: bytes) -> int:
    return len(key) + len(digest) + len(payload)
