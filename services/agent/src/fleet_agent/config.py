"""The agent's settings, read once from `FLEET_AGENT_*` environment variables."""

from dataclasses import replace
from pathlib import Path
from typing import Literal

from pydantic import Field, ValidationError, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from fleet_agent.run.failures import InputError
from fleet_events import streams


class AgentSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="FLEET_AGENT_", frozen=True)

    turn_slots: int = Field(default=4, ge=1, le=256)
    """Turns one replica runs at once; it pulls no work without a free slot."""
    dispatch_slots: int = Field(default=16, ge=1, le=1024)
    """Session-log events one replica's dispatcher handles at once."""
    ack_wait_s: float = Field(default=30.0, ge=0.5, le=3600)
    """The ack deadline: a turn whose replica sends no progress for this long (it died or
    froze) goes to another replica. Progress is sent every third of it."""
    max_attempts: int = Field(default=3, ge=1, le=100)
    """Deliveries of a turn's work item that may run it; the next one records `TurnFailed`
    (`poison`). The consumer's `max_deliver` is this plus one."""
    runner: Literal["echo", "scripted", "rlm", "chat"] = "chat"
    """`chat` (the default) runs the chat agent (fleet_agent.chat, `FLEET_CHAT_*`: CoT ->
    ReAct -> RLM) on the tenant's LLM profiles, and fails a turn with `TurnFailed`
    (`llm_not_configured`, saying what to set) when no model is configured; `echo` answers
    with the message (no model needed); `scripted` is the test fake
    (runners.py); `rlm` runs each turn as a recursive-engine root run (fleet_agent.engine,
    `FLEET_ENGINE_*`)."""
    barrier_dir: Path | None = None
    """The scripted fake's barrier directory (tests only)."""
    hold_before_ack: bool = False
    """Tests only: the worker waits at a barrier in `barrier_dir` after a turn's end is stored
    and before its work item is acked (the crash point "after TurnCompleted, before the
    ack")."""

    @model_validator(mode="after")
    def _scripted_needs_barriers(self) -> "AgentSettings":
        if self.runner == "scripted" and self.barrier_dir is None:
            raise ValueError(
                "FLEET_AGENT_RUNNER=scripted is the test fake and needs FLEET_AGENT_BARRIER_DIR "
                "(a directory the test controls); use FLEET_AGENT_RUNNER=echo otherwise"
            )
        if self.hold_before_ack and self.barrier_dir is None:
            raise ValueError("FLEET_AGENT_HOLD_BEFORE_ACK needs FLEET_AGENT_BARRIER_DIR")
        return self

    def turn_consumer(self) -> streams.ConsumerSpec:
        return replace(
            streams.TURN_WORKERS, ack_wait_s=self.ack_wait_s, max_deliver=self.max_attempts + 1
        )

    def dispatch_consumer(self) -> streams.ConsumerSpec:
        return replace(streams.TURN_DISPATCH, ack_wait_s=self.ack_wait_s)


class BadAgentSetting(InputError):
    """A `FLEET_AGENT_*` variable that cannot be used; the message names it and what it may be."""


def load_settings() -> AgentSettings:
    """Read the environment once; raise `BadAgentSetting` naming every variable that is wrong
    (its value is not echoed: a setting may one day hold something private)."""
    try:
        return AgentSettings()
    except ValidationError as exc:
        problems = []
        for error in exc.errors(include_url=False, include_input=False):
            field = ".".join(str(part) for part in error["loc"])
            message = error["msg"].removeprefix("Value error, ")
            problems.append(f"FLEET_AGENT_{field.upper()}: {message}" if field else message)
        raise BadAgentSetting("bad agent setting: " + "; ".join(problems)) from None
