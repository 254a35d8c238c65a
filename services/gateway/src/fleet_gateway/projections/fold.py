"""How one stored event changes the read models: the gateway's own fold of the session
vocabulary (`fleet_events.session`, `fleet_events.run`), never the agent's (services do not
import each other).

Everything written is a function of the event and the rows before it, with times taken from
the envelope (never the clock), so folding the same log from sequence 0 writes the same bytes.
Tenant and session come from the subject the event is stored under, never from its payload.
"""

import sqlite3
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import msgspec

from fleet_events import Envelope, subjects
from fleet_events.run import LlmCalled
from fleet_events.session import (
    CancelRequested,
    CoreMemoryChanged,
    DocumentActivated,
    DocumentLoaded,
    DocumentRemoved,
    HistoryTurn,
    InputExpired,
    InputProvided,
    InputRequested,
    MemoryFileWritten,
    SandboxAttached,
    SandboxDetached,
    SessionCreated,
    SessionDeleted,
    SessionImage,
    SessionImported,
    SessionPurged,
    SessionRenamed,
    SessionRestored,
    TurnCancelled,
    TurnCompleted,
    TurnFailed,
    TurnRefused,
    TurnRequested,
    TurnStarted,
)

CORE_BLOCKS = ("persona", "human", "scratchpad")
CANCELLED_MARK = "[cancelled]"

_encoder = msgspec.json.Encoder()

PURGED_TABLES = ("sessions", "turns", "model_stats")
"""Every table keyed by (tenant, session): what `session.purged` removes."""


def _encode(value: object) -> str:
    """Stored as text, so a row dumps as JSON and compares as bytes."""
    return _encoder.encode(value).decode()


_image = msgspec.json.Decoder(SessionImage).decode


class PendingInput(msgspec.Struct, frozen=True, kw_only=True):
    request_id: str
    question: str
    options: tuple[str, ...] = ()
    timeout_s: float = 0.0
    turn: str | None = None


def stamp(ts: datetime) -> str:
    """One fixed-width UTC form, so stored times compare as strings and never vary."""
    utc = ts.astimezone(UTC)
    return f"{utc.year:04d}" + utc.strftime("-%m-%dT%H:%M:%S.%fZ")  # %Y drops zeros below 1000


def where(subject: str) -> tuple[str, str, bool] | None:
    """(tenant, session, is the session's `.log`) of a session subject, else None."""
    found = subjects.parse_session(subject)
    return None if found is None else (found.tenant, found.session, found.is_log)


def _ensure_session(
    cur: sqlite3.Cursor, tenant: str, session: str, seq: int, ts: str, title: str, owner: str
) -> bool:
    """The first event of a `.log` opens the session row (a created or imported session, or a
    log begun by any other writer); returns whether it was new."""
    cur.execute(
        "INSERT OR IGNORE INTO sessions VALUES (?,?,?,?,'active',?,?,?,?,0,?,NULL)",
        (tenant, session, title, owner, ts, ts, seq, seq, _encode(SessionImage())),
    )
    return cur.rowcount == 1


def _update_image(
    cur: sqlite3.Cursor, key: tuple[str, str], change: Callable[[SessionImage], SessionImage]
) -> None:
    row = cur.execute("SELECT image FROM sessions WHERE tenant=? AND session=?", key).fetchone()
    image = _image(row[0])
    new = change(image)
    if new is not image:
        cur.execute(
            "UPDATE sessions SET image=? WHERE tenant=? AND session=?", (_encode(new), *key)
        )


def _replace(**changes: Any) -> Callable[[SessionImage], SessionImage]:
    return lambda image: msgspec.structs.replace(image, **changes)


