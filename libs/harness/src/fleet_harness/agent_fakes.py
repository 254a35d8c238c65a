"""The agent's test fakes, and the agent composed with them: `python -m fleet_harness.agent_fakes`
runs the agent service exactly as `python -m fleet_agent` does, with two fakes plugged into its
composition root (`fleet_agent.app.setup`). The agent itself holds no test code.

- `ScriptedRunner` (**a test fake**, `FLEET_AGENT_RUNNER=scripted`): the echo runner plus
  directives a test writes into the message, to reach a point in a turn by a barrier rather
  than by timing: `[hold:NAME]` writes `NAME.reached.<attempt>` (holding the replica's name)
  into the barrier directory and waits until a file `NAME` appears there or the turn is
  cancelled; `[die]` SIGKILLs its own process (a poison turn); `[fail]` raises.
- `AckBarrier` (**a test fake**, `FLEET_AGENT_HOLD_BEFORE_ACK`): the worker's hook between a
  turn's stored end and its work item's ack. Writes `<turn>.ended.<attempt>` and waits for the
  file `<turn>.ack` (the test SIGKILLs the replica there instead).

`fleet_harness.procs.Launcher` starts the agent this way whenever its environment asks for a
fake. This module imports the agent (the contract in pyproject.toml names the exception): it
implements the agent's runner seam.
"""

import asyncio
import contextlib
import os
import re
import signal
import sys
from pathlib import Path

from fleet_agent import app
from fleet_agent.config import AgentSettings, BadAgentSetting, load_settings
from fleet_agent.runners import Answered, CancelToken, Stopped, TurnInput
from fleet_mesh import service

DIRECTIVE = re.compile(r"\[(hold|die|fail)(?::([A-Za-z0-9_-]{1,64}))?\]")
POLL_S = 0.01


class ScriptedFailure(RuntimeError):
    """`[fail]`: the fake agent raising, as a real one might."""


class ScriptedRunner:
    """A test fake: see the module docstring."""

    restartable = True

    def __init__(self, barriers: Path, *, poll_s: float = POLL_S) -> None:
        self._barriers = barriers
        self._poll = poll_s

    async def run(self, turn: TurnInput, token: CancelToken) -> Answered | Stopped:
        said: list[str] = []
        for word in turn.message.split():
            if token.cancelled:
                return Stopped(" ".join(said))
            directive = DIRECTIVE.fullmatch(word)
            if directive is None:
                said.append(word)
                await asyncio.sleep(0)
                continue
            kind, name = directive.groups()
            if kind == "die":
                os.kill(os.getpid(), signal.SIGKILL)
            if kind == "fail":
                raise ScriptedFailure("scripted failure (the [fail] directive)")
            if kind == "hold" and name:
                await self._hold(name, turn, token)
        if token.cancelled:
            return Stopped(" ".join(said))
        return Answered(" ".join(said))

    async def _hold(self, name: str, turn: TurnInput, token: CancelToken) -> None:
        (self._barriers / f"{name}.reached.{turn.attempt}").write_text(turn.replica)
        release = self._barriers / name
        while not release.exists() and not token.cancelled:
            # A fake's barrier: a bounded poll of a file the test creates, or the cancel.
            waiter = asyncio.ensure_future(token.wait())
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(waiter, self._poll)


class AckBarrier:
    """A test fake: the worker's `before_ack` hook (module docstring)."""

    def __init__(self, barriers: Path, replica: str, *, poll_s: float = POLL_S) -> None:
        self._barriers = barriers
        self._replica = replica
        self._poll = poll_s

    async def __call__(self, turn: str, attempt: int) -> None:
        (self._barriers / f"{turn}.ended.{attempt}").write_text(self._replica)
        release = self._barriers / f"{turn}.ack"
        never = asyncio.Event()
        while not release.exists():  # a test's barrier: a poll of a file the test creates
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(never.wait(), self._poll)


async def setup(ctx: service.ServiceContext, settings: AgentSettings) -> None:
    """The agent's composition root with the fakes its settings ask for."""
    barriers = settings.barrier_dir
    runner = ScriptedRunner(barriers) if settings.runner == "scripted" and barriers else None
    holds = settings.hold_before_ack and barriers is not None
    before_ack = AckBarrier(barriers, ctx.replica) if holds and barriers else None
    await app.setup(ctx, settings, runner=runner, before_ack=before_ack)


def main() -> None:
    try:
        settings = load_settings()
    except BadAgentSetting as exc:
        sys.exit(f"agent: {exc}")

    async def configured(ctx: service.ServiceContext) -> None:
        await setup(ctx, settings)

    service.run("agent", configured)


if __name__ == "__main__":
    main()
