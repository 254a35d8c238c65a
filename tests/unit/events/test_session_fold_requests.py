"""The session fold remembers every turn request by its event id, which is what a retried
request under an idempotency key is answered from; and the reads a turn request and a cancel
make of the state (documents, the active turn, a known turn)."""

import msgspec

from fleet_events import Actor, BlobRef, Envelope, Event, utc_now
from fleet_events.session import (
    DocumentLoaded,
    DocumentRef,
    DocumentRemoved,
    SessionImage,
    SessionRestored,
    TurnCompleted,
    TurnFailed,
    TurnRequested,
    log_subject,
)
from fleet_events.session_fold import (
    EMPTY,
    FOLD,
    AskedTurn,
    SessionState,
    active_turn,
    asked_turn,
    earlier_request,
    evolve,
    missing_documents,
    request_digest,
)
from fleet_mesh.store import StoredEvent

ACTOR = Actor(service="gateway", replica="g-0")


def stored(data: Event, *, id: str, seq: int, turn: str | None = None) -> StoredEvent:
    env = Envelope(
        id=id, tenant="acme", session="s1", turn=turn, actor=ACTOR, ts=utc_now(), data=data
    )
    return StoredEvent(
        subject=log_subject("acme", "s1"), seq=seq, envelope=env, hash="", prev_hash=""
    )


def fold(*events: StoredEvent, state: SessionState = EMPTY) -> SessionState:
    for event in events:
        state = evolve(state, event)
    return state


def doc(alias: str) -> DocumentRef:
    blob = BlobRef(object=f"acme/{alias}", sha256="0" * 64, size=1)
    return DocumentRef(alias=alias, source="upload", origin=f"{alias}.txt", blob=blob, chars=1)


ASK = TurnRequested(message="summarise", mode="rlm_only", document_ids=("a",))


def test_a_request_is_remembered_by_its_event_id_with_its_turn_seq_and_digest() -> None:
    state = fold(stored(ASK, id="k1", seq=7, turn="t1"))
    assert state.requests == {"k1": AskedTurn(turn="t1", seq=7, digest=request_digest(ASK))}


def test_the_first_request_under_an_id_stands() -> None:
    other = TurnRequested(message="another")
    state = fold(stored(ASK, id="k1", seq=7, turn="t1"), stored(other, id="k1", seq=9, turn="t2"))
    assert state.requests["k1"] == AskedTurn(turn="t1", seq=7, digest=request_digest(ASK))


def test_requests_outlive_their_turns_and_any_number_of_later_events() -> None:
    events = [stored(ASK, id="k1", seq=1, turn="t1"), stored(TurnCompleted(answer="a"), id="x",
              seq=2, turn="t1")]  # fmt: skip
    for n in range(3, 300):
        events.append(stored(TurnRequested(message=f"m{n}"), id=f"k{n}", seq=n, turn=f"t{n}"))
        events.append(stored(TurnFailed(error="e"), id=f"f{n}", seq=n, turn=f"t{n}"))
    state = fold(*events)
    assert state.requests["k1"].turn == "t1"
    assert len(state.requests) == 298


def test_a_restore_keeps_the_requests_the_log_holds() -> None:
    state = fold(
        stored(ASK, id="k1", seq=1, turn="t1"),
        stored(SessionRestored(image=SessionImage()), id="r", seq=2),
    )
    assert list(state.requests) == ["k1"]
    assert state.open_turns == ()


def test_a_request_without_a_turn_is_not_remembered() -> None:
    assert fold(stored(ASK, id="k1", seq=1)).requests == {}


def test_the_digest_tells_every_field_of_a_request_apart() -> None:
    variants = [
        ASK,
        msgspec.structs.replace(ASK, message="summarise!"),
        msgspec.structs.replace(ASK, mode="auto"),
        msgspec.structs.replace(ASK, document_ids=()),
        msgspec.structs.replace(ASK, context_paths=("x",)),
        msgspec.structs.replace(ASK, repo_url="https://example.org/r.git"),
        msgspec.structs.replace(ASK, repo_url="https://example.org/r.git", repo_ref="main"),
    ]
    assert len({request_digest(v) for v in variants}) == len(variants)
    assert request_digest(ASK) == request_digest(TurnRequested(**msgspec.structs.asdict(ASK)))


def test_an_earlier_request_is_found_and_told_same_or_different() -> None:
    state = fold(stored(ASK, id="k1", seq=4, turn="t1"))
    assert earlier_request(state, "k2", ASK) is None
    found = earlier_request(state, "k1", ASK)
    assert found == (AskedTurn(turn="t1", seq=4, digest=request_digest(ASK)), True)
    changed = earlier_request(state, "k1", TurnRequested(message="else"))
    assert changed is not None
    assert changed[1] is False


def test_missing_documents_are_those_not_loaded_now_in_the_order_named() -> None:
    state = fold(
        stored(DocumentLoaded(document=doc("a")), id="d1", seq=1),
        stored(DocumentLoaded(document=doc("b")), id="d2", seq=2),
        stored(DocumentRemoved(alias="a"), id="d3", seq=3),
    )
    assert missing_documents(state, ("c", "a", "b", "z")) == ["c", "a", "z"]
    assert missing_documents(state, ("b",)) == []
    assert missing_documents(state, ()) == []


def test_the_active_turn_is_the_latest_open_one() -> None:
    assert active_turn(EMPTY) is None
    state = fold(
        stored(TurnRequested(message="one"), id="k1", seq=1, turn="t1"),
        stored(TurnRequested(message="two"), id="k2", seq=2, turn="t2"),
    )
    assert active_turn(state) == "t2"
    state = fold(stored(TurnFailed(error="x"), id="f", seq=3, turn="t2"), state=state)
    assert active_turn(state) == "t1"
    state = fold(stored(TurnCompleted(answer="y"), id="c", seq=4, turn="t1"), state=state)
    assert active_turn(state) is None
    assert asked_turn(state, "t1")
    assert asked_turn(state, "t2")
    assert not asked_turn(state, "t3")


def test_a_snapshot_of_the_requests_round_trips() -> None:
    state = fold(stored(ASK, id="k1", seq=4, turn="t1"))
    again = msgspec.msgpack.decode(msgspec.msgpack.encode(state), type=FOLD.state_type)
    assert again == state
    assert (FOLD.name, FOLD.version) == ("session", 2)