def _end_turn(
    cur: sqlite3.Cursor, key: tuple[str, str], turn: str | None, seq: int, ts: str, **fields: Any
) -> None:
    if turn is None:
        return
    row = cur.execute(
        "SELECT message, status FROM turns WHERE tenant=? AND session=? AND turn=?", (*key, turn)
    ).fetchone()
    if row is None or row[1] in ("completed", "failed", "cancelled", "refused"):
        return  # an end for a turn never asked, or a second end: the first one stands
    sets = ", ".join(f"{name}=?" for name in fields)
    cur.execute(
        f"UPDATE turns SET {sets}, ended_at=?, last_seq=? "  # noqa: S608 - names are ours
        "WHERE tenant=? AND session=? AND turn=?",
        (*fields.values(), ts, seq, *key, turn),
    )
    answer = fields.get("answer", "")
    if fields["status"] == "completed" or (fields["status"] == "cancelled" and answer):
        text = answer if fields["status"] == "completed" else f"{answer} {CANCELLED_MARK}"
        entry = HistoryTurn(question=row[0], answer=text, turn=turn)
        _update_image(cur, key, lambda image: _replace(turns=(*image.turns, entry))(image))
    pending = cur.execute(
        "SELECT pending_input FROM sessions WHERE tenant=? AND session=?", key
    ).fetchone()[0]
    if pending is not None and msgspec.json.decode(pending, type=PendingInput).turn == turn:
        cur.execute("UPDATE sessions SET pending_input=NULL WHERE tenant=? AND session=?", key)


def _documents(image: SessionImage, alias: str) -> tuple[Any, ...]:
    return tuple(d for d in image.documents if d.alias != alias)


def _log_event(
    cur: sqlite3.Cursor, key: tuple[str, str], seq: int, ts: str, env: Envelope[Any]
) -> None:
    data = env.data
    match data:
        case SessionRenamed(title=title):
            cur.execute("UPDATE sessions SET title=? WHERE tenant=? AND session=?", (title, *key))
        case SessionDeleted():
            cur.execute("UPDATE sessions SET status='deleted' WHERE tenant=? AND session=?", key)
        case TurnRequested(message=message, mode=mode) if env.turn is not None:
            cur.execute(
                "INSERT OR IGNORE INTO turns SELECT ?,?,?,turn_count,?,?,'queued','','','',0,0,"
                "?,NULL,?,? FROM sessions WHERE tenant=? AND session=?",
                (*key, env.turn, message, mode, ts, seq, seq, *key),
            )
            if cur.rowcount == 1:
                cur.execute(
                    "UPDATE sessions SET turn_count=turn_count+1 WHERE tenant=? AND session=?",
                    key,
                )
        case TurnStarted(attempt=attempt) if env.turn is not None:
            cur.execute(
                "UPDATE turns SET status='running', attempts=?, last_seq=? "
                "WHERE tenant=? AND session=? AND turn=? AND status IN ('queued','running')",
                (attempt, seq, *key, env.turn),
            )
        case CancelRequested() if env.turn is not None:
            cur.execute(
                "UPDATE turns SET cancel_requested=1, last_seq=? "
                "WHERE tenant=? AND session=? AND turn=?",
                (seq, *key, env.turn),
            )
        case TurnCompleted(answer=answer):
            _end_turn(cur, key, env.turn, seq, ts, status="completed", answer=answer)
        case TurnFailed(error=error, code=code):
            _end_turn(cur, key, env.turn, seq, ts, status="failed", error=error, code=code)
        case TurnCancelled(partial=partial):
            _end_turn(cur, key, env.turn, seq, ts, status="cancelled", answer=partial)
        case TurnRefused(reason=reason, message=message):
            _end_turn(cur, key, env.turn, seq, ts, status="refused", error=message, code=reason)
        case CoreMemoryChanged(block=block, value=value) if block in CORE_BLOCKS:
            _update_image(
                cur,
                key,
                lambda image: _replace(
                    core_memory=msgspec.structs.replace(image.core_memory, **{block: value})
                )(image),
            )
        case MemoryFileWritten(file=file):
            _update_image(
                cur,
                key,
                lambda image: _replace(
                    memory_files=(*(f for f in image.memory_files if f.path != file.path), file)
                )(image),
            )
        case DocumentLoaded(document=document):
            _update_image(
                cur,
                key,
                lambda image: _replace(
                    documents=(*_documents(image, document.alias), document),
                    active_document=document.alias,
                )(image),
            )
        case DocumentActivated(alias=alias):

            def activate(image: SessionImage) -> SessionImage:
                found = [d for d in image.documents if d.alias == alias]
                if not found:
                    return image
                return _replace(
                    documents=(*_documents(image, alias), found[0]), active_document=alias
                )(image)

            _update_image(cur, key, activate)
        case DocumentRemoved(alias=alias):

            def remove(image: SessionImage) -> SessionImage:
                active = None if image.active_document == alias else image.active_document
                return msgspec.structs.replace(
                    image, documents=_documents(image, alias), active_document=active
                )

            _update_image(cur, key, remove)
        case SandboxAttached(interpreter=interpreter):
            _update_image(cur, key, _replace(interpreter=interpreter))
        case SandboxDetached(sandbox=sandbox):

            def detach(image: SessionImage) -> SessionImage:
                current = image.interpreter
                if current is None or current.sandbox != sandbox:
                    return image
                return _replace(interpreter=msgspec.structs.replace(current, sandbox=None))(image)

            _update_image(cur, key, detach)
        case InputRequested():
            pending = PendingInput(
                request_id=data.request_id,
                question=data.question,
                options=data.options,
                timeout_s=data.timeout_s,
                turn=env.turn,
            )
            cur.execute(
                "UPDATE sessions SET pending_input=? WHERE tenant=? AND session=?",
                (_encode(pending), *key),
            )
        case InputProvided(request_id=request_id) | InputExpired(request_id=request_id):
            cur.execute(
                "UPDATE sessions SET pending_input=NULL WHERE tenant=? AND session=? "
                "AND json_extract(pending_input, '$.request_id')=?",
                (*key, request_id),
            )
        case SessionImported(image=image) | SessionRestored(image=image):
            cur.execute(
                "UPDATE sessions SET image=?, pending_input=NULL WHERE tenant=? AND session=?",
                (_encode(image), *key),
            )


