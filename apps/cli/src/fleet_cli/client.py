"""The CLI's only way into a mesh: the gateway's HTTP routes and its WebSocket, never the bus,
so `fleet run` against a remote mesh behaves exactly as against the local one."""

import asyncio
import json
import os
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import httpx
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidURI

from fleet_cli.errors import ClientError
from fleet_cli.localmesh import gateway_url, mint_token, recorded_gateway
from fleet_cli.mesh import gateway_dir
from fleet_events import new_id

MODES = ("auto", "rlm_only", "tools_only")
# The turn's last event says how it ended; the CLI's exit status says the same to a script.
ENDINGS = {
    "turn.completed": "completed",
    "turn.failed": "failed",
    "turn.cancelled": "cancelled",
    "turn.refused": "refused",
}


@dataclass(frozen=True)
class Target:
    url: str
    token: str
    source: str  # where url and token came from, for messages that must say so

    @property
    def ws_url(self) -> str:
        return "ws" + self.url.removeprefix("http")


def find_target(data_dir: Path, env: Mapping[str, str] | None = None) -> Target:
    """`FLEET_URL` / `FLEET_TOKEN` win; else the mesh `fleet up` runs from `data_dir` (none
    running is `NoMesh`: no address is guessed). A token is only minted from a signing secret
    the gateway already made: minting one here would create a secret no running gateway
    shares, and every request would be a puzzling 401."""
    env = os.environ if env is None else env
    recorded = recorded_gateway(data_dir)
    url = env.get("FLEET_URL") or gateway_url(data_dir, None)
    token = env.get("FLEET_TOKEN", "")
    source = "FLEET_URL" if env.get("FLEET_URL") else f"{data_dir}/up.json"
    if not token:
        if recorded is None or url.rstrip("/") != recorded.rstrip("/"):
            # the local mesh's development token (an admin's, 30 days) goes to that mesh only
            raise ClientError(
                f"{url.rstrip('/')} is not the gateway of the mesh running from {data_dir} "
                + ("(none is running: no up.json)" if recorded is None else f"({recorded})")
                + ": set FLEET_TOKEN to a token that gateway accepts, or start the local mesh "
                "with `fleet up` (its development token is never sent to another address)"
            )
        token = mint_token(data_dir)
        source += f" and the development token of {gateway_dir(data_dir)}"
    return Target(url.rstrip("/"), token, source)


UNAVAILABLE_S = 30.0
"""How long a request answered 503 with `Retry-After` is asked again (longer than a JetStream
leader election: seconds)."""


def _retry_after(response: httpx.Response) -> float | None:
    """Seconds to wait before asking again (at most 5 s), for a 503 `store_unavailable` that
    says when: the transient one. Else None (a `not_ready` mesh is not waited on)."""
    if response.status_code != 503:
        return None
    try:
        if response.json().get("code") != "store_unavailable":
            return None
        return min(5.0, max(0.1, float(response.headers["Retry-After"])))
    except (KeyError, ValueError, AttributeError):
        return None


def _problem(response: httpx.Response) -> str:
    try:
        body = response.json()
        return f"{body['code']}: {body['message']}"
    except (ValueError, KeyError, TypeError):
        return response.text[:500] or response.reason_phrase


@dataclass
class TurnResult:
    session: str
    turn: str
    status: str  # completed | failed | cancelled | refused
    answer: str = ""
    error: str = ""
    fallback: str = ""
    """`turn.completed`'s fallback line: set when a lower module answered after one failed."""
    answered_by: str = ""
    turn_known: bool = False
    """`turn` is the gateway's (its `accepted` frame came), not yet only the frame's key."""
    events: list[dict[str, Any]] = field(default_factory=list)


