"""The session fold, event by event, and the core-memory and input decisions."""

from collections.abc import Callable
from typing import Any

import msgspec
import pytest

from fleet_events import Actor, BlobRef, Envelope, Event, utc_now
from fleet_events.run import LlmCalled, RunStarted
from fleet_events.session import (
    CORE_MEMORY_LIMITS,
    CoreMemory,
    CoreMemoryChanged,
    CoreMemoryRefused,
    DocumentActivated,
    DocumentLoaded,
    DocumentRef,
    DocumentRemoved,
    HistoryTurn,
    InputExpired,
    InputProvided,
    InputRefused,
    InputRequested,
    InterpreterState,
    MemoryFile,
    MemoryFileWritten,
    SandboxAttached,
    SandboxDetached,
    SessionDeleted,
    SessionImage,
    SessionImported,
    SessionRenamed,
    SessionRestored,
    TurnCancelled,
    TurnCompleted,
    TurnFailed,
    TurnRefused,
    TurnRequested,
    log_subject,
)
from fleet_events.session_fold import (
    EMPTY,
    FOLD,
    SessionState,
    answer_input,
    append_core_memory,
    evolve,
    history,
    replace_core_memory,
    skipped_line,
)
from fleet_mesh.store import StoredEvent

ACTOR = Actor(service="agent", replica="a-0")


class FutureFact(Event, frozen=True, kw_only=True, tag="future.fact"):
    """Stands for a type a newer replica writes: it is in no catalog this fold knows."""

    note: str = ""


def stored(
    data: Event, *, turn: str | None = None, run: str | None = None, id: str = "e", seq: int = 1
) -> StoredEvent:
    env = Envelope(
        id=id, tenant="acme", session="s1", turn=turn, run=run, actor=ACTOR, ts=utc_now(),
        data=data,
    )  # fmt: skip
    return StoredEvent(
        subject=log_subject("acme", "s1"), seq=seq, envelope=env, hash="", prev_hash=""
    )


def fold(*events: StoredEvent | Event, state: SessionState = EMPTY) -> SessionState:
    for event in events:
        state = evolve(state, event if isinstance(event, StoredEvent) else stored(event))
    return state


def doc(alias: str, chars: int = 10) -> DocumentRef:
    blob = BlobRef(object=f"acme/{alias}", sha256=alias * 4, size=chars)
    return DocumentRef(alias=alias, source="upload", origin=f"{alias}.txt", blob=blob, chars=chars)


def turn(
    turn_id: str, question: str, answer: str, ending: type[Event] = TurnCompleted
) -> list[StoredEvent]:
    ends: dict[type[Event], Event] = {
        TurnCompleted: TurnCompleted(answer=answer),
        TurnFailed: TurnFailed(error="x"),
        TurnCancelled: TurnCancelled(reason="user"),
    }
    return [
        stored(TurnRequested(message=question), turn=turn_id),
        stored(ends[ending], turn=turn_id),
    ]


# -- history ---------------------------------------------------------------------------------


def test_an_empty_log_is_the_empty_state() -> None:
    assert fold() == FOLD.initial() == SessionState()
    assert history(EMPTY) == []
    assert skipped_line(EMPTY) is None


def test_completed_turns_become_history_in_order_and_others_do_not() -> None:
    state = fold(
        *turn("t1", "hi?", "hello"),
        *turn("t2", "fail?", "", TurnFailed),
        *turn("t3", "stop?", "", TurnCancelled),
        *turn("t4", "and?", "more"),
    )
    assert history(state) == [
        {"question": "hi?", "answer": "hello"},
        {"question": "and?", "answer": "more"},
    ]
    assert [t.turn for t in state.image.turns] == ["t1", "t4"]
    assert state.open_turns == ()


