"""dspy's ReAct as the chat agent runs it: able to start part way through, from a trajectory
rebuilt from the run's record, and unwound when its context outgrows the threshold
(`EscalateToRlm`), or when the RLM route it escalated to fails (`RlmRouteFailed`).
"""

from typing import Any

import dspy

from fleet_agent.run.failures import CODES, RUNNER_ERROR, RunFailure, RunSignal
from fleet_agent.runners import Failed
from fleet_events.run import Escalated


class ChatReAct(dspy.ReAct):  # type: ignore[misc]  # dspy ships no types
    """dspy's ReAct that can start part way through, from a trajectory rebuilt from the run's
    record (`chat.resume`): a parked turn goes on without asking the model again for the
    steps it already took. Without `start` it is dspy's own loop."""

    def __init__(self, *args: Any, start: dict[str, Any] | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._start = dict(start or {})

    def forward(self, **inputs: Any) -> Any:
        if not self._start:
            return super().forward(**inputs)
        trajectory = dict(self._start)
        taken = sum(1 for key in trajectory if key.startswith("thought_"))
        last = taken - 1
        done = taken > 0 and trajectory[f"tool_name_{last}"] == "finish"
        if taken > 0 and f"observation_{last}" not in trajectory:
            # the tool call a dead holder left in flight: run again (under its recorded id)
            name, args = trajectory[f"tool_name_{last}"], trajectory[f"tool_args_{last}"]
            try:
                trajectory[f"observation_{last}"] = self.tools[name](**args)
            except Exception as exc:
                trajectory[f"observation_{last}"] = f"Execution error in {name}: {exc}"
        for step in range(taken, self.max_iters if not done else taken):
            try:
                chosen = self._call_with_potential_trajectory_truncation(
                    self.react, trajectory, **inputs
                )
            except ValueError:  # no valid tool chosen (or no room left): end the loop
                break
            name, args = chosen.next_tool_name, chosen.next_tool_args
            trajectory[f"thought_{step}"] = chosen.next_thought
            trajectory[f"tool_name_{step}"] = name
            trajectory[f"tool_args_{step}"] = args
            try:
                trajectory[f"observation_{step}"] = self.tools[name](**args)
            except Exception as exc:
                trajectory[f"observation_{step}"] = f"Execution error in {name}: {exc}"
            if name == "finish":
                break
        extracted = self._call_with_potential_trajectory_truncation(
            self.extract, trajectory, **inputs
        )
        return dspy.Prediction(trajectory=trajectory, **extracted)


class EscalateToRlm(RunSignal):
    """ReAct's context outgrew the threshold: unwind ReAct (dspy passes on anything but a
    ValueError or a context-window error) and go on in the RLM with its trajectory."""

    def __init__(self, move: Escalated, trajectory: str) -> None:
        super().__init__(move.detail)
        self.move = move
        self.trajectory = trajectory


class RlmRouteFailed(RunFailure):
    """The RLM route's run ended without an answer (its own record says why); `code` is its
    failure's code: stated on when the run stated it (a model call's kind, the budget), else
    only the code of what broke (`sandbox_lost`, or the runner's error)."""

    def __init__(self, message: str, code: str = "", retryable: bool = False) -> None:
        super().__init__(message, code=code if code in CODES else RUNNER_ERROR, retryable=retryable)

    def stated(self) -> Failed | None:
        return super().stated() if CODES[self.code].stated else None


__all__ = ["ChatReAct", "EscalateToRlm", "RlmRouteFailed"]
