"""What the runtime-surface routes share: the gateway's version, its bus connection, and one
way of saying a bus request's failure in the edge's terms.

Every route that asks a service over the bus (`rpc.call_verb`) has the same three ways to fail:
nobody serves the verb, the service answered with an error, or nobody answered in time. `asking`
turns each into the `ApiError` a client can act on (503, the service's refusal, 504), so the
codes and wording are the same on every route; a route names only what is its own (a 404 for
an id no replica holds, a 409 for a declined request).
"""

import contextlib
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from importlib import metadata
from typing import Any

from fastapi import Request
from nats.errors import NoRespondersError
from pydantic import BaseModel, ConfigDict

from fleet_gateway.errors import ApiError
from fleet_mesh import rpc

MAX_REFUSAL_CHARS = 300
"""A service's refusal text is passed on, cut: it says what was wrong, it is not a log."""


class Strict(BaseModel):
    """Request bodies refuse unknown fields: a misspelt option (`temprature`) or a `tenant` in a
    body is a 422 that names it, never silently dropped and never read
    (tests/unit/gateway/test_strict_bodies.py holds every JSON body to this)."""

    model_config = ConfigDict(extra="forbid")


def version() -> str:
    try:
        return metadata.version("fleet-gateway")
    except metadata.PackageNotFoundError:  # run from a tree without its metadata
        return "0+unknown"


def nats(request: Request) -> Any:
    nc = request.app.state.gateway.nc
    if nc is None or not nc.is_connected:
        raise ApiError(503, "nats_unavailable", "the gateway has no bus connection; retry shortly")
    return nc


@dataclass(frozen=True)
class Peer:
    """A service the gateway asks over the bus, as its error codes and messages name it."""

    code: str
    """Every error code's prefix: `broker` gives `broker_unavailable`, `broker_timeout`."""
    name: str
    """How a message names it: "the sandbox broker"."""
    absent: str
    """What a caller reads when none is running: "no sandbox broker is running"."""


BROKER = Peer("broker", "the sandbox broker", "no sandbox broker is running")
AGENT = Peer("agent", "the agent", "no agent is running to answer")

Refusals = Mapping[str, Callable[[rpc.RemoteError], ApiError]]
"""A service's error code → what the route makes of it (its own 404, 409)."""


def unavailable(peer: Peer) -> ApiError:
    return ApiError(503, f"{peer.code}_unavailable", f"{peer.absent}: start one and retry")


def timed_out(peer: Peer, timeout: float) -> ApiError:
    return ApiError(
        504, f"{peer.code}_timeout", f"{peer.name} did not answer within {timeout}s; retry"
    )


def invalid_request(peer: Peer, exc: rpc.RemoteError) -> ApiError:
    """What the caller sent (a cursor, a name, a size) was refused: the caller's to fix."""
    return ApiError(
        422, "invalid_request",
        f"{peer.name} refused the request: {exc.message[:MAX_REFUSAL_CHARS]}",
    )  # fmt: skip


def refused(peer: Peer, exc: rpc.RemoteError, refusals: Refusals | None = None) -> ApiError:
    """The route's own meaning of the service's code first; then `bad_request` is the caller's
    (422) and anything else is the service's (502, its code under the peer's prefix)."""
    own = (refusals or {}).get(exc.code)
    if own is not None:
        return own(exc)
    if exc.code == "bad_request":
        return invalid_request(peer, exc)
    return ApiError(
        502, f"{peer.code}_{exc.code}",
        f"{peer.name} refused: {exc.message[:MAX_REFUSAL_CHARS]}",
    )  # fmt: skip


@contextlib.contextmanager
def asking(
    peer: Peer,
    timeout: float,
    *,
    refusals: Refusals | None = None,
    no_responders: Callable[[], ApiError] | None = None,
) -> Iterator[None]:
    """Around one bus request: its failure raised as the `ApiError` that says it.
    `no_responders` replaces the 503 where nobody serving the verb means something narrower
    (a request sent to one sandbox's holder: no holder is that sandbox's 404)."""
    try:
        yield
    except NoRespondersError:
        raise (no_responders or (lambda: unavailable(peer)))() from None
    except rpc.RemoteError as exc:
        raise refused(peer, exc, refusals) from None
    except TimeoutError:  # nats' own TimeoutError subclasses the builtin one
        raise timed_out(peer, timeout) from None


async def ask(
    request: Request,
    peer: Peer,
    verb: Any,
    req: Any,
    *,
    timeout: float,
    target: str | None = None,
    refusals: Refusals | None = None,
    no_responders: Callable[[], ApiError] | None = None,
) -> Any:
    """One request to `peer` over the gateway's bus connection, its failures said by `asking`."""
    nc = nats(request)
    with asking(peer, timeout, refusals=refusals, no_responders=no_responders):
        return await rpc.call_verb(nc, verb, req, target=target, timeout=timeout)
