"""`WS /api/v1/ws/execution` and `WS /api/v1/ws/execution/events`: the session log as it grows.

Both are opened with `?ticket=` (single use, any replica) and stream one session's stored
events, each with its stream sequence, from `after_seq` on (a client that reconnects passes the
last sequence it received and gets exactly what it missed), plus the live deltas. The
execution socket also takes client frames, each a session command (`fleet_gateway.sessions`,
the same ones the REST routes call): `message` → `TurnRequested` (its `id`, the idempotency
key, makes a resent frame answer the first answer), `cancel` → `CancelRequested`, `command`
(answering a clarification) → `InputProvided`.

A dropped socket only stops the watch: the turn is work on the mesh, not a task of this
socket, so it runs on and the client reads its end when it comes back (the earlier system
cancelled the turn and re-ran it on reconnect).

Close codes (docs/gateway.md): 4401 the ticket was refused, 4008 the socket fell too far behind
(reason `{"code":"queue_overflow","last_seq":N}`: reconnect with `after_seq=N`), 1008 an identity
field in the query, 1011 the bus failed under the watch.
"""

import asyncio
import contextlib
import json
import logging

from fastapi import APIRouter, WebSocket, WebSocketDisconnect
from nats.errors import Error as NatsError

from fleet_events.ids import InvalidId, check_id
from fleet_events.session import InputProvided, TurnRequested
from fleet_gateway.api_tokens import ApiTokens
from fleet_gateway.auth import Principal
from fleet_gateway.errors import ApiError
from fleet_gateway.frames import (
    CancelFrame,
    ClientFrame,
    CommandFrame,
    FrameError,
    MessageFrame,
    error_frame,
    parse,
)
from fleet_gateway.live import TRACE_MODES, Overflowed, TraceMode, Watch
from fleet_gateway.sessionlog import SessionLog, session_log
from fleet_gateway.sessions.commands import SessionCommands
from fleet_gateway.sessions.errors import SessionError
from fleet_gateway.tickets import redeem_ticket
from fleet_mesh.store import StoreError

router = APIRouter(prefix="/api/v1/ws", tags=["websocket"])
log = logging.getLogger("fleet.gateway.ws")

CLOSE_AUTH = 4401
CLOSE_OVERFLOW = 4008
CLOSE_IDENTITY = 1008
CLOSE_BUS = 1011
IDENTITY_PARAMS = frozenset({"tenant", "tenant_id", "tid", "user", "user_id", "workspace_id"})


def _reason(code: str, **fields: object) -> str:
    return json.dumps({"code": code, **fields}, separators=(",", ":"))[:123]


class _Socket:
    """One connection: its principal, its send lock, and at most one watch at a time."""

    def __init__(self, ws: WebSocket, principal: Principal, handles: SessionLog) -> None:
        self.ws = ws
        self.principal = principal
        self.handles = handles
        self.lock = asyncio.Lock()
        self.watch: Watch | None = None
        self.pump: asyncio.Task[None] | None = None
        self.session: str | None = None
        self.trace_mode: TraceMode = "compact"
        self.last_turn: dict[str, str] = {}
        self.ended: asyncio.Future[tuple[int, str]] = asyncio.get_running_loop().create_future()
        self.revocation: asyncio.Task[None] | None = None
        tokens = ws.app.state.gateway.api_tokens
        if principal.token_id is not None and tokens is not None:
            # opened with an API token: the socket ends when the token is revoked
            self.revocation = asyncio.create_task(self._until_revoked(tokens, principal.token_id))

    async def _until_revoked(self, tokens: ApiTokens, token_id: str) -> None:
        try:
            await tokens.revoked(self.principal.tenant, token_id)
        except (StoreError, NatsError, TimeoutError):  # the watch failed: the socket cannot
            self._end(CLOSE_BUS, _reason("revocation_watch_failed"))  # stay open unwatched
            return
        self._end(CLOSE_AUTH, _reason("token_revoked", token=token_id))

    async def send(self, text: str) -> None:
        async with self.lock:
            await self.ws.send_text(text)

    async def watch_session(self, session: str, after_seq: int, mode: TraceMode) -> None:
        if self.watch is not None and self.session == session and self.trace_mode == mode:
            return
        if self.watch is not None and self.session == session:
            after_seq = self.watch.sent_seq  # a new trace mode resumes where the old one was
        await self.stop_watch()
        limit: int = self.ws.app.state.gateway.settings.ws_queue_limit
        watch = Watch(self.handles.hub, self.principal.tenant, session, after_seq, mode, limit)
        try:
            await watch.start()
        except (NatsError, TimeoutError, StoreError) as exc:  # the store did not answer
            log.warning("a session watch could not start: %s", type(exc).__name__)
            self._end(CLOSE_BUS, _reason("store_unavailable", retry="reconnect in a few seconds"))
            return
        self.watch, self.session, self.trace_mode = watch, session, mode
        self.pump = asyncio.create_task(self._pump(watch))

    async def _pump(self, watch: Watch) -> None:
        try:
            while True:
                seq, frame = await watch.next()
                await self.send(frame)
                watch.delivered(seq)
        except Overflowed as exc:
            self._end(CLOSE_OVERFLOW, _reason("queue_overflow", last_seq=exc.last_seq))
        except (StoreError, ValueError, LookupError) as exc:
            log.warning("watch failed", extra={"error": type(exc).__name__})
            self._end(CLOSE_BUS, _reason("watch_failed", last_seq=watch.sent_seq))
        except (WebSocketDisconnect, RuntimeError):
            self._end(1000, "")

    def _end(self, code: int, reason: str) -> None:
        if not self.ended.done():
            self.ended.set_result((code, reason))

    async def stop(self) -> None:
        if self.revocation is not None:
            self.revocation.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self.revocation
        await self.stop_watch()

    async def stop_watch(self) -> None:
        if self.pump is not None:
            self.pump.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self.pump
        if self.watch is not None:
            await self.watch.stop()
        self.watch = self.pump = None