def test_interleaved_turns_pair_each_answer_with_its_own_question() -> None:
    state = fold(
        stored(TurnRequested(message="first"), turn="a"),
        stored(TurnRequested(message="second"), turn="b"),
        stored(TurnCompleted(answer="to second"), turn="b"),
        stored(TurnCompleted(answer="to first"), turn="a"),
    )
    assert history(state) == [
        {"question": "second", "answer": "to second"},
        {"question": "first", "answer": "to first"},
    ]


def test_a_cancelled_turn_keeps_its_partial_answer_marked_as_cut_short() -> None:
    state = fold(
        stored(TurnRequested(message="long job?"), turn="t1"),
        stored(TurnCancelled(reason="user", partial="halfway"), turn="t1"),
    )
    assert history(state) == [{"question": "long job?", "answer": "halfway [cancelled]"}]


def test_a_refused_request_closes_only_its_own_turn() -> None:
    state = fold(
        stored(TurnRequested(message="first"), turn="t1"),
        ask(turn_id="t1"),
        stored(TurnRequested(message="second"), turn="t2"),
        stored(TurnRefused(reason="busy", message="m", active_turn="t1"), turn="t2"),
    )
    assert [t.turn for t in state.open_turns] == ["t1"]
    assert state.pending_input is not None
    assert fold(stored(TurnCompleted(answer="late"), turn="t2"), state=state).image.turns == ()


def test_the_same_turn_asked_twice_keeps_the_first_question() -> None:
    state = fold(
        stored(TurnRequested(message="first"), turn="t1"),
        stored(TurnRequested(message="again"), turn="t1"),
        stored(TurnCompleted(answer="a"), turn="t1"),
    )
    assert history(state) == [{"question": "first", "answer": "a"}]
    assert state.open_turns == ()


def test_an_answer_with_no_open_question_adds_nothing() -> None:
    assert fold(stored(TurnCompleted(answer="orphan"), turn="t9")).image.turns == ()
    assert fold(TurnRequested(message="no turn id")).open_turns == ()


# -- core memory -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("block", "limit"), [("persona", 2000), ("human", 2000), ("scratchpad", 1000)]
)
def test_each_block_takes_text_up_to_its_limit_and_refuses_one_more(block: str, limit: int) -> None:
    assert CORE_MEMORY_LIMITS[block] == limit
    at_limit = append_core_memory(CoreMemory(), block, "x" * limit)
    assert isinstance(at_limit, CoreMemoryChanged)
    assert getattr(fold(at_limit).image.core_memory, block) == "x" * limit
    over = append_core_memory(CoreMemory(), block, "x" * (limit + 1))
    assert isinstance(over, CoreMemoryRefused)
    assert (over.reason, over.limit, over.length) == ("over_limit", limit, limit + 1)
    assert f"{limit + 1} characters" in over.message
    assert f"limit of {limit}" in over.message
    assert block in over.message


def test_append_joins_on_a_new_line_and_counts_the_newline() -> None:
    memory = CoreMemory(scratchpad="a" * 500)
    changed = append_core_memory(memory, "scratchpad", "b" * 499)
    assert isinstance(changed, CoreMemoryChanged)
    assert changed.value == "a" * 500 + "\n" + "b" * 499
    assert (changed.op, changed.text) == ("append", "b" * 499)
    refused = append_core_memory(memory, "scratchpad", "b" * 500)
    assert isinstance(refused, CoreMemoryRefused)
    assert refused.length == 1001


def test_a_refused_change_leaves_memory_as_it_was() -> None:
    before = fold(CoreMemoryChanged(block="human", op="append", value="likes tea"))
    refused = append_core_memory(before.image.core_memory, "human", "y" * 2000)
    assert isinstance(refused, CoreMemoryRefused)
    assert fold(refused, state=before) == before


def test_append_refuses_empty_text_and_unknown_blocks() -> None:
    empty = append_core_memory(CoreMemory(), "persona", "  ")
    assert isinstance(empty, CoreMemoryRefused)
    assert empty.reason == "empty"
    unknown = append_core_memory(CoreMemory(), "notes", "x")
    assert isinstance(unknown, CoreMemoryRefused)
    assert unknown.reason == "unknown_block"
    assert "'notes'" in unknown.message
    assert "persona, human, scratchpad" in unknown.message


