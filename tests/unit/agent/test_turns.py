"""The turn fold and its decisions, with no server: admission by the log's order, what a
dispatcher and a worker do with each state, and the fence of `finish`."""

from hypothesis import given
from hypothesis import strategies as st

from fleet_agent import turns
from fleet_agent.turns import SessionTurns, evolve
from fleet_events import Event
from fleet_events.session import (
    CancelRequested,
    SessionDeleted,
    TurnCancelled,
    TurnCompleted,
    TurnFailed,
    TurnRefused,
    TurnRequested,
    TurnStarted,
)


def fold(*facts: tuple[str | None, Event]) -> SessionTurns:
    state = SessionTurns()
    for seq, (turn, event) in enumerate(facts, 1):
        evolve(state, event, turn=turn, seq=seq, event_id=f"e{seq}")
    return state


ASK = TurnRequested(message="hi")
DONE = TurnCompleted(answer="ok")


def start(state: SessionTurns, turn: str, delivery: int = 1, restartable: bool = True) -> object:
    return turns.start(
        state, turn, delivery=delivery, max_attempts=3, replica="r2", restartable=restartable
    )


def test_a_request_while_another_runs_is_refused_naming_the_running_turn() -> None:
    state = fold(("a", ASK), ("b", ASK))
    decision = turns.dispatch(state, "b")
    assert isinstance(decision, turns.Refuse)
    assert (decision.event.reason, decision.event.active_turn) == ("busy", "a")
    assert isinstance(turns.dispatch(state, "a"), turns.Dispatch)


def test_once_the_running_turn_ends_the_next_request_is_admitted() -> None:
    for end in (DONE, TurnFailed(error="x"), TurnCancelled()):
        state = fold(("a", ASK), ("a", end), ("b", ASK))
        assert isinstance(turns.dispatch(state, "b"), turns.Dispatch)


def test_the_order_of_the_log_decides_not_what_came_after() -> None:
    """b arrived while a ran: it stays refused after a ends (every replica decides the same)."""
    state = fold(("a", ASK), ("b", ASK), ("a", DONE))
    assert isinstance(turns.dispatch(state, "b"), turns.Refuse)


def test_a_recorded_refusal_is_not_recorded_twice() -> None:
    refusal = TurnRefused(reason="busy", message="m", active_turn="a")
    state = fold(("a", ASK), ("b", ASK), ("b", refusal))
    assert isinstance(turns.dispatch(state, "b"), turns.Nothing)


def test_a_turn_asked_twice_keeps_its_first_request() -> None:
    state = fold(("a", ASK), ("a", TurnRequested(message="again")))
    assert state.turns["a"].requested_seq == 1
    assert state.active == "a"


def test_a_deleted_session_refuses_new_turns() -> None:
    decision = turns.dispatch(fold((None, SessionDeleted()), ("a", ASK)), "a")
    assert isinstance(decision, turns.Refuse)
    assert decision.event.reason == "session_deleted"


def test_a_request_without_a_usable_turn_id_is_refused_under_its_event_id() -> None:
    state = fold(("a.b", ASK))
    decision = turns.dispatch(state, "e1")
    assert isinstance(decision, turns.Refuse)
    assert decision.event.reason == "malformed"
    assert "'a.b'" in decision.event.message
    assert state.active is None  # it blocks nothing


def test_a_started_or_ended_turn_is_not_dispatched_again() -> None:
    started = fold(("a", ASK), ("a", TurnStarted(replica="r1")))
    assert isinstance(turns.dispatch(started, "a"), turns.Nothing)
    ended = fold(("a", ASK), ("a", TurnStarted(replica="r1")), ("a", DONE))
    assert isinstance(turns.dispatch(ended, "a"), turns.Nothing)


def test_a_worker_starts_the_next_attempt_after_a_redelivery() -> None:
    state = fold(("a", ASK), ("a", TurnStarted(replica="r1", attempt=1)))
    decision = start(state, "a", delivery=2)
    assert isinstance(decision, turns.Start)
    assert decision.event == TurnStarted(replica="r2", attempt=2)
    assert decision.message_seq == 1


def test_a_second_work_item_for_a_running_turn_is_dropped() -> None:
    state = fold(("a", ASK), ("a", TurnStarted(replica="r1")))
    assert isinstance(start(state, "a", delivery=1), turns.Drop)


def test_an_ended_turn_is_only_acked() -> None:
    """A replica that died after storing the end but before its ack: nothing is repeated."""
    state = fold(("a", ASK), ("a", TurnStarted(replica="r1")), ("a", DONE))
    assert isinstance(start(state, "a", delivery=2), turns.Drop)


def test_a_cancel_before_the_start_ends_the_turn_without_running_it() -> None:
    state = fold(("a", ASK), ("a", CancelRequested(reason="no")))
    decision = start(state, "a")
    assert isinstance(decision, turns.End)
    assert decision.event == TurnCancelled(reason="no", partial="", attempt=0)


def test_a_cancel_after_the_end_changes_nothing() -> None:
    state = fold(("a", ASK), ("a", DONE), ("a", CancelRequested()))
    assert not state.turns["a"].cancel_requested


def test_past_max_attempts_the_delivery_records_the_poison_turn() -> None:
    state = fold(("a", ASK), ("a", TurnStarted(replica="r1", attempt=3)))
    decision = start(state, "a", delivery=4)
    assert isinstance(decision, turns.End)
    assert isinstance(decision.event, TurnFailed)
    assert (decision.event.code, decision.event.retryable) == ("poison", False)
    assert "delivered 3 times and never finished" in decision.event.error


def test_a_runner_that_cannot_restart_fails_a_lost_turn_as_retryable() -> None:
    state = fold(("a", ASK), ("a", TurnStarted(replica="r1")))
    decision = start(state, "a", delivery=2, restartable=False)
    assert isinstance(decision, turns.End)
    assert isinstance(decision.event, TurnFailed)
    assert (decision.event.code, decision.event.retryable) == ("replica_lost", True)
    assert "r1" in decision.event.error


def test_only_the_current_attempt_may_record_the_end() -> None:
    state = fold(
        ("a", ASK), ("a", TurnStarted(replica="r1")), ("a", TurnStarted(replica="r2", attempt=2))
    )
    assert isinstance(turns.finish(state, "a", attempt=1, event=DONE), turns.Superseded)
    assert turns.finish(state, "a", attempt=2, event=DONE) == turns.Append(DONE)
    ended = fold(("a", ASK), ("a", TurnStarted(replica="r1")), ("a", DONE))
    assert isinstance(turns.finish(ended, "a", attempt=1, event=DONE), turns.Superseded)


OPS = st.lists(
    st.tuples(st.sampled_from(["ask", "end", "cancel"]), st.sampled_from("abcd")), max_size=40
)


@given(OPS)
def test_at_most_one_admitted_turn_is_ever_open(ops: list[tuple[str, str]]) -> None:
    state = SessionTurns()
    for seq, (op, turn) in enumerate(ops, 1):
        event: Event = ASK if op == "ask" else DONE if op == "end" else CancelRequested()
        evolve(state, event, turn=turn, seq=seq, event_id=f"e{seq}")
        open_admitted = [t.turn for t in state.turns.values() if t.admitted and t.ended is None]
        assert open_admitted == ([state.active] if state.active else [])