def _run_event(cur: sqlite3.Cursor, key: tuple[str, str], env: Envelope[Any]) -> None:
    data = env.data
    if not isinstance(data, LlmCalled) or data.recorded:
        return  # a response replayed from the run's own record cost nothing again
    cur.execute(
        "INSERT INTO model_stats VALUES (?,?,?,1,?,?,?,?,?) "
        "ON CONFLICT (tenant, session, model) DO UPDATE SET calls=calls+1, "
        "errors=errors+excluded.errors, tokens_in=tokens_in+excluded.tokens_in, "
        "tokens_out=tokens_out+excluded.tokens_out, latency_ms=latency_ms+excluded.latency_ms, "
        "cost=cost+excluded.cost",
        (
            *key,
            data.model,
            1 if data.error else 0,
            data.prompt_tokens,
            data.completion_tokens,
            data.latency_ms,
            data.cost,
        ),
    )


def apply(
    cur: sqlite3.Cursor,
    subject: str,
    seq: int,
    env: Envelope[Any],
    known: set[tuple[str, str]] | None = None,
) -> None:
    """Fold one stored event into the read models (inside the batch's transaction).

    `known`: sessions whose row exists already (only a purge removes rows, and takes the
    session out of it), so the common event costs one statement instead of three; the caller
    clears it when a batch rolls back."""
    place = where(subject)
    if place is None:
        return
    tenant, session, is_log = place
    key = (tenant, session)
    if isinstance(env.data, SessionPurged):  # an admin purged its events: its rows go too
        for table in PURGED_TABLES:
            cur.execute(f"DELETE FROM {table} WHERE tenant=? AND session=?", key)  # noqa: S608
        if known is not None:
            known.discard(key)
        return
    seen = known is not None and key in known
    if not is_log:
        if (
            seen
            or cur.execute("SELECT 1 FROM sessions WHERE tenant=? AND session=?", key).fetchone()
        ):
            _run_event(cur, key, env)
        return
    ts = stamp(env.ts)
    new = False
    if not seen:
        created = env.data if isinstance(env.data, SessionCreated) else None
        new = _ensure_session(
            cur,
            tenant,
            session,
            seq,
            ts,
            created.title if created else "",
            created.owner if created else "",
        )
        if known is not None:
            known.add(key)
    if isinstance(env.data, SessionRenamed) and not new:  # the commonest write: one statement
        cur.execute(
            "UPDATE sessions SET title=?, updated_at=?, last_seq=? WHERE tenant=? AND session=?",
            (env.data.title, ts, seq, *key),
        )
        return
    _log_event(cur, key, seq, ts, env)
    if not new:
        cur.execute(
            "UPDATE sessions SET updated_at=?, last_seq=? WHERE tenant=? AND session=?",
            (ts, seq, *key),
        )
