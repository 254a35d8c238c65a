"""The recursive engine: `dspy.RLM` runs over the mesh, each one recorded step by step.

The one entry point other parts of the agent call (the chat agent's `delegate_to_rlm` and
long-context modules, the turn runner, child runs):

    result = await run_rlm(RlmTask(inputs={"task": ...}), RunContext(...))

`run_rlm` records `run.started`, every iteration, cell, model call and host tool call, and
one terminal event on `fleet.session.<tenant>.<session>.run.<run>`; every model call is granted
by the budget tree `ctx.tree` first (the run's own steps as `step`, everything else as `sub`).
It never raises for what the run did: `RlmResult.status` says how it ended. The caller opens
and closes the tree (`budget.open` / `budget.close`) and owns the sandbox; `RlmTurnRunner`
shows the whole sequence for a turn. Stable: fields are only ever added, with defaults.
"""

from fleet_agent.engine.mesh import MeshPool
from fleet_agent.engine.model import (
    CancelFlag,
    EngineMesh,
    RlmResult,
    RlmTask,
    RunContext,
    child_run_id,
    root_run_id,
    tree_id,
)
from fleet_agent.engine.rlm import FACADE_RLM_REFUSED, run_rlm
from fleet_agent.engine.runner import RlmTurnRunner

__all__ = [
    "FACADE_RLM_REFUSED",
    "CancelFlag",
    "EngineMesh",
    "MeshPool",
    "RlmResult",
    "RlmTask",
    "RlmTurnRunner",
    "RunContext",
    "child_run_id",
    "root_run_id",
    "run_rlm",
    "tree_id",
]