async def _open(ws: WebSocket) -> _Socket | None:
    """Redeem the ticket, then accept, then refuse identity in the query or a bad ticket with
    a close code the client can read (a refusal before accept reaches a browser only as a bare
    403). The ticket is spent before the handshake completes, so a client that got a socket
    holds a ticket nobody else can use."""
    named = sorted(IDENTITY_PARAMS & set(ws.query_params))
    refusal: tuple[int, str] | None = None
    principal: Principal | None = None
    handles: SessionLog | None = None
    if named:
        refusal = (CLOSE_IDENTITY, _reason("unsupported_identity_query_params", params=named))
    else:
        try:
            principal = await redeem_ticket(ws, ws.query_params.get("ticket", ""))
            handles = await session_log(ws)
        except ApiError as exc:
            refusal = (CLOSE_AUTH if exc.status == 401 else CLOSE_BUS, _reason(exc.code))
    await ws.accept()
    if refusal is not None or principal is None or handles is None:
        code, reason = refusal or (CLOSE_BUS, _reason("internal_error"))
        await ws.close(code, reason)
        return None
    return _Socket(ws, principal, handles)


def _start_params(ws: WebSocket) -> tuple[str | None, int, TraceMode] | str:
    """(session, after_seq, trace mode) from the query, or the error message."""
    q = ws.query_params
    session = q.get("session_id")
    try:
        if session is not None:
            check_id("session", session)
        after = int(q.get("after_seq", "0"))
    except (InvalidId, ValueError) as exc:
        return f"bad query: {exc}; after_seq is the last stream sequence you received (0: all)"
    if after < 0:
        return f"after_seq {after} is negative: pass the last sequence you received, or 0"
    mode = q.get("trace_mode", "compact")
    for known in TRACE_MODES:
        if mode == known:
            return session, after, known
    return f"trace_mode {mode[:32]!r} is not one of {', '.join(TRACE_MODES)}"


async def _serve(sock: _Socket, frames: bool) -> None:
    """Read client frames (or, passive, only notice the close) until the socket or its watch
    ends; close with the watch's code if the watch ended it."""
    reader: asyncio.Future[str] = asyncio.ensure_future(sock.ws.receive_text())
    try:
        while True:
            waiting: set[asyncio.Future[object]] = {reader, sock.ended}  # type: ignore[arg-type]
            await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
            if sock.ended.done():
                code, reason = sock.ended.result()
                if code != 1000:
                    with contextlib.suppress(Exception):
                        await sock.ws.close(code, reason)
                return
            try:
                text = reader.result()
            except (WebSocketDisconnect, RuntimeError, KeyError):
                return
            reader = asyncio.ensure_future(sock.ws.receive_text())
            if not frames:
                await sock.send(error_frame(
                    "read_only", "this socket only streams events: send frames on /ws/execution"
                ))  # fmt: skip
                continue
            await _frame(sock, text)
    finally:
        reader.cancel()
        await sock.stop()


async def _frame(sock: _Socket, text: str) -> None:
    try:
        frame: ClientFrame = parse(text)
        await _handle(sock, frame)
    except FrameError as exc:
        await sock.send(error_frame(exc.code, exc.message))
    except (ApiError, SessionError) as exc:
        await sock.send(error_frame(exc.code, exc.message, **exc.details))
    except StoreError as exc:
        await sock.send(error_frame("durable_state_write_failed", f"the log refused it: {exc}"))


