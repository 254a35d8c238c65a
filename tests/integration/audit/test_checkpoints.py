"""Signed checkpoints: a rewrite before a checkpoint is caught even when re-signed with a
stolen service key; an admin purge through the checkpointer stays verifiable."""

import json
from pathlib import Path
from typing import Any

import pytest
from nats.js import JetStreamContext

from fleet_events import new_id, streams
from fleet_events.codec import Codec
from fleet_events.session import (
    SessionDeleted,
    TurnRequested,
    log_subject,
    run_subject,
    session_filter,
)
from fleet_events.signing import Checkpoint, KeySet, Signer
from fleet_mesh.checkpoints import Checkpointer, checkpoint_file, read_checkpoints
from fleet_mesh.store import EMPTY, EventStore, Head, open_store, verify_export
from fleet_mesh.store.headers import append_headers

from .conftest import envelope


async def _append(store: EventStore, subject: str, texts: list[str], head: Head = EMPTY) -> Head:
    for text in texts:
        head = (
            await store.append(subject, envelope(TurnRequested(message=text), subject), expect=head)
        ).head
    return head


def _checkpointer(
    js: JetStreamContext, store: EventStore, key: Signer, keys: KeySet, tmp_path: Path
) -> Checkpointer:
    path = checkpoint_file(tmp_path, streams.SESSIONS.name)
    return Checkpointer(store, streams.SESSIONS, key, keys, path, js=js)


async def test_a_rewrite_re_signed_with_a_stolen_service_key_is_caught_by_the_checkpoint(
    private_js: JetStreamContext, agent_key: Signer, checkpoint_key: Signer, pinned: KeySet,
    tmp_path: Path,
) -> None:  # fmt: skip
    store = await open_store(private_js, streams.SESSIONS, signer=agent_key)
    session = new_id()
    run, where = run_subject("acme", session, "r1"), session_filter("acme", session)
    await _append(store, run, ["cell 1 = 2", "answer 2"])
    checkpointer = _checkpointer(private_js, store, checkpoint_key, pinned, tmp_path)
    cp = await checkpointer.checkpoint()
    assert cp is not None
    assert run in cp.heads

    # The thief holds the agent's key: purge the run, write a new history, sign it all.
    await private_js.purge_stream(streams.SESSIONS.name, subject=run)
    await _append(store, run, ["cell 1 = 3", "answer 3"])
    assert (await store.verify(where, keys=pinned)).ok  # signatures alone are fooled

    checkpoints = read_checkpoints(checkpoint_file(tmp_path, streams.SESSIONS.name))
    fault = (await store.verify(where, keys=pinned, checkpoints=checkpoints)).fault
    assert fault is not None
    assert (fault.subject, fault.seq) == (run, cp.heads[run][0])
    assert "no longer holds and no purge receipt covers" in fault.reason
    lines = [line async for line in store.export(where, keys=pinned)]
    offline = verify_export(lines, keys=pinned, checkpoints=checkpoints, within=where).fault
    assert offline is not None
    assert offline.seq == cp.heads[run][0]


async def test_a_subject_purged_whole_behind_the_checkpointer_is_missed_by_name(
    private_js: JetStreamContext, agent_key: Signer, checkpoint_key: Signer, pinned: KeySet,
    tmp_path: Path,
) -> None:  # fmt: skip
    store = await open_store(private_js, streams.SESSIONS, signer=agent_key)
    session = new_id()
    log, run = log_subject("acme", session), run_subject("acme", session, "r1")
    await _append(store, log, ["hello"])
    await _append(store, run, ["step"])
    checkpointer = _checkpointer(private_js, store, checkpoint_key, pinned, tmp_path)
    await checkpointer.checkpoint()
    await private_js.purge_stream(streams.SESSIONS.name, subject=run)  # no receipt

    where = session_filter("acme", session)
    checkpoints = read_checkpoints(checkpoint_file(tmp_path, streams.SESSIONS.name))
    fault = (await store.verify(where, keys=pinned, checkpoints=checkpoints)).fault
    assert fault is not None
    assert fault.subject == run


async def test_an_admin_purge_through_the_checkpointer_leaves_a_receipt_that_verifies(
    private_js: JetStreamContext, agent_key: Signer, checkpoint_key: Signer, pinned: KeySet,
    tmp_path: Path,
) -> None:  # fmt: skip
    store = await open_store(private_js, streams.SESSIONS, signer=agent_key)
    session = new_id()
    log, run = log_subject("acme", session), run_subject("acme", session, "r1")
    where = session_filter("acme", session)
    await _append(store, log, ["hello"])
    head = await _append(store, run, ["step 1", "step 2"])
    checkpointer = _checkpointer(private_js, store, checkpoint_key, pinned, tmp_path)
    await checkpointer.checkpoint()

    receipt = await checkpointer.purge(run)
    assert receipt.purged == {run: (head.seq, head.hash)}
    await _append(store, run, ["after the purge"])  # a new chain from genesis
    assert await checkpointer.checkpoint() is not None

    checkpoints = read_checkpoints(checkpoint_file(tmp_path, streams.SESSIONS.name))
    assert [cp.number for cp in checkpoints] == [1, 2, 3]
    verdict = await store.verify(where, keys=pinned, checkpoints=checkpoints)
    assert verdict.ok, verdict.fault
    assert verdict.checked == 2