def test_replace_changes_exactly_the_one_occurrence() -> None:
    memory = CoreMemory(human="name: Ada; likes: tea")
    changed = replace_core_memory(memory, "human", "tea", "coffee")
    assert isinstance(changed, CoreMemoryChanged)
    assert changed.value == "name: Ada; likes: coffee"
    assert (changed.op, changed.old, changed.text) == ("replace", "tea", "coffee")
    assert fold(changed).image.core_memory.human == "name: Ada; likes: coffee"
    deleted = replace_core_memory(memory, "human", "; likes: tea", "")
    assert isinstance(deleted, CoreMemoryChanged)
    assert deleted.value == "name: Ada"


@pytest.mark.parametrize(
    ("current", "old", "new", "reason", "says"),
    [
        ("abc", "zzz", "y", "not_found", "'zzz' is not in"),
        ("ab ab", "ab", "y", "ambiguous", "occurs 2 times"),
        ("abc", "", "y", "empty", "exact text"),
        ("abc", "b", "y" * 1000, "over_limit", "1002 characters"),
    ],
)
def test_replace_refusals_say_what_to_do(
    current: str, old: str, new: str, reason: str, says: str
) -> None:
    refused = replace_core_memory(CoreMemory(scratchpad=current), "scratchpad", old, new)
    assert isinstance(refused, CoreMemoryRefused)
    assert refused.reason == reason
    assert refused.op == "replace"
    assert says in refused.message


def test_replace_to_exactly_the_limit_is_allowed() -> None:
    changed = replace_core_memory(CoreMemory(scratchpad="abc"), "scratchpad", "b", "y" * 998)
    assert isinstance(changed, CoreMemoryChanged)
    assert len(changed.value) == 1000
    unknown = replace_core_memory(CoreMemory(), "soul", "a", "b")
    assert isinstance(unknown, CoreMemoryRefused)
    assert unknown.reason == "unknown_block"


def test_a_change_to_a_block_this_version_lacks_is_ignored_not_fatal() -> None:
    assert fold(CoreMemoryChanged(block="notes", op="append", value="x")) == EMPTY


# -- memory files, documents, the interpreter ------------------------------------------------


def test_memory_files_are_kept_by_path_latest_write_last() -> None:
    a1, b, a2 = (
        MemoryFile(path=p, sha256=h, size=1) for p, h in [("a", "1"), ("b", "2"), ("a", "3")]
    )
    state = fold(*(MemoryFileWritten(file=f) for f in (a1, b, a2)))
    assert state.image.memory_files == (b, a2)


def test_loading_makes_a_document_active_and_most_recent() -> None:
    a, b = doc("a"), doc("b")
    state = fold(DocumentLoaded(document=a), DocumentLoaded(document=b))
    assert state.image.documents == (a, b)
    assert state.image.active_document == "b"
    state = fold(DocumentActivated(alias="a"), state=state)
    assert state.image.documents == (b, a)
    assert state.image.active_document == "a"
    reloaded = doc("b", chars=99)
    state = fold(DocumentLoaded(document=reloaded), state=state)
    assert state.image.documents == (a, reloaded)


def test_activating_an_unknown_document_changes_nothing() -> None:
    state = fold(DocumentLoaded(document=doc("a")))
    assert fold(DocumentActivated(alias="ghost"), state=state) == state


def test_removing_the_active_document_leaves_none_active() -> None:
    state = fold(DocumentLoaded(document=doc("a")), DocumentLoaded(document=doc("b")))
    kept = fold(DocumentRemoved(alias="a"), state=state)
    assert [d.alias for d in kept.image.documents] == ["b"]
    assert kept.image.active_document == "b"
    gone = fold(DocumentRemoved(alias="b"), state=kept)
    assert gone.image.documents == ()
    assert gone.image.active_document is None


