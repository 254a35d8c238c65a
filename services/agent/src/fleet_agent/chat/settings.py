"""The chat agent's settings, read once from `FLEET_CHAT_*` environment variables (the RLM
runs it starts take theirs from `FLEET_ENGINE_*`)."""

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from fleet_agent.chat.escalation import CONTEXT_THRESHOLD


class ChatSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="FLEET_CHAT_", frozen=True)

    context_threshold: int = Field(default=CONTEXT_THRESHOLD, ge=1, le=10_000_000)
    """Characters of context (message, history, core memory) past which a turn goes straight
    to the RLM (not under `tools_only`)."""
    react_max_iters: int = Field(default=15, ge=1, le=200)
    """ReAct steps of one turn (the earlier system's react default)."""
    clarify_timeout_s: float = Field(default=600.0, gt=0, le=86_400)
    """How long `ask_user` waits for the answer before the question expires."""
    park: bool = True
    """Park a turn that asks the user (`TurnParked`: its worker slot is given back) rather
    than waiting in it; the answer resumes it from the run's record."""
