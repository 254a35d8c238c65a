"""The read models of one gateway replica: an SQLite database beside its checkpoint.

Why SQLite per replica, not a KV bucket per read model (docs/gateway.md, "Projections"): the
list route filters, searches and pages 10,000 sessions of a tenant, which an index answers in
well under a millisecond and a key-value store cannot without reading every key. Each replica
folds the whole log itself, so replicas agree because the log does (deterministic fold, same
order), and a reader who passes the sequence its write returned (`min_seq`) waits until this
replica has folded that far. The checkpoint is committed in the same transaction as the rows
it covers, so a crash never leaves one without the other, redelivered events (at or below the
checkpoint) are skipped, and a restart resumes where the file left off.

Calls are synchronous and short (one indexed query, or one batch's transaction); they run on
the event loop, which is cheaper than a thread hop for sub-millisecond work.
"""

import asyncio
import base64
import json
import sqlite3
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fleet_events import Envelope
from fleet_gateway.projections import fold, schema


@dataclass(frozen=True, slots=True)
class Folded:
    subject: str
    seq: int
    envelope: Envelope[Any] | None
    """None: an event the read models do not read (still moves the checkpoint)."""


class ProjectionStore:
    def __init__(self, path: Path | None) -> None:
        """`path` None: an in-memory database, rebuilt from sequence 0 on every start."""
        self.path = path
        self._db = sqlite3.connect(":memory:" if path is None else str(path), isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._migrate()
        self.checkpoint = self._read_checkpoint()
        self._advanced = asyncio.Condition()
        self._known: set[tuple[str, str]] = set()
        self.wanted = asyncio.Event()
        """Set while a reader waits for a sequence not folded yet: the projector reads at
        once instead of letting the tail gather (`Projector.run`)."""

    def _migrate(self) -> None:
        has_meta = self._db.execute(
            "SELECT 1 FROM sqlite_master WHERE type='table' AND name='meta'"
        ).fetchone()
        version = None
        if has_meta:
            row = self._db.execute("SELECT value FROM meta WHERE key='version'").fetchone()
            version = int(row[0]) if row else None
        if version != schema.VERSION:
            for (name,) in self._db.execute(
                "SELECT name FROM sqlite_master WHERE type='table'"
            ).fetchall():
                self._db.execute(f'DROP TABLE IF EXISTS "{name}"')
        self._db.executescript(schema.DDL)
        self._db.execute(
            "INSERT OR REPLACE INTO meta VALUES ('version', ?)", (str(schema.VERSION),)
        )

    def _read_checkpoint(self) -> int:
        row = self._db.execute(
            "SELECT seq FROM checkpoints WHERE projector=?", (schema.PROJECTOR,)
        ).fetchone()
        return int(row[0]) if row else 0

    def close(self) -> None:
        self._db.close()

    # -- writing: one transaction per batch ---------------------------------------------

    async def apply_batch(self, events: Iterable[Folded]) -> int:
        """Fold a batch in one transaction with its checkpoint; returns events folded.
        Events at or below the checkpoint (a redelivery, a replayed batch) are skipped."""
        cur = self._db.cursor()
        applied = 0
        last = self.checkpoint
        cur.execute("BEGIN")
        try:
            for event in events:
                if event.seq <= last:
                    continue
                if event.envelope is not None:
                    fold.apply(cur, event.subject, event.seq, event.envelope, self._known)
                    applied += 1
                last = event.seq
            cur.execute(
                "INSERT OR REPLACE INTO checkpoints VALUES (?, ?)", (schema.PROJECTOR, last)
            )
            cur.execute("COMMIT")
        except BaseException:
            cur.execute("ROLLBACK")
            self._known.clear()  # it may name rows the rollback removed
            raise
        if last != self.checkpoint:
            self.checkpoint = last
            async with self._advanced:
                self._advanced.notify_all()
        return applied

    async def wait_for(self, seq: int, timeout: float) -> bool:
        """Whether this replica has folded the log up to `seq` within `timeout`."""
        if self.checkpoint >= seq:
            return True
        self.wanted.set()
        try:
            async with self._advanced:
                await asyncio.wait_for(
                    self._advanced.wait_for(lambda: self.checkpoint >= seq), timeout
                )
        except TimeoutError:
            return False
        return True

    # -- reading ------------------------------------------------------------------------

    def session(self, tenant: str, session: str) -> dict[str, Any] | None:
        cur = self._db.execute(
            "SELECT * FROM sessions WHERE tenant=? AND session=?", (tenant, session)
        )
        row = cur.fetchone()
        return None if row is None else _row(cur, row)

    def active_turn(self, tenant: str, session: str) -> str | None:
        row = self._db.execute(
            "SELECT turn FROM turns WHERE tenant=? AND session=? AND status IN "
            "('queued','running') ORDER BY turn_index LIMIT 1",
            (tenant, session),
        ).fetchone()
        return None if row is None else str(row[0])

    def active_turns(self, tenant: str) -> int:
        """The tenant's queued and running turns, over all its sessions."""
        row = self._db.execute(
            "SELECT COUNT(*) FROM turns WHERE tenant=? AND status IN ('queued','running')",
            (tenant,),
        ).fetchone()
        return int(row[0])

    def turn(self, tenant: str, session: str, turn: str) -> dict[str, Any] | None:
        cur = self._db.execute(
            "SELECT * FROM turns WHERE tenant=? AND session=? AND turn=?", (tenant, session, turn)
        )
        row = cur.fetchone()
        return None if row is None else _row(cur, row)

    def sessions(
        self,
        tenant: str,
        *,
        limit: int,
        before_seq: int | None = None,
        search: str | None = None,
        status: str | None = None,
        created_after: str | None = None,
        created_before: str | None = None,
    ) -> list[dict[str, Any]]:
        """Newest first; `before_seq` is the cursor (the created_seq of the last row seen)."""
        clauses = ["tenant=?"]
        args: list[Any] = [tenant]
        if before_seq is not None:
            clauses.append("created_seq < ?")
            args.append(before_seq)
        if status is not None:
            clauses.append("status=?")
            args.append(status)
        if search:
            escaped = search.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
            clauses.append("(title LIKE ? ESCAPE '\\' OR session LIKE ? ESCAPE '\\')")
            args += [f"%{escaped}%", f"{escaped}%"]
        if created_after is not None:
            clauses.append("created_at >= ?")
            args.append(created_after)
        if created_before is not None:
            clauses.append("created_at < ?")
            args.append(created_before)
        sql = (
            f"SELECT * FROM sessions WHERE {' AND '.join(clauses)} "  # noqa: S608 - ours
            "ORDER BY created_seq DESC LIMIT ?"
        )
        cur = self._db.execute(sql, (*args, limit))
        return [_row(cur, row) for row in cur.fetchall()]

    def turns(
        self, tenant: str, session: str, *, limit: int, after_index: int = -1
    ) -> list[dict[str, Any]]:
        cur = self._db.execute(
            "SELECT * FROM turns WHERE tenant=? AND session=? AND turn_index > ? "
            "ORDER BY turn_index LIMIT ?",
            (tenant, session, after_index, limit),
        )
        return [_row(cur, row) for row in cur.fetchall()]

    def model_stats(self, tenant: str, session: str) -> list[dict[str, Any]]:
        cur = self._db.execute(
            "SELECT * FROM model_stats WHERE tenant=? AND session=? ORDER BY model",
            (tenant, session),
        )
        return [_row(cur, row) for row in cur.fetchall()]

    def latency_of_turns(self, tenant: str, session: str) -> list[tuple[str, str | None]]:
        return [
            (str(a), b)
            for a, b in self._db.execute(
                "SELECT requested_at, ended_at FROM turns WHERE tenant=? AND session=? "
                "ORDER BY turn_index",
                (tenant, session),
            ).fetchall()
        ]

    def dump(self, tenant: str | None = None) -> bytes:
        """Every read model's rows (one tenant's, or all) as canonical JSON lines: what the
        rebuild test compares byte for byte."""
        lines: list[str] = []
        for table in schema.TABLES:
            where = "" if tenant is None else " WHERE tenant=?"
            args: tuple[Any, ...] = () if tenant is None else (tenant,)
            cur = self._db.execute(
                f"SELECT * FROM {table}{where} ORDER BY {schema.ORDER[table]}",  # noqa: S608
                args,
            )
            names = [d[0] for d in cur.description]
            for row in cur.fetchall():
                lines.append(json.dumps([table, dict(zip(names, row, strict=True))]))
        return "\n".join(lines).encode()


def _row(cur: sqlite3.Cursor, row: tuple[Any, ...]) -> dict[str, Any]:
    return dict(zip([d[0] for d in cur.description], row, strict=True))


def encode_cursor(created_seq: int) -> str:
    return base64.urlsafe_b64encode(f"s{created_seq}".encode()).decode().rstrip("=")


def decode_cursor(cursor: str) -> int | None:
    """The created_seq a cursor names, or None when it is not one of ours."""
    try:
        text = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode()
    except (ValueError, UnicodeDecodeError):
        return None
    if not text.startswith("s") or not text[1:].isdigit() or len(text) > 20:
        return None
    return int(text[1:])
