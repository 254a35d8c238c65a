"""Every code the agent can end a turn with is in `TURN_FAILURES`, the list clients switch on."""

import ast
from pathlib import Path

from fleet_agent.chat.runner import NOT_CONFIGURED
from fleet_agent.llm_failures import LLM_FAILURES
from fleet_events.session import TURN_FAILURES

AGENT_SRC = Path(__file__).resolve().parents[3] / "services" / "agent" / "src" / "fleet_agent"


def _strings(node: ast.AST) -> set[str]:
    """The string constants an expression can evaluate to (a `getattr`'s attribute name is
    not one: `getattr(exc, "failure_code", "") or "runner_error"` gives "runner_error")."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return {node.value} if node.value else set()
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "getattr":
        return set().union(*(_strings(arg) for arg in node.args[2:]))
    return set().union(*(_strings(child) for child in ast.iter_child_nodes(node)))


def _literal_codes() -> set[str]:
    """String literals passed as `code=` anywhere in the agent's source: the codes written by
    hand rather than through a constant."""
    found: set[str] = set()
    for path in AGENT_SRC.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Call):
                continue
            for keyword in node.keywords:
                if keyword.arg == "code":
                    found |= _strings(keyword.value)
    return found


def test_every_code_the_agent_writes_is_listed() -> None:
    written = set(LLM_FAILURES) | {NOT_CONFIGURED} | _literal_codes()
    assert {"poison", "replica_lost", "sandbox_lost", "runner_error"} <= written  # the scan works
    assert written - set(TURN_FAILURES) == set()


def test_the_list_names_each_code_once() -> None:
    assert len(TURN_FAILURES) == len(set(TURN_FAILURES))