async def _handle(sock: _Socket, frame: ClientFrame) -> None:
    """Each frame is a session command (`SessionCommands`, the same ones the REST routes
    call); what it refuses comes back as an error frame with the command's code."""
    tenant = sock.principal.tenant
    state = sock.ws.app.state.gateway
    if state.auth is not None:  # a frame costs the tenant a request, as an HTTP call does
        state.auth.rate.charge(tenant)  # 429 rate_limited: an error frame, the socket stays
    run: SessionCommands | None = state.commands
    if run is None:
        raise ApiError(503, "not_ready", "the gateway is waiting for the mesh; see GET /ready")
    match frame:
        case MessageFrame():
            mode: TraceMode = "off" if not frame.trace else _mode(frame.trace_mode)
            request = TurnRequested(
                message=frame.content, mode=frame.execution_mode,
                document_ids=tuple(frame.document_ids), context_paths=tuple(frame.context_paths),
                repo_url=frame.repo_url, repo_ref=frame.repo_ref,
            )  # fmt: skip
            key = frame.id if frame.id is not None else frame.turn_id
            field = "message frame's " + ("id" if frame.id is not None else "turn_id")
            done = await run.request_turn(
                tenant, frame.session_id, request, key=key, key_field=field, create=True
            )
            sock.last_turn[frame.session_id] = done.turn
            # watch from the request itself: the client sees its turn from its first event
            await sock.watch_session(frame.session_id, done.first_seq - 1, mode)
            await sock.send(_accepted("message", frame.session_id, done.turn, done.seq))
        case CancelFrame():
            target = frame.session_id or sock.session
            cancelled = frame.turn_id or (sock.last_turn.get(target) if target else None)
            if target is None or cancelled is None:
                raise FrameError(
                    "nothing_to_cancel",
                    "this socket has sent no turn: name session_id and turn_id to cancel one",
                )
            done = await run.cancel(tenant, target, cancelled, "user")
            await sock.send(_accepted("cancel", target, done.turn, done.seq))
        case CommandFrame():
            where = frame.session_id or sock.session
            if where is None:
                raise FrameError("no_session", "name session_id: no session is watched here")
            asked = frame.args.get("turn_id")
            written = await run.answer(
                tenant, where, _answer(frame), asked if isinstance(asked, str) else None
            )
            await sock.send(_accepted("command", where, None, written.seq, command=frame.command))


def _answer(frame: CommandFrame) -> InputProvided:
    args = frame.args
    request_id = args.get("request_id", args.get("message_id"))
    answer = args.get("answer", args.get("action_label"))
    option = args.get("option", "")
    if not isinstance(request_id, str) or not request_id:
        raise FrameError(
            "invalid_command", f"{frame.command} needs args.request_id (the question's id)"
        )
    if not isinstance(answer, str) or not isinstance(option, str):
        raise FrameError(
            "invalid_command", f"{frame.command} needs args.answer (text) and an optional option"
        )
    return InputProvided(request_id=request_id[:128], answer=answer, option=option)


def _mode(value: str) -> TraceMode:
    for known in TRACE_MODES:
        if value == known:
            return known
    return "compact"


def _accepted(kind: str, session: str, turn: str | None, seq: int, **more: str) -> str:
    body = {"type": "accepted", "frame": kind, "session_id": session, "turn_id": turn,
            "seq": seq, **more}  # fmt: skip
    return json.dumps(body, separators=(",", ":"))


async def _run(ws: WebSocket, frames: bool) -> None:
    sock = await _open(ws)
    if sock is None:
        return
    start = _start_params(ws)
    session: str | None = None
    after: int = 0
    mode: TraceMode = "compact"
    if isinstance(start, str):
        await sock.send(error_frame("invalid_query", start))
        if not frames:
            await ws.close(CLOSE_IDENTITY, _reason("invalid_query"))
            return
    else:
        session, after, mode = start
    if session is not None:
        await sock.watch_session(session, after, mode)
    elif not frames:
        await ws.close(CLOSE_IDENTITY, _reason("session_required"))
        return
    await _serve(sock, frames)


@router.websocket("/execution")
async def execution(ws: WebSocket) -> None:
    await _run(ws, frames=True)


@router.websocket("/execution/events")
async def execution_events(ws: WebSocket) -> None:
    """Passive: `?ticket=&session_id=&after_seq=` streams the session from after `after_seq`."""
    await _run(ws, frames=False)
