"""Parking a turn on a question, as pure decisions: the turn fold's park and resume, and the
ReAct trajectory rebuilt from a parked run's record."""

from fleet_agent import turns
from fleet_agent.chat.resume import answer_text, rebuild
from fleet_events import Event
from fleet_events.run import IterationPlanned, LlmCalled, RunStarted, ToolCalled, ToolReturned
from fleet_events.session import (
    CancelRequested,
    InputExpired,
    InputProvided,
    TurnCancelled,
    TurnParked,
    TurnRequested,
    TurnStarted,
)

TURN = "turn-1"


def fold(*events: Event) -> turns.SessionTurns:
    state = turns.SessionTurns()
    for seq, event in enumerate(events, 1):
        turn = None if isinstance(event, InputProvided | InputExpired) else TURN
        turns.evolve(state, event, turn=turn, seq=seq, event_id=f"e{seq}")
    return state


ASKED = (TurnRequested(message="deploy"), TurnStarted(replica="a", attempt=1))


def start(state: turns.SessionTurns, delivery: int = 1) -> object:
    return turns.start(
        state, TURN, delivery=delivery, max_attempts=3, replica="b", restartable=False
    )


def test_a_parked_turn_without_an_answer_is_not_run_and_not_resumable() -> None:
    state = fold(*ASKED, TurnParked(request_id="q1", attempt=1))
    assert state.active == TURN  # still the session's turn: another message is refused busy
    assert turns.resumable(state) == []
    decision = start(state)
    assert isinstance(decision, turns.Drop)
    assert "parked on input request q1" in decision.why


def test_the_answer_makes_it_resumable_as_attempt_two() -> None:
    state = fold(
        *ASKED, TurnParked(request_id="q1", attempt=1), InputProvided(request_id="q1", answer="eu")
    )
    assert [t.turn for t in turns.resumable(state)] == [TURN]
    decision = start(state)
    assert isinstance(decision, turns.Start)
    assert decision.event.attempt == 2
    resumed = fold(
        *ASKED,
        TurnParked(request_id="q1", attempt=1),
        InputProvided(request_id="q1", answer="eu"),
        decision.event,
    )
    assert resumed.turns[TURN].parked_on == ""
    assert turns.resumable(resumed) == []


def test_an_answer_stored_before_the_park_still_resumes_it() -> None:
    state = fold(*ASKED, InputExpired(request_id="q1"), TurnParked(request_id="q1", attempt=1))
    assert [t.turn for t in turns.resumable(state)] == [TURN]


def test_an_answer_to_another_question_does_not() -> None:
    state = fold(
        *ASKED, TurnParked(request_id="q1", attempt=1), InputProvided(request_id="q0", answer="x")
    )
    assert turns.resumable(state) == []


def test_a_cancel_of_a_parked_turn_is_dispatched_and_ends_it() -> None:
    state = fold(*ASKED, TurnParked(request_id="q1", attempt=1), CancelRequested(reason="stop"))
    assert [t.turn for t in turns.resumable(state)] == [TURN]
    decision = start(state)
    assert isinstance(decision, turns.End)
    assert isinstance(decision.event, TurnCancelled)
    assert decision.event.reason == "stop"


def test_a_park_from_a_superseded_attempt_is_ignored() -> None:
    state = fold(
        *ASKED, TurnStarted(replica="b", attempt=2), TurnParked(request_id="q1", attempt=1)
    )
    assert state.turns[TURN].parked_on == ""


RUN = "run-1"


def record(*, answered: bool = False, tool: str = "ask_user") -> list[Event]:
    events: list[Event] = [
        RunStarted(kind="chat", tree="tree"),
        LlmCalled(role="planner", model="m", grant_id=f"{RUN}-g1"),
        IterationPlanned(index=0, reasoning="load it", tool="load_document"),
        ToolCalled(call_id=f"{RUN}-t1", tool="load_document", args={"source": "upload:ab"}),
        ToolReturned(call_id=f"{RUN}-t1", tool="load_document", result="loaded 'ab'"),
        LlmCalled(role="planner", model="m", grant_id=f"{RUN}-g2"),
        IterationPlanned(index=1, reasoning="ask which", tool=tool),
        ToolCalled(call_id=f"{RUN}-t2", tool=tool, args={"question": "Which?"}),
    ]
    if answered:
        events.append(ToolReturned(call_id=f"{RUN}-t2", tool=tool, result="done"))
    return events


def test_the_trajectory_is_rebuilt_with_the_answer_as_the_parked_calls_observation() -> None:
    point = rebuild(record(), "eu please")
    assert point is not None
    assert point.trajectory == {
        "thought_0": "load it", "tool_name_0": "load_document",
        "tool_args_0": {"source": "upload:ab"}, "observation_0": "loaded 'ab'",
        "thought_1": "ask which", "tool_name_1": "ask_user",
        "tool_args_1": {"question": "Which?"}, "observation_1": "eu please",
    }  # fmt: skip
    assert point.pending.call_id == f"{RUN}-t2"
    assert (point.llm_calls, point.grants, point.tool_calls, point.iterations) == (2, 2, 2, 2)


def test_no_resume_point_unless_the_one_open_call_is_ask_user() -> None:
    assert rebuild(record(answered=True), "x") is None
    assert rebuild(record(tool="execute_code"), "x") is None
    assert rebuild([], "x") is None


def test_the_parked_call_answers_as_the_waiting_tool_does() -> None:
    assert answer_text(InputProvided(request_id="q", answer="eu", option="eu"), 5) == (
        "eu (option: eu)",
        "",
    )
    assert answer_text(InputProvided(request_id="q", answer="in text"), 5) == ("in text", "")
    result, error = answer_text(InputExpired(request_id="q"), 5)
    assert result == f"error: {error}"
    assert "expired unanswered" in error
