"""Request/reply: typed bodies, clear errors, nothing reaches a handler that should not."""

import asyncio

import msgspec
import pytest
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.errors import NoRespondersError
from nats.errors import TimeoutError as NatsTimeout

from fleet_events import new_id
from fleet_mesh import rpc


class Add(msgspec.Struct, frozen=True, kw_only=True):
    request_id: str
    a: int
    b: int


class Sum(msgspec.Struct, frozen=True, kw_only=True):
    total: int


async def test_typed_request_reply_and_specific_errors(nc: Client) -> None:
    subject = f"fleet.rpc.quality.{new_id()}"
    seen: list[Add] = []

    async def handler(request: Add) -> Sum:
        seen.append(request)
        if request.a < 0:
            raise rpc.BadRequest(f"a must be >= 0, got {request.a}: send a non-negative number")
        if request.a == 13:
            raise RuntimeError("unlucky")
        return Sum(total=request.a + request.b)

    await rpc.serve(nc, subject, Add, handler, queue="q", max_bytes=1000)

    assert await rpc.call(nc, subject, Add(request_id="r", a=2, b=3), Sum, timeout=2) == Sum(
        total=5
    )

    with pytest.raises(rpc.RemoteError) as refused:
        await rpc.call(nc, subject, Add(request_id="r", a=-1, b=3), Sum, timeout=2)
    assert refused.value.code == "bad_request"
    assert "a must be >= 0, got -1" in refused.value.message

    with pytest.raises(rpc.RemoteError) as malformed:
        await rpc.call(nc, subject, {"request_id": "r", "a": "two", "b": 3}, Sum, timeout=2)
    assert malformed.value.code == "bad_request"
    assert "Expected `int`, got `str` - at `$.a`" in malformed.value.message

    with pytest.raises(rpc.RemoteError) as oversized:
        await rpc.call(nc, subject, {"request_id": "x" * 2000, "a": 1, "b": 1}, Sum, timeout=2)
    assert "over the 1000-byte limit" in oversized.value.message

    with pytest.raises(rpc.RemoteError) as internal:
        await rpc.call(nc, subject, Add(request_id="r", a=13, b=0), Sum, timeout=2)
    assert internal.value.code == "internal"
    assert "unlucky" not in internal.value.message  # internals are logged, not returned

    assert [r.a for r in seen] == [2, -1, 13]  # malformed and oversized never reached it


def test_reply_cache_keeps_the_latest_answers() -> None:
    cache = rpc.ReplyCache(max_bytes=30, max_entry_bytes=30)
    for key in "abc":
        assert cache.put(key, "d", b"x" * 8)  # 10 bytes each, key and digest included
    assert cache.get("a") is not None  # now the most recently used
    cache.put("d", "d", b"x" * 8)
    assert cache.get("b") is None
    assert [cache.get(k) is not None for k in "acd"] == [True, True, True]


async def test_a_slow_request_does_not_hold_up_the_others(nc: Client) -> None:
    subject = f"fleet.rpc.quality.{new_id()}"
    release = asyncio.Event()

    async def handler(request: Add) -> Sum:
        if request.a == 0:
            await release.wait()
        return Sum(total=request.a + request.b)

    served = await rpc.serve(nc, subject, Add, handler, queue="q")
    slow = asyncio.create_task(rpc.call(nc, subject, Add(request_id="s", a=0, b=1), Sum, timeout=5))
    fast = await rpc.call(nc, subject, Add(request_id="f", a=2, b=2), Sum, timeout=5)
    assert fast == Sum(total=4)
    assert not slow.done()
    assert served.in_flight == 1
    release.set()
    assert await slow == Sum(total=1)
    await served.stop()
    assert served.in_flight == 0


async def test_a_retried_call_resends_the_same_request_until_a_final_answer(nc: Client) -> None:
    subject = f"fleet.rpc.quality.{new_id()}"
    answers: dict[str, Sum] = {}
    attempts: list[str] = []

    async def flaky(request: Add) -> Sum:
        attempts.append(request.request_id)
        if len(attempts) < 3:
            raise rpc.RpcError("unavailable", "busy: retry the same request")
        return answers.setdefault(request.request_id, Sum(total=request.a + request.b))

    await rpc.serve(nc, subject, Add, flaky)
    retries: list[int] = []
    reply = await rpc.call_retrying(
        nc,
        subject,
        Add(request_id="r1", a=1, b=2),
        Sum,
        attempt_timeout=1,
        deadline=10,
        on_retry=retries.append,
    )
    assert reply == Sum(total=3)
    assert attempts == ["r1", "r1", "r1"]
    assert retries == [2, 3]

    async def refuse(request: Add) -> Sum:
        raise rpc.BadRequest("a is wrong")

    other = f"fleet.rpc.quality.{new_id()}"
    await rpc.serve(nc, other, Add, refuse)
    with pytest.raises(rpc.RemoteError, match="a is wrong"):  # final: not retried
        await rpc.call_retrying(
            nc, other, Add(request_id="r2", a=1, b=2), Sum, attempt_timeout=1, deadline=10
        )
    with pytest.raises(rpc.NoFinalAnswer, match=r"no final answer within 0\.5s"):
        await rpc.call_retrying(
            nc,
            f"fleet.rpc.quality.{new_id()}",
            Add(request_id="r3", a=1, b=2),
            Sum,
            attempt_timeout=0.1,
            deadline=0.5,
        )


async def test_a_reaching_call_resends_only_while_no_one_subscribes(nc: Client) -> None:
    """Issue 29: after a NATS restart the agent reconnects before the broker has subscribed
    again, and a cell sent in that moment met "no responders" and failed its turn. Resent,
    it reaches the service once that subscribes; silence is final (the request may be under
    way), and a subject no one ever serves still fails, after `reach_s`."""
    subject = f"fleet.rpc.quality.{new_id()}"
    seen: list[str] = []

    async def add(request: Add) -> Sum:
        seen.append(request.request_id)
        return Sum(total=request.a + request.b)

    pending: list[asyncio.Task[object]] = []
    retries: list[int] = []

    def on_retry(attempt: int) -> None:
        retries.append(attempt)
        if attempt == 3:  # two "no responders" answers, then the service is back
            pending.append(asyncio.ensure_future(rpc.serve(nc, subject, Add, add)))

    served = asyncio.ensure_future(
        rpc.call_reaching(
            nc, subject, Add(request_id="r1", a=2, b=5), Sum, timeout=2, reach_s=30,
            on_retry=on_retry,
        )
    )  # fmt: skip
    assert await served == Sum(total=7)
    await asyncio.gather(*pending)
    assert seen == ["r1"]
    assert retries[:2] == [2, 3]

    silent = f"fleet.rpc.quality.{new_id()}"
    heard: list[str] = []

    async def hear(msg: Msg) -> None:
        heard.append(msg.subject)

    await nc.subscribe(silent, cb=hear)
    with pytest.raises(NatsTimeout):
        await rpc.call_reaching(
            nc, silent, Add(request_id="r2", a=1, b=1), Sum, timeout=0.3, reach_s=30
        )
    assert heard == [silent]  # sent once: silence is not resent

    with pytest.raises(NoRespondersError):
        await rpc.call_reaching(
            nc, f"fleet.rpc.quality.{new_id()}", Add(request_id="r3", a=1, b=1), Sum,
            timeout=2, reach_s=0.3,
        )  # fmt: skip