def test_a_detached_sandbox_keeps_what_its_replacement_needs() -> None:
    box = InterpreterState(
        sandbox="sb1", workspace="/w", repo_url="https://example.invalid/r.git", ref="main",
        context_paths=("src",), volume="vol", volume_subpath="s1",
    )  # fmt: skip
    state = fold(SandboxAttached(interpreter=box))
    assert state.image.interpreter == box
    assert fold(SandboxDetached(sandbox="other"), state=state) == state
    detached = fold(SandboxDetached(sandbox="sb1", reason="gone"), state=state)
    assert detached.image.interpreter == msgspec.structs.replace(box, sandbox=None)
    new = msgspec.structs.replace(box, sandbox="sb2", workspace="/w2")
    replaced = fold(SandboxAttached(interpreter=new, replaces="sb1"), state=detached)
    assert replaced.image.interpreter == new


def test_detach_with_no_sandbox_is_harmless() -> None:
    assert fold(SandboxDetached(sandbox="sb1")) == EMPTY


# -- asking the user -------------------------------------------------------------------------


def ask(request_id: str = "q1", turn_id: str = "t1") -> StoredEvent:
    question = InputRequested(request_id=request_id, question="which?", options=("a", "b"))
    return stored(question, turn=turn_id, run="r1")


def test_a_question_is_pending_until_answered_or_expired() -> None:
    asked = fold(ask())
    pending = asked.pending_input
    assert pending is not None
    assert (pending.request_id, pending.question, pending.options) == ("q1", "which?", ("a", "b"))
    assert (pending.turn, pending.run) == ("t1", "r1")
    assert fold(InputProvided(request_id="q1", answer="a"), state=asked).pending_input is None
    assert fold(InputExpired(request_id="q1"), state=asked).pending_input is None
    assert fold(InputProvided(request_id="q0", answer="a"), state=asked) == asked
    assert fold(InputExpired(request_id="q0"), state=asked) == asked


def test_a_question_ends_with_its_turn_and_only_its_turn() -> None:
    asked = fold(stored(TurnRequested(message="m"), turn="t1"), ask())
    assert fold(stored(TurnCancelled(), turn="t2"), state=asked).pending_input is not None
    assert fold(stored(TurnCancelled(), turn="t1"), state=asked).pending_input is None


def test_answers_are_checked_against_the_pending_question() -> None:
    asked = fold(ask())
    assert answer_input(asked, "q1", "a", option="a") == InputProvided(
        request_id="q1", answer="a", option="a"
    )
    assert answer_input(asked, "q1", "free text") == InputProvided(
        request_id="q1", answer="free text"
    )
    cases: list[tuple[SessionState, str, str, str, str]] = [
        (EMPTY, "q1", "", "none_pending", "no question is waiting"),
        (asked, "q2", "", "other_request", "answer 'q1' instead"),
        (asked, "q1", "c", "unknown_option", "choose one of 'a', 'b'"),
    ]
    for state, request_id, option, reason, says in cases:
        refused = answer_input(state, request_id, "x", option=option)
        assert isinstance(refused, InputRefused)
        assert refused.reason == reason
        assert says in refused.message
        assert fold(refused, state=state) == state


def test_an_option_is_refused_when_none_were_offered() -> None:
    asked = fold(stored(InputRequested(request_id="q1", question="why?")))
    refused = answer_input(asked, "q1", "x", option="a")
    assert isinstance(refused, InputRefused)
    assert "(none; answer in text)" in refused.message


# -- import, restore, delete -----------------------------------------------------------------


def busy_state() -> SessionState:
    return fold(
        *turn("t1", "q", "a"),
        stored(TurnRequested(message="open"), turn="t2"),
        ask(turn_id="t2"),
        CoreMemoryChanged(block="persona", op="append", value="terse"),
        DocumentLoaded(document=doc("a")),
        SandboxAttached(interpreter=InterpreterState(sandbox="sb1", volume="v")),
        MemoryFileWritten(file=MemoryFile(path="m", sha256="1", size=1)),
    )