async def test_the_checkpointer_never_vouches_for_a_raw_publish(
    private_js: JetStreamContext, agent_key: Signer, checkpoint_key: Signer, pinned: KeySet,
    tmp_path: Path,
) -> None:  # fmt: skip
    store = await open_store(private_js, streams.SESSIONS, signer=agent_key)
    good, bad = log_subject("acme", new_id()), log_subject("acme", new_id())
    await _append(store, good, ["fine"])
    forged = envelope(TurnRequested(message="forged"), bad)
    payload = Codec().encode_inline(forged)
    headers = append_headers(forged.id, EMPTY, payload, "turn.requested")
    await private_js.publish(bad, payload, headers=headers, stream=streams.SESSIONS.name)

    cp = await _checkpointer(private_js, store, checkpoint_key, pinned, tmp_path).checkpoint()
    assert cp is not None
    assert set(cp.heads) == {good}


async def test_an_edited_or_dropped_checkpoint_is_caught_and_a_restart_continues_the_chain(
    private_js: JetStreamContext, agent_key: Signer, checkpoint_key: Signer, pinned: KeySet,
    tmp_path: Path,
) -> None:  # fmt: skip
    store = await open_store(private_js, streams.SESSIONS, signer=agent_key)
    subject = log_subject("acme", new_id())
    head = await _append(store, subject, ["one"])
    first = _checkpointer(private_js, store, checkpoint_key, pinned, tmp_path)
    await first.checkpoint()
    await _append(store, subject, ["two"], head)
    again = _checkpointer(private_js, store, checkpoint_key, pinned, tmp_path)  # a restart
    assert again.number == 1
    assert (await again.checkpoint()) is not None
    assert (await again.checkpoint()) is None  # nothing moved

    path = checkpoint_file(tmp_path, streams.SESSIONS.name)
    checkpoints = read_checkpoints(path)
    assert [cp.number for cp in checkpoints] == [1, 2]
    where = subject
    assert (await store.verify(where, keys=pinned, checkpoints=checkpoints)).ok

    row = json.loads(path.read_bytes().splitlines()[0])
    row["heads"][subject][1] = "f" * 64  # an admin "fixes" the pinned hash
    edited = [Checkpoint.parse(json.dumps(row)), checkpoints[1]]
    fault = (await store.verify(where, keys=pinned, checkpoints=edited)).fault
    assert fault is not None
    assert fault.reason.startswith("checkpoints: checkpoint 1: signature by checkpointer")
    fault = (await store.verify(where, keys=pinned, checkpoints=checkpoints[1:])).fault
    assert fault is not None
    assert "checkpoint 2 where checkpoint 1 was expected" in fault.reason
    rogue = KeySet.of([agent_key], require_signatures=True)  # the agent's key cannot checkpoint
    assert (await store.verify(where, keys=rogue, checkpoints=checkpoints)).fault is not None


async def test_an_event_appended_while_a_session_is_purged_is_never_purged_without_a_receipt(
    private_js: JetStreamContext, agent_key: Signer, checkpoint_key: Signer, pinned: KeySet,
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    """The race: a run's step lands after the receipt is signed and before the purge. It used
    to be purged with the rest, named by no receipt (an acknowledged event gone unaccounted).
    Now each round purges only up to the heads its receipt names, and the next round takes a
    receipt for what came in between."""
    store = await open_store(private_js, streams.SESSIONS, signer=agent_key)
    session = new_id()
    log, run = log_subject("acme", session), run_subject("acme", session, "r1")
    where = session_filter("acme", session)
    head = await _append(store, run, ["step 1"])
    await store.append(log, envelope(SessionDeleted(reason="done"), log), expect=EMPTY)
    checkpointer = _checkpointer(private_js, store, checkpoint_key, pinned, tmp_path)
    purge = private_js.purge_stream
    late: list[Head] = []

    async def race_then_purge(name: str, **kwargs: Any) -> bool:
        if not late:  # the receipt is signed and on disk; the purge has not run: a step lands
            late.append(await _append(store, run, ["late step"], head))
        return await purge(name, **kwargs)

    monkeypatch.setattr(private_js, "purge_stream", race_then_purge)
    await checkpointer.purge_session("acme", session)

    checkpoints = read_checkpoints(checkpoint_file(tmp_path, streams.SESSIONS.name))
    receipted = max(cp.purged.get(run, (0, ""))[0] for cp in checkpoints)
    assert late[0].seq <= receipted, "the late step was purged, and no receipt names it"
    left = (await private_js.stream_info(streams.SESSIONS.name, subjects_filter=where)).state
    assert not left.subjects  # a later round took it, under a receipt of its own
    verdict = await store.verify(where, keys=pinned, checkpoints=checkpoints)
    assert verdict.ok, verdict.fault
