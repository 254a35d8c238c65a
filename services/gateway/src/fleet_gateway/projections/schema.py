"""The read models' tables. Bump `VERSION` whenever a table or the fold changes meaning: a
database of another version is dropped and rebuilt from sequence 0 on open."""

VERSION = 3
PROJECTOR = "sessions"
"""The checkpoint's name: one projector fills every table here in one transaction per batch.
Trace trees (issue 12) add tables and bump `VERSION`, or get a projector and checkpoint of
their own."""

TABLES = ("sessions", "turns", "model_stats")
"""The read models, in the order `dump` writes them, each with its primary key order."""

ORDER = {
    "sessions": "tenant, session",
    "turns": "tenant, session, turn",
    "model_stats": "tenant, session, model",
}

DDL = """
CREATE TABLE IF NOT EXISTS meta (
    key TEXT PRIMARY KEY,
    value TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS checkpoints (
    projector TEXT PRIMARY KEY,
    seq INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS sessions (
    tenant TEXT NOT NULL,
    session TEXT NOT NULL,
    title TEXT NOT NULL,
    owner TEXT NOT NULL,
    status TEXT NOT NULL,
    created_at TEXT NOT NULL,
    updated_at TEXT NOT NULL,
    created_seq INTEGER NOT NULL,
    last_seq INTEGER NOT NULL,
    turn_count INTEGER NOT NULL,
    image TEXT NOT NULL,
    pending_input TEXT,
    state TEXT NOT NULL,
    PRIMARY KEY (tenant, session)
);
CREATE INDEX IF NOT EXISTS sessions_by_created ON sessions (tenant, created_seq);
CREATE TABLE IF NOT EXISTS turns (
    tenant TEXT NOT NULL,
    session TEXT NOT NULL,
    turn TEXT NOT NULL,
    turn_index INTEGER NOT NULL,
    message TEXT NOT NULL,
    mode TEXT NOT NULL,
    status TEXT NOT NULL,
    answer TEXT NOT NULL,
    error TEXT NOT NULL,
    code TEXT NOT NULL,
    attempts INTEGER NOT NULL,
    cancel_requested INTEGER NOT NULL,
    requested_at TEXT NOT NULL,
    ended_at TEXT,
    requested_seq INTEGER NOT NULL,
    last_seq INTEGER NOT NULL,
    PRIMARY KEY (tenant, session, turn)
);
CREATE INDEX IF NOT EXISTS turns_by_index ON turns (tenant, session, turn_index);
CREATE INDEX IF NOT EXISTS turns_by_status ON turns (tenant, status);
CREATE TABLE IF NOT EXISTS model_stats (
    tenant TEXT NOT NULL,
    session TEXT NOT NULL,
    model TEXT NOT NULL,
    calls INTEGER NOT NULL,
    errors INTEGER NOT NULL,
    tokens_in INTEGER NOT NULL,
    tokens_out INTEGER NOT NULL,
    latency_ms REAL NOT NULL,
    cost REAL NOT NULL,
    PRIMARY KEY (tenant, session, model)
);
"""
