"""Every code the agent can end a turn with is in `TURN_FAILURES`, the list clients switch on."""

import ast
from pathlib import Path

from fleet_agent.run.failures import CODES
from fleet_events.session import TURN_FAILURES

AGENT_SRC = Path(__file__).resolve().parents[3] / "services" / "agent" / "src" / "fleet_agent"


def _strings(node: ast.AST) -> set[str]:
    """The string constants an expression can evaluate to."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return {node.value} if node.value else set()
    return set().union(*(_strings(child) for child in ast.iter_child_nodes(node)))


def _is_signature(node: ast.ClassDef) -> bool:
    """A dspy signature: its `code` is an output field (the code route's), not a failure code."""
    return any(ast.unparse(base).endswith("Signature") for base in node.bases)


def _literal_codes() -> set[str]:
    """String literals the agent's source writes as a code by hand rather than through the
    failure family's constants: passed as `code=` (a call, `TurnFailed(code=...)`), or
    assigned to a class's `code` / `default_code` (a member of the family)."""
    found: set[str] = set()
    for path in AGENT_SRC.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call):
                for keyword in node.keywords:
                    if keyword.arg == "code":
                        found |= _strings(keyword.value)
            elif isinstance(node, ast.ClassDef) and not _is_signature(node):
                for item in node.body:
                    if isinstance(item, ast.Assign):
                        targets, value = item.targets, item.value
                    elif isinstance(item, ast.AnnAssign) and item.value is not None:
                        targets, value = [item.target], item.value
                    else:
                        continue
                    names = {t.id for t in targets if isinstance(t, ast.Name)}
                    if names & {"code", "default_code"}:
                        found |= _strings(value)
    return found


DSPY_ONLY = {"provider"}
"""dspy's own code of a model error that states no failure (`LmCallFailed` without a kind):
never a turn's code (`broken_code` reads only codes of `CODES`)."""


def test_every_code_the_agent_writes_is_listed() -> None:
    literal = _literal_codes()
    assert "provider" in literal  # the scan reads class attributes and keywords
    assert {"sandbox_lost", "runner_error", "repo_unavailable"} <= set(CODES)
    assert (set(CODES) | (literal - DSPY_ONLY)) - set(TURN_FAILURES) == set()


def test_the_worker_and_the_fold_write_the_rest() -> None:
    """What a run never ends with: the turn fold's codes (a dead replica, a poison turn)."""
    assert set(TURN_FAILURES) - set(CODES) == {"replica_lost", "poison"}


def test_the_list_names_each_code_once() -> None:
    assert len(TURN_FAILURES) == len(set(TURN_FAILURES))
