"""Riding through a JetStream leader election.

In a cluster, a stream whose leader's node dies has no leader until its peers elect one
(nats-server's RAFT election timeout is seconds: 4 to 9 s measured on 2.15, docs/deployment.md).
Meanwhile its API requests are not answered (a timeout) or answered "JetStream temporarily
unavailable" (503). A read that may be asked again (a stream's info, a look-up) is asked again
until `within` seconds pass; an append is not retried here (its store has its own rule).
"""

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

from nats.errors import TimeoutError as NatsTimeout
from nats.js.errors import ServiceUnavailableError

T = TypeVar("T")

ELECTION_S = 15.0
"""Longer than an election, so one lost leader never fails a read that waits through it."""


async def through_election(
    read: Callable[[], Awaitable[T]], *, within: float = ELECTION_S, pause: float = 0.25
) -> T:
    """`read()`, asked again while JetStream has no leader to answer it, for up to `within`."""
    deadline = time.monotonic() + within
    while True:
        try:
            return await read()
        except (NatsTimeout, ServiceUnavailableError):
            if time.monotonic() + pause >= deadline:
                raise
        await asyncio.sleep(pause)
