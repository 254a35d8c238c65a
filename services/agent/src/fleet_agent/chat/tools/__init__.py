"""The chat agent's tools, by the earlier system's families and names (fleet-rlm-behaviour.md
section 2), each call recorded on the turn's run as `run.tool_called` / `run.tool_returned`.
One family a module (`documents`, `memory`, `sandbox`, `recursion`, `clarify`), on the `kit`
they share.

Tools run in dspy's thread. What they change in the session is appended to the session's log
as the fact the fold reads (`memory.core_changed`, `document.loaded`, `input.requested`, ...),
and mirrored in `TurnState` so later tools of the same turn see it. A tool that cannot do what
was asked answers a sentence the model can act on ("error: ..."), and the record keeps it as
the call's `error`; it never raises into ReAct, whose own handler would show a host traceback.

Which tools a turn gets depends on its mode: `tools_only` drops the recursion and long-context
tools (they run the RLM); `rlm_only` never reaches ReAct.
"""

from collections.abc import Callable
from typing import Any

import dspy

from fleet_agent.chat.tools.clarify import Clarify
from fleet_agent.chat.tools.documents import Documents, listing
from fleet_agent.chat.tools.kit import (
    Engine,
    ParkTurn,
    ToolError,
    ToolKit,
    TurnState,
    read_sandbox_file,
    recorded,
    write_sandbox_file,
)
from fleet_agent.chat.tools.memory import Memory
from fleet_agent.chat.tools.recursion import Recursion, child_run
from fleet_agent.chat.tools.sandbox import Sandbox


def toolset(kit: ToolKit) -> list[dspy.Tool]:
    """The turn's tools, by its mode (module docstring)."""
    documents = Documents(kit)
    memory = Memory(kit)
    sandbox = Sandbox(kit)
    recursion = Recursion(kit, documents)
    clarify = Clarify(kit)
    chosen: list[Callable[..., Any]] = [
        documents.load_document, documents.fetch_web_document, documents.list_documents,
        documents.set_active_document, documents.read_file_slice, documents.find_in_document,
        documents.chunk_host, memory.core_memory_append, memory.core_memory_replace,
        memory.memory_write, memory.memory_read, memory.memory_list, sandbox.execute_code,
        sandbox.list_files, sandbox.workspace_read, sandbox.workspace_write, clarify.ask_user,
    ]  # fmt: skip
    if kit.mode != "tools_only":
        chosen += [
            recursion.rlm_query, recursion.rlm_query_batched, recursion.delegate_to_rlm,
            recursion.summarize_long_document, recursion.extract_from_logs,
            recursion.grounded_answer, recursion.triage_incident_logs,
            recursion.plan_code_change, recursion.propose_core_memory_update,
        ]  # fmt: skip
    return [recorded(kit, fn.__name__, fn) for fn in chosen]


__all__ = [
    "Engine",
    "ParkTurn",
    "ToolError",
    "ToolKit",
    "TurnState",
    "child_run",
    "listing",
    "read_sandbox_file",
    "recorded",
    "toolset",
    "write_sandbox_file",
]
