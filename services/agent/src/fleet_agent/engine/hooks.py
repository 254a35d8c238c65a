"""What the engine's recording seams share for one run: the recorder, the cancel flag, the
record being resumed, and the loop's position (the iteration dspy is in, the last reasoning)."""

import threading
from collections.abc import Callable
from typing import Any

from fleet_agent.engine.model import RunCancelledError, RunContext
from fleet_agent.engine.recorder import RunRecorder
from fleet_agent.engine.resume import Resume
from fleet_events.run import IterationPlanned


class RunHooks:
    """What the recording seams share: the recorder, the cancel flag, and the loop's position."""

    def __init__(self, ctx: RunContext, recorder: RunRecorder, resume: Resume) -> None:
        self.ctx = ctx
        self.recorder = recorder
        self.resume = resume
        self.iteration: int | None = None
        self.iterations = 0
        self.last_reasoning = ""
        self._interrupts: list[Callable[[], None]] = []
        self._lock = threading.Lock()

    def boundary(self, iteration: int | None) -> None:
        """A step boundary: stop here once the run is cancelled."""
        if self.ctx.cancel.is_set:
            raise RunCancelledError(self.ctx.cancel.reason)
        if iteration is not None:
            self.iteration = iteration
            self.iterations = iteration + 1

    def planned(self, reasoning: str, code: str) -> None:
        self.last_reasoning = reasoning
        self.recorder.record(
            IterationPlanned(
                index=self.iteration or 0,
                reasoning=reasoning,
                code=code,
                llm_call=self.recorder.last_step_call,
            )
        )

    def planned_from(self, prediction: Any) -> None:
        """The plan of one predicted action (the RLM's `generate_action`), recorded."""
        self.planned(str(prediction.reasoning or ""), str(prediction.code or ""))


__all__ = ["RunHooks"]
