"""Carrying on a turn that parked on a question: ReAct's trajectory rebuilt from the run's
record, so the resumed attempt repays no model call and repeats no tool call. Pure.

The record holds every ReAct step (`run.iteration_planned` with its `tool`), every tool call
with its arguments and every result, in order; the parked `ask_user` call is the one with no
result yet, and its result is the user's answer (or its expiry) from the log. Positions the
recorder hands out (grant ids, tool call ids, iteration indexes) continue after the record's,
so a resumed call never reuses a grant id the budget has already answered.
"""

from dataclasses import dataclass
from typing import Any

from fleet_events import Event
from fleet_events.run import (
    TERMINAL,
    Escalated,
    FellBack,
    IterationPlanned,
    LlmCalled,
    RunStarted,
    ToolCalled,
    ToolReturned,
)
from fleet_events.session import InputExpired, InputProvided

ASK = "ask_user"


@dataclass(frozen=True)
class Resume:
    trajectory: dict[str, Any]
    """ReAct's trajectory up to and including the parked call's observation."""
    pending: ToolCalled
    """The parked `ask_user` call: its result is recorded when the turn resumes."""
    llm_calls: int
    grants: int
    """The highest grant position used so far; the next call asks under the one after it."""
    tool_calls: int
    iterations: int


def answer_text(answer: InputProvided | InputExpired | None, timeout_s: float) -> tuple[str, str]:
    """What the parked call returns (result, error), worded as the waiting `ask_user` does."""
    if isinstance(answer, InputProvided):
        text = f"{answer.answer} (option: {answer.option})" if answer.option else answer.answer
        return text, ""
    error = "the question expired unanswered: go on without it"
    if answer is None:
        error = f"the user did not answer in {timeout_s:g}s: go on without it"
    return f"error: {error}", error


def rebuild(events: list[Event], result: str) -> Resume | None:
    """The resume point of a run whose last tool call (`ask_user`) has no result, or None
    when the record is not one (no run yet, or nothing parked)."""
    if not events or not isinstance(events[0], RunStarted):
        return None
    trajectory: dict[str, Any] = {}
    step = -1
    returned: set[str] = set()
    calls: list[ToolCalled] = []
    llm_calls = grants = iterations = 0
    for event in events:
        if isinstance(event, LlmCalled):
            llm_calls += 1
            tail = event.grant_id.rsplit("-g", 1)
            grants = max(grants, int(tail[1]) if len(tail) == 2 and tail[1].isdigit() else 0)
        elif isinstance(event, IterationPlanned):
            iterations += 1
            if event.tool:  # a ReAct step (a ChainOfThought answer plans no tool)
                step += 1
                trajectory[f"thought_{step}"] = event.reasoning
                trajectory[f"tool_name_{step}"] = event.tool
                trajectory[f"tool_args_{step}"] = {}
        elif isinstance(event, ToolCalled):
            calls.append(event)
            if step >= 0:
                trajectory[f"tool_args_{step}"] = event.args
        elif isinstance(event, ToolReturned):
            returned.add(event.call_id)
            if step >= 0:
                trajectory[f"observation_{step}"] = event.result
    open_calls = [c for c in calls if c.call_id not in returned]
    if len(open_calls) != 1 or open_calls[0].tool != ASK or step < 0:
        return None
    trajectory[f"observation_{step}"] = result
    return Resume(
        trajectory=trajectory, pending=open_calls[0], llm_calls=llm_calls, grants=grants,
        tool_calls=len(calls), iterations=iterations,
    )  # fmt: skip


@dataclass(frozen=True)
class Crashed:
    """Where a chat run whose holder died stands, read from its record (`crashed`)."""

    module: str
    """The module the run was in: the last recorded escalation's or fallback's target."""
    fell_back: bool
    fallback_note: str
    """The last fallback's line (`run.fell_back`'s `note`), carried to the answer."""
    trajectory: dict[str, Any]
    """ReAct's steps up to the last whose tool call has a result, and the step whose tool call
    has none (its thought, tool and arguments, no observation: that call runs again)."""
    in_flight: ToolCalled | None
    """The tool call the record shows begun and not ended: it runs again, under its id."""
    llm_calls: int
    tool_calls: int
    iterations: int
    escalated_from_react: bool
    """The run went up to the RLM from ReAct: the route's task carries ReAct's trajectory."""

    @property
    def moved(self) -> bool:
        """Has the run left its start (a move or a step recorded)? If not, the turn's opening
        move is worked out again: the holder may have died before recording it."""
        return self.module != "cot" or self.fell_back or self.iterations > 0

    @property
    def what_repeats(self) -> str:
        """`run.resumed`'s `in_flight`: the one step the record shows begun and not ended."""
        if self.in_flight is not None:
            return f"tool call {self.in_flight.call_id} ({self.in_flight.tool}, no result recorded)"
        if self.module == "rlm":
            return "the RLM route's run (resumed from its own record)"
        return f"the next {self.module} model call (no plan recorded after call {self.llm_calls})"


def crashed(events: list[Event]) -> Crashed | None:
    """The resume point of a chat run that did not end, or None when there is no run yet or
    it ended. A ReAct step planned but with no tool call recorded (the holder died between
    the plan and the call) has no arguments on the record: it is dropped, and its model call
    is asked again."""
    if not events or not isinstance(events[0], RunStarted) or isinstance(events[-1], TERMINAL):
        return None
    module, fell_back, from_react, note = "cot", False, False, ""
    steps: list[dict[str, Any]] = []
    calls: list[ToolCalled] = []
    returned: dict[str, ToolReturned] = {}
    llm_calls = iterations = 0
    for event in events:
        if isinstance(event, LlmCalled):
            llm_calls += 1
        elif isinstance(event, Escalated):
            from_react = event.from_module == "react" and event.to_module == "rlm"
            module = event.to_module
        elif isinstance(event, FellBack):
            module, fell_back, note = event.to_module, True, event.note
        elif isinstance(event, IterationPlanned):
            iterations += 1
            if event.tool:
                steps.append({"thought": event.reasoning, "tool_name": event.tool})
        elif isinstance(event, ToolCalled):
            calls.append(event)
            if steps and "call" not in steps[-1]:
                steps[-1]["call"] = event
        elif isinstance(event, ToolReturned):
            returned[event.call_id] = event
    trajectory: dict[str, Any] = {}
    in_flight: ToolCalled | None = None
    for n, taken in enumerate(steps):
        call: ToolCalled | None = taken.get("call")
        if call is None:
            if taken["tool_name"] != "finish":
                break  # planned, not called: no arguments recorded, the step is asked again
            args: dict[str, Any] = {}
        else:
            args = dict(call.args)
        trajectory[f"thought_{n}"] = taken["thought"]
        trajectory[f"tool_name_{n}"] = taken["tool_name"]
        trajectory[f"tool_args_{n}"] = args
        if call is None:  # dspy's own `finish`: not a recorded tool, it answers this
            trajectory[f"observation_{n}"] = "Completed."
        elif call.call_id in returned:
            trajectory[f"observation_{n}"] = returned[call.call_id].result
        else:
            in_flight = call
            break
    return Crashed(
        module=module, fell_back=fell_back, fallback_note=note, trajectory=trajectory,
        in_flight=in_flight,
        llm_calls=llm_calls, tool_calls=len(calls), iterations=iterations,
        escalated_from_react=from_react,
    )  # fmt: skip