def test_import_replaces_everything_never_merges() -> None:
    image = SessionImage(
        turns=(HistoryTurn(question="old q", answer="old a"),),
        core_memory=CoreMemory(human="imported"),
        documents=(doc("z"),),
        active_document="z",
    )
    busy = busy_state()
    state = fold(SessionImported(image=image, source_head_hash="h" * 64), state=busy)
    assert busy.requests  # the turn requests stay known: the log still holds them
    assert state == SessionState(image=image, requests=busy.requests)
    after = fold(*turn("t3", "new", "answer"), state=state)
    assert history(after) == [
        {"question": "old q", "answer": "old a"},
        {"question": "new", "answer": "answer"},
    ]


def test_a_turn_left_open_before_an_import_gets_no_history_entry() -> None:
    state = fold(SessionImported(image=SessionImage()), state=busy_state())
    assert fold(stored(TurnCompleted(answer="late"), turn="t2"), state=state).image.turns == ()


def test_restoring_the_empty_image_resets_everything() -> None:
    busy = busy_state()
    restored = fold(SessionRestored(image=SessionImage(), upto_seq=0), state=busy)
    assert restored == msgspec.structs.replace(EMPTY, requests=busy.requests)  # the log's own


def test_delete_is_a_tombstone_that_import_does_not_lift() -> None:
    deleted = fold(SessionDeleted(reason="user"), state=busy_state())
    assert deleted.deleted
    assert deleted.image == busy_state().image
    assert fold(SessionImported(image=SessionImage()), state=deleted).deleted


# -- what the fold does not know -------------------------------------------------------------


def test_unknown_types_are_skipped_counted_and_named_once() -> None:
    base = busy_state()
    state = fold(FutureFact(note="1"), FutureFact(note="2"), state=base)
    assert state.image == base.image
    assert state.pending_input == base.pending_input
    assert (state.skipped, state.skipped_count) == (("future.fact",), 2)
    line = skipped_line(state)
    assert line is not None
    assert "skipped 2 event(s)" in line
    assert "future.fact" in line


def test_skips_survive_an_import_so_the_caller_still_hears_of_them() -> None:
    state = fold(FutureFact(), SessionImported(image=SessionImage()))
    assert (state.skipped, state.skipped_count) == (("future.fact",), 1)


def test_known_events_of_other_concerns_are_not_reported_as_unknown() -> None:
    others: list[Event] = [
        SessionRenamed(title="t"),
        RunStarted(kind="rlm", tree="tr"),
        LlmCalled(role="planner", model="m"),
        CoreMemoryRefused(block="human", op="append", reason="over_limit", message="m"),
    ]
    assert fold(*others) == EMPTY


# -- the fold as the store takes it ----------------------------------------------------------


def test_the_fold_has_a_name_a_version_and_a_snapshot_type() -> None:
    assert (FOLD.name, FOLD.version, FOLD.state_type) == ("session", 2, SessionState)
    state = busy_state()
    assert FOLD.evolve(EMPTY, stored(DocumentLoaded(document=doc("a")))) == fold(
        DocumentLoaded(document=doc("a"))
    )
    raw: Any = msgspec.msgpack.encode(state)
    assert msgspec.msgpack.decode(raw, type=FOLD.state_type) == state


# -- every refusal, whole: the model reads these words, and projections read these fields -------


