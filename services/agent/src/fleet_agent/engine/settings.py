"""The engine's limits per turn, read once from `FLEET_ENGINE_*` environment variables."""

from dataclasses import replace

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from fleet_agent.engine.model import RlmTask
from fleet_events import streams


class EngineSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="FLEET_ENGINE_", frozen=True)

    max_iters: int = Field(default=10, ge=1, le=200)
    """Steps of each run (the root's and every child's); the budget grants one more, for
    dspy's extract step when a run reaches the limit."""
    max_llm_calls: int = Field(default=50, ge=1, le=10_000)
    """Sub calls (llm_query, facade sub-agents, child runs' calls) of a whole turn's tree."""
    max_depth: int = Field(default=3, ge=0, le=64)
    """How deep child runs may nest (the root is depth 0)."""
    max_tree_calls: int = Field(default=500, ge=1, le=1_000_000)
    """Every model call of a turn's tree, whoever makes it (steps, sub calls, children's
    calls); the tenant's `rlm_max_tree_calls` setting wins where one is stored."""
    max_child_runs: int = Field(default=100, ge=0, le=100_000)
    """Child runs a turn's tree may start, at every depth (`rlm_max_child_runs`)."""
    cell_wall_s: float | None = Field(default=None, gt=0, le=3600)
    """A cell's wall-clock limit (host tool time excluded); None: the broker's default."""
    tree_deadline_s: float = Field(default=3600.0, gt=0, le=86_400)
    """How long a turn's tree may run: host tools waiting on child runs wait no longer."""
    child_slots: int = Field(default=2, ge=1, le=256)
    """Child runs one replica runs at once (apart from turn slots); a child waiting on its
    own children lends its slot back, so this bounds work, never the tree's shape."""
    ack_wait_s: float = Field(default=30.0, ge=0.5, le=3600)
    """The child-run consumer's ack deadline (progress is sent every third of it)."""

    def child_consumer(self) -> streams.ConsumerSpec:
        # deliveries 2..3 resume the run from its record, the 4th records it lost (child_worker)
        return replace(streams.CHILD_RUN_WORKERS, ack_wait_s=self.ack_wait_s, max_deliver=4)

    def task(self) -> RlmTask:
        return RlmTask(
            inputs={},
            max_iters=self.max_iters,
            max_llm_calls=self.max_llm_calls,
            max_depth=self.max_depth,
            cell_wall_s=self.cell_wall_s,
            max_tree_calls=self.max_tree_calls,
            max_child_runs=self.max_child_runs,
        )
