"""How one stored event changes the read models. A session's state (its image: history, core
memory, documents, interpreter, memory files; its pending question) is the one session fold,
`fleet_events.session_fold`, the agent's too: each row keeps the fold's state (`state`) and the
image and pending question it gives (`image`, `pending_input`), so `/state` shows what the agent
restores. The turns and model tables are this read model's own (status, answer, cost).

Everything written is a function of the event and the rows before it, with times taken from
the envelope (never the clock), so folding the same log from sequence 0 writes the same bytes.
Tenant and session come from the subject the event is stored under, never from its payload.
"""

import sqlite3
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import msgspec

from fleet_events import Envelope, subjects
from fleet_events.run import LlmCalled
from fleet_events.session import (
    CancelRequested,
    SessionCreated,
    SessionDeleted,
    SessionImage,
    SessionPurged,
    SessionRenamed,
    TurnCancelled,
    TurnCompleted,
    TurnFailed,
    TurnRefused,
    TurnRequested,
    TurnStarted,
)
from fleet_events.session_fold import EMPTY, SessionState, evolve

_encoder = msgspec.json.Encoder()

PURGED_TABLES = ("sessions", "turns", "model_stats")
"""Every table keyed by (tenant, session): what `session.purged` removes."""


def _encode(value: object) -> str:
    """Stored as text, so a row dumps as JSON and compares as bytes."""
    return _encoder.encode(value).decode()


_state = msgspec.json.Decoder(SessionState).decode


class PendingInput(msgspec.Struct, frozen=True, kw_only=True):
    """The pending question as `/state` shows it (the fold's, less the run it came from)."""

    request_id: str
    question: str
    options: tuple[str, ...] = ()
    timeout_s: float = 0.0
    turn: str | None = None


@dataclass(frozen=True, slots=True)
class _At:
    """A stored event as the session fold reads it."""

    seq: int
    envelope: Envelope[Any]


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
        "INSERT OR IGNORE INTO sessions VALUES (?,?,?,?,'active',?,?,?,?,0,?,NULL,?)",
        (tenant, session, title, owner, ts, ts, seq, seq, _encode(SessionImage()), _encode(EMPTY)),
    )
    return cur.rowcount == 1


def _fold_session(cur: sqlite3.Cursor, key: tuple[str, str], seq: int, env: Envelope[Any]) -> None:
    """The session fold over one more event; the row's image and pending question follow it."""
    row = cur.execute("SELECT state FROM sessions WHERE tenant=? AND session=?", key).fetchone()
    state = _state(row[0])
    new = evolve(state, _At(seq, env))
    if new is state:
        return
    pending = new.pending_input
    shown = None
    if pending is not None:
        shown = _encode(
            PendingInput(
                request_id=pending.request_id, question=pending.question,
                options=pending.options, timeout_s=pending.timeout_s, turn=pending.turn,
            )
        )  # fmt: skip
    cur.execute(
        "UPDATE sessions SET state=?, image=?, pending_input=? WHERE tenant=? AND session=?",
        (_encode(new), _encode(new.image), shown, *key),
    )


def _end_turn(
    cur: sqlite3.Cursor, key: tuple[str, str], turn: str | None, seq: int, ts: str, **fields: Any
) -> None:
    if turn is None:
        return
    row = cur.execute(
        "SELECT status FROM turns WHERE tenant=? AND session=? AND turn=?", (*key, turn)
    ).fetchone()
    if row is None or row[0] in ("completed", "failed", "cancelled", "refused"):
        return  # an end for a turn never asked, or a second end: the first one stands
    sets = ", ".join(f"{name}=?" for name in fields)
    cur.execute(
        f"UPDATE turns SET {sets}, ended_at=?, last_seq=? "  # noqa: S608 - names are ours
        "WHERE tenant=? AND session=? AND turn=?",
        (*fields.values(), ts, seq, *key, turn),
    )


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
    _fold_session(cur, key, seq, env)


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