@pytest.mark.parametrize(
    ("decided", "expected"),
    [
        (
            lambda: append_core_memory(CoreMemory(), "notes", "x"),
            CoreMemoryRefused(
                block="notes", op="append", reason="unknown_block", limit=0, length=0,
                message="there is no core-memory block 'notes': use one of persona, human, "
                "scratchpad",
            ),
        ),
        (
            lambda: append_core_memory(CoreMemory(), "human", " "),
            CoreMemoryRefused(
                block="human", op="append", reason="empty", limit=2000, length=0,
                message="nothing to append: give the text to add",
            ),
        ),
        (
            lambda: append_core_memory(CoreMemory(persona="p"), "persona", "y" * 1999),
            CoreMemoryRefused(
                block="persona", op="append", reason="over_limit", limit=2000, length=2001,
                message="core-memory block 'persona' would hold 2001 characters, over its limit "
                "of 2000: shorten the text, or replace older content in 'persona' first",
            ),
        ),
        (
            lambda: replace_core_memory(CoreMemory(), "soul", "a", "b"),
            CoreMemoryRefused(
                block="soul", op="replace", reason="unknown_block", limit=0, length=0,
                message="there is no core-memory block 'soul': use one of persona, human, "
                "scratchpad",
            ),
        ),
        (
            lambda: replace_core_memory(CoreMemory(human="h"), "human", "", "b"),
            CoreMemoryRefused(
                block="human", op="replace", reason="empty", limit=2000, length=0,
                message="give the exact text to replace (old)",
            ),
        ),
        (
            lambda: replace_core_memory(CoreMemory(human="h"), "human", "z", "b"),
            CoreMemoryRefused(
                block="human", op="replace", reason="not_found", limit=2000, length=0,
                message="'z' is not in core-memory block 'human': quote its current text exactly",
            ),
        ),
        (
            lambda: replace_core_memory(CoreMemory(human="a-a-a"), "human", "a", "b"),
            CoreMemoryRefused(
                block="human", op="replace", reason="ambiguous", limit=2000, length=0,
                message="'a' occurs 3 times in core-memory block 'human': quote a longer "
                "excerpt that occurs once",
            ),
        ),
        (
            lambda: replace_core_memory(CoreMemory(scratchpad="ab"), "scratchpad", "b", "c" * 1000),
            CoreMemoryRefused(
                block="scratchpad", op="replace", reason="over_limit", limit=1000, length=1001,
                message="core-memory block 'scratchpad' would hold 1001 characters, over its "
                "limit of 1000: shorten the text, or replace older content in 'scratchpad' first",
            ),
        ),
    ],
)  # fmt: skip
def test_each_memory_refusal_in_full(
    decided: Callable[[], Event], expected: CoreMemoryRefused
) -> None:
    assert decided() == expected


def test_each_input_refusal_in_full() -> None:
    asked = fold(ask())
    bare = fold(stored(InputRequested(request_id="q1", question="why?")))
    assert answer_input(EMPTY, "q9", "x") == InputRefused(
        request_id="q9",
        reason="none_pending",
        message="no question is waiting for an answer (request 'q9' was answered, expired or "
        "never asked)",
    )
    assert answer_input(asked, "q2", "x") == InputRefused(
        request_id="q2",
        reason="other_request",
        message="request 'q2' is not the pending one: answer 'q1' instead",
    )
    assert answer_input(asked, "q1", "x", option="c") == InputRefused(
        request_id="q1",
        reason="unknown_option",
        message="option 'c' was not offered: choose one of 'a', 'b'",
    )
    assert answer_input(bare, "q1", "x", option="a") == InputRefused(
        request_id="q1",
        reason="unknown_option",
        message="option 'a' was not offered: choose one of (none; answer in text)",
    )


def test_the_pending_question_keeps_its_timeout() -> None:
    asked = fold(stored(InputRequested(request_id="q1", question="?", timeout_s=90.0)))
    assert asked.pending_input is not None
    assert asked.pending_input.timeout_s == 90.0


def test_the_skip_line_in_full() -> None:
    state = msgspec.structs.replace(EMPTY, skipped=("x.a", "x.b"), skipped_count=3)
    assert skipped_line(state) == (
        "skipped 3 event(s) of type(s) this agent version does not know: x.a, x.b; the session "
        "state was built without them (upgrade the agent to read them)"
    )