class Gateway:
    """One gateway, one principal (the token's): thin calls that raise `ClientError` with
    the gateway's own `{code, message}`, so the CLI never guesses what went wrong."""

    def __init__(
        self,
        target: Target,
        timeout: float = 30.0,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self.target = target
        self._http = httpx.AsyncClient(
            base_url=target.url,
            headers={"Authorization": f"Bearer {target.token}"},
            timeout=timeout,
            transport=transport,
        )

    async def __aenter__(self) -> "Gateway":
        return self

    async def __aexit__(self, *_: object) -> None:
        await self._http.aclose()

    async def answer(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        """Any answer, refusals included (`/ready` says what is down in a 503's body)."""
        try:
            return await self._http.request(method, path, **kwargs)
        except httpx.HTTPError as exc:
            raise ClientError(
                f"no gateway answered at {self.target.url} ({type(exc).__name__}: {exc}); "
                f"is `fleet up` running? (url from {self.target.source})"
            ) from None

    async def request(
        self, method: str, path: str, *, again: bool | None = None, **kwargs: Any
    ) -> httpx.Response:
        """Raises `ClientError` on a refusal. A 503 `store_unavailable` with `Retry-After` (the
        event store did not answer: a cluster electing a leader) is asked again, for up to
        `UNAVAILABLE_S`, when `again` (default: for a GET, which changes nothing)."""
        again = method == "GET" if again is None else again
        deadline = time.monotonic() + UNAVAILABLE_S
        while True:
            response = await self.answer(method, path, **kwargs)
            wait = _retry_after(response) if again else None
            if wait is None or time.monotonic() + wait > deadline:
                break
            await asyncio.sleep(wait)
        if response.status_code >= 400:
            raise ClientError(
                f"{method} {path} was refused ({response.status_code} {_problem(response)})"
            )
        return response

    async def json(self, method: str, path: str, **kwargs: Any) -> Any:
        return (await self.request(method, path, **kwargs)).json()

    async def ticket(self) -> str:
        # a ticket minted twice costs nothing: the first expires unused
        return str((await self.json("POST", "/api/v1/auth/ws-ticket", again=True))["ticket"])

    @asynccontextmanager
    async def socket(self, path: str, **query: str) -> AsyncIterator[ClientConnection]:
        qs = urlencode({"ticket": await self.ticket(), **query})
        try:
            ws = await connect(f"{self.target.ws_url}{path}?{qs}", max_size=None)
        except (OSError, InvalidHandshake, InvalidURI) as exc:
            raise ClientError(f"could not open {path} at {self.target.url}: {exc}") from None
        try:
            yield ws
        finally:
            await ws.close()

    async def create_session(self, title: str = "") -> str:
        body = await self.json("POST", "/api/v1/sessions", json={"title": title})
        return str(body["session"]["id"])

    async def upload_document(self, session: str, alias: str, name: str, data: bytes) -> Any:
        """The file as a document of `session` under `alias` (`DocumentLoaded` on its log)."""
        return await self.json(
            "POST", f"/api/v1/sessions/{session}/documents",
            files={"file": (name, data, "text/plain; charset=utf-8")}, data={"alias": alias},
        )  # fmt: skip

    async def upload_checkout(self, session: str, bundle: bytes) -> Any:
        """A gzipped tar as the session's checkout: the broker starts its sandbox with it."""
        return await self.json(
            "POST", f"/api/v1/sessions/{session}/checkout",
            files={"bundle": ("checkout.tar.gz", bundle, "application/gzip")},
            timeout=120,
        )  # fmt: skip

    async def run_turn(
        self,
        message: str,
        *,
        mode: str = "auto",
        session: str | None = None,
        on_frame: Callable[[dict[str, Any]], None] = lambda _: None,
        cancel: asyncio.Event | None = None,
        resumes: int = 5,
        document_ids: Sequence[str] = (),
        context_paths: Sequence[str] = (),
        repo_url: str | None = None,
        repo_ref: str | None = None,
    ) -> TurnResult:
        """Send one message over `/ws/execution` and read until that turn ends. The frame's id
        is made here, so a resent frame stores once (the gateway's idempotency key); the turn's
        own id is the one the gateway's `accepted` frame names (it is not the key: events of
        the turn seen before it are held until it comes), so the ending is told apart from any
        other turn's events on the same session. `cancel` set sends a cancel frame for the turn. A
        dropped socket does not stop the turn on the mesh: the rest is read from the passive
        socket after the last sequence seen (at most `resumes` times)."""
        session = session or new_id()
        key = new_id()
        result = TurnResult(session, key, "failed")
        early: list[dict[str, Any]] = []
        """Event frames that came before the `accepted` frame named the turn."""
        cancel = cancel or asyncio.Event()
        last_seq = 0
        accepted = False
        frame: dict[str, Any] = {
            "type": "message", "session_id": session, "id": key,
            "content": message, "execution_mode": mode,
            "document_ids": list(document_ids), "context_paths": list(context_paths),
        }  # fmt: skip
        if repo_url is not None:  # the session's sandbox gets it cloned at repo_ref
            frame |= {"repo_url": repo_url, "repo_ref": repo_ref}
        for attempt in range(resumes + 1):
            if attempt == 0:
                path, query = "/api/v1/ws/execution", {"session_id": session}
            else:
                path = "/api/v1/ws/execution/events"
                query = {"session_id": session, "after_seq": str(last_seq)}
            try:
                async with self.socket(path, **query) as ws:
                    if attempt == 0:
                        await ws.send(json.dumps(frame))
                    send = self._cancel_over(ws if attempt == 0 else None, session, result)
                    async for item in _frames(ws, cancel, send):
                        on_frame(item)
                        kind = item.get("type")
                        if kind == "accepted" and item.get("frame") == "message":
                            result.turn = str(item.get("turn_id") or key)
                            result.turn_known = accepted = True
                            if any(_ended(held, result.turn, result) for held in early):
                                return result
                            continue
                        if kind == "error":
                            result.error = f"{item.get('code')}: {item.get('message')}"
                            return result
                        if kind != "event":
                            continue
                        last_seq = max(last_seq, int(item.get("seq") or 0))
                        if not accepted and attempt == 0:
                            early.append(item)
                            continue
                        accepted = True
                        if _ended(item, result.turn, result):
                            return result
            except ConnectionClosed as exc:
                if not accepted:  # the turn may not exist: waiting for it could be forever
                    raise ClientError(
                        f"the gateway closed the socket before it accepted the message ({exc})"
                    ) from None
                on_frame({"type": "dropped", "reason": str(exc), "after_seq": last_seq})
                continue
        raise ClientError(
            f"the socket kept dropping before turn {result.turn} ended; the turn runs on: "
            f"`fleet sessions show {session}`"
        )

    def _cancel_over(
        self, ws: ClientConnection | None, session: str, result: TurnResult
    ) -> Callable[[], Awaitable[None]]:
        """A cancel frame on the execution socket; the passive socket takes no frames, so
        after a resume the cancel goes by the HTTP route. The turn is read when the cancel is
        sent (`result.turn`: the accepted frame's, once it came)."""

        async def send() -> None:
            turn = result.turn
            if ws is not None:
                # before the accepted frame the turn's id is not known yet: a cancel without one
                # cancels the socket's last turn, which is this one once the gateway took it
                cancel = {"type": "cancel", "session_id": session}
                await ws.send(json.dumps(cancel | ({"turn_id": turn} if result.turn_known else {})))
            else:
                await self.answer(
                    "POST",
                    f"/api/v1/sessions/{session}/cancel",
                    json={"turn": turn, "reason": "cancelled at the terminal"},
                )

        return send


async def _frames(
    ws: ClientConnection, cancel: asyncio.Event, send_cancel: Callable[[], Awaitable[None]]
) -> AsyncIterator[dict[str, Any]]:
    """The socket's frames; once `cancel` is set, `send_cancel` runs once and reading goes on
    until the turn's own ending (cancelled, or completed if it won the race)."""
    sent = False
    while True:
        receive = asyncio.ensure_future(ws.recv())
        if not sent:
            stop = asyncio.ensure_future(cancel.wait())
            done, _ = await asyncio.wait({receive, stop}, return_when=asyncio.FIRST_COMPLETED)
            if stop in done:
                sent = True
                await send_cancel()
            else:
                stop.cancel()
        try:
            raw = await receive
        finally:
            receive.cancel()
        yield json.loads(raw)


def _ended(item: dict[str, Any], turn: str, result: TurnResult) -> bool:
    envelope = item.get("event") or {}
    if envelope.get("turn") != turn:
        return False
    result.events.append(item)
    data = envelope.get("data") or {}
    ending = ENDINGS.get(str(data.get("type")))
    if ending is None:
        return False
    result.status = ending
    result.answer = str(data.get("answer", data.get("partial", "")))
    result.error = str(data.get("error") or data.get("message") or data.get("reason") or "")
    result.fallback = str(data.get("fallback") or "")
    result.answered_by = str(data.get("answered_by") or "")
    return True
