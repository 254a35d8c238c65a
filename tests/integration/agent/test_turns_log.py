"""The turn fold a replica keeps per log equals a fold from the start, as the log grows under
it; and a purged log is noticed at the first refused append, not folded on top of."""

from pathlib import Path

import pytest

from fleet_agent.turn_log import TurnLog
from fleet_events import Actor, new_id, streams
from fleet_events.session import TurnCompleted, TurnRequested, TurnStarted, log_subject
from fleet_mesh.natsserver import NatsServer
from fleet_mesh.store import AppendConflict

from .turn_kit import mesh
from .turn_kit import server as server

ACTOR = Actor(service="agent", replica="cache")


async def test_a_kept_fold_equals_a_fold_from_the_start(server: NatsServer, tmp_path: Path) -> None:
    async with mesh(server, tmp_path) as m:
        t = f"t-{new_id()[:8]}"
        kept = TurnLog(m.store, m.codec, ACTOR)
        for i in range(5):
            turn = f"turn{i}"
            await m.append(t, "s", turn, TurnRequested(message=str(i)))
            await kept.load(t, "s")  # folds only what was stored since its last load
            await m.append(t, "s", turn, TurnStarted(replica="r"))
            await m.append(t, "s", f"late{i}", TurnRequested(message="refused"))
            if i % 2:
                await m.append(t, "s", turn, TurnCompleted(answer=str(i)))
            state, head = await kept.load(t, "s")
            fresh, fresh_head = await TurnLog(m.store, m.codec, ACTOR).load(t, "s")
            assert (state, head) == (fresh, fresh_head)


async def test_a_purged_log_is_folded_again_from_the_start(
    server: NatsServer, tmp_path: Path
) -> None:
    async with mesh(server, tmp_path) as m:
        t = f"t-{new_id()[:8]}"
        kept = TurnLog(m.store, m.codec, ACTOR)
        for turn in ("a", "b", "c"):
            await m.append(t, "s", turn, TurnRequested(message="x"))
        stale, stale_head = await kept.load(t, "s")
        assert stale.active == "a"
        await m.js.purge_stream(streams.SESSIONS.name, subject=log_subject(t, "s"))
        await m.append(t, "s", "d", TurnRequested(message="after the purge"))
        with pytest.raises(AppendConflict):
            await kept.append(t, "s", "a", TurnStarted(replica="r"), expect=stale_head)
        state, _ = await kept.load(t, "s")
        assert state.active == "d"
        assert set(state.turns) == {"d"}


async def test_a_log_purged_to_nothing_is_noticed_at_the_refused_append(
    server: NatsServer, tmp_path: Path
) -> None:
    async with mesh(server, tmp_path) as m:
        t = f"t-{new_id()[:8]}"
        kept = TurnLog(m.store, m.codec, ACTOR)
        await m.append(t, "s", "a", TurnRequested(message="x"))
        _, stale_head = await kept.load(t, "s")
        await m.js.purge_stream(streams.SESSIONS.name, subject=log_subject(t, "s"))
        with pytest.raises(AppendConflict):
            await kept.append(t, "s", "a", TurnStarted(replica="r"), expect=stale_head)
        state, head = await kept.load(t, "s")
        assert (state.turns, head.seq) == ({}, 0)
