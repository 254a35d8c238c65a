"""The bus catalog drives both sides and the docs: no verb is spelled anywhere else."""

import ast
import json
import re
from pathlib import Path

import pytest

from fleet_events import bus, subjects
from fleet_events.access import permission_markdown
from fleet_events.asyncapi import asyncapi
from fleet_events.ids import InvalidId

ROOT = Path(__file__).resolve().parents[3]
DOC = ROOT / "docs" / "architecture.md"
# The catalog itself, the subject builders it calls, and the RPC primitives verbs wrap.
ALLOWED = {
    ROOT / "libs/events/src/fleet_events/bus.py",
    ROOT / "libs/events/src/fleet_events/subjects.py",
    ROOT / "libs/mesh/src/fleet_mesh/rpc.py",
}


def _section(name: str, doc: Path = DOC) -> str:
    match = re.search(rf"<!-- {name}:start -->\n(.*?)\n<!-- {name}:end -->", doc.read_text(), re.S)
    assert match, f"{doc.name} lost its {name} markers"
    return match.group(1)


def test_the_documented_verb_and_subject_tables_are_current() -> None:
    assert _section("verb-catalog") == bus.verb_markdown(), "stale: run scripts/catalog"
    assert _section("subject-catalog") == bus.channel_markdown(), "stale: run scripts/catalog"


def test_the_broker_verb_table_of_the_sandbox_doc_is_current() -> None:
    table = _section("broker-verbs", ROOT / "docs" / "sandboxes.md")
    assert table == bus.broker_markdown(), "docs/sandboxes.md is stale: run scripts/catalog"
    for verb in bus.verbs_of("sandbox-broker"):  # the drift it replaced: verbs left out
        assert f"`{verb.pattern}`" in table


def test_the_checked_in_asyncapi_document_is_current() -> None:
    stored = json.loads((ROOT / "docs" / "asyncapi.json").read_text())
    assert stored == asyncapi(), "docs/asyncapi.json is stale: run scripts/catalog"


def _spelled_verbs(path: Path) -> list[str]:
    """Subject literals and raw RPC calls that bypass the catalog, as `line: text`."""
    tree = ast.parse(path.read_text())
    docstrings = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }
    found = []
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Constant)
            and isinstance(node.value, str)
            and id(node) not in docstrings
            and node.value.startswith(("fleet.rpc.", "fleet.callback."))
        ):
            found.append(f"{node.lineno}: {node.value!r}")
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            owner = node.func.value
            name = owner.id if isinstance(owner, ast.Name) else ""
            if (name, node.func.attr) in {
                ("subjects", "rpc"),
                ("subjects", "callback"),
                ("rpc", "serve"),
                ("rpc", "call"),
                ("rpc", "call_retrying"),
            }:
                found.append(f"{node.lineno}: {name}.{node.func.attr}(...)")
    return found


def test_no_service_or_library_spells_a_verb_outside_the_catalog() -> None:
    sources = [
        p for group in ("libs", "apps", "services") for p in ROOT.glob(f"{group}/*/src/**/*.py")
    ]
    assert len(sources) > 30, "the source tree moved: this check would see nothing"
    offenders = {
        str(path.relative_to(ROOT)): spelled
        for path in sources
        if path not in ALLOWED and (spelled := _spelled_verbs(path))
    }
    assert offenders == {}, "use a fleet_events.bus verb and rpc.serve_verb / rpc.call_verb"


def test_the_hygiene_check_sees_a_spelled_verb(tmp_path: Path) -> None:
    planted = tmp_path / "planted.py"
    planted.write_text('"""Doc: fleet.rpc.x is fine here."""\nS = "fleet.rpc.budget.grant"\n')
    raw = tmp_path / "raw.py"
    raw.write_text("async def f(nc):\n    await rpc.call(nc, s, r, T, timeout=1)\n")
    assert _spelled_verbs(planted) == ["2: 'fleet.rpc.budget.grant'"]
    assert _spelled_verbs(raw) == ["2: rpc.call(...)"]


def test_verbs_are_unique_and_their_subjects_follow_their_scope() -> None:
    subjects_seen = {v.pattern for v in bus.VERBS if v.scope != "interpreter"}
    assert len(subjects_seen) == len([v for v in bus.VERBS if v.scope != "interpreter"])
    assert bus.GRANT.subject() == "fleet.rpc.budget.grant"
    assert bus.GRANT.queue() == "budget"
    assert bus.EXECUTE.subject("sb1") == "fleet.rpc.sandbox-broker.sandbox.sb1.exec"
    assert bus.EXECUTE.queue() == ""  # one replica holds the sandbox: no queue group
    assert bus.TOOL_CALL.subject("i-1") == "fleet.callback.i-1"
    assert {v.service for v in bus.PING.values()} == set(subjects.SERVICES)


def test_a_verb_refuses_a_wrong_or_missing_target() -> None:
    with pytest.raises(ValueError, match="takes no target"):
        bus.GRANT.subject("sb1")
    with pytest.raises(ValueError, match="give the sandbox id"):
        bus.EXECUTE.subject()
    with pytest.raises(InvalidId, match="sandbox"):
        bus.EXECUTE.subject("a.b")
    with pytest.raises(ValueError, match="unknown service 'nope'"):
        bus.ping("nope")


def test_the_asyncapi_document_describes_every_verb_and_resolves_every_ref() -> None:
    doc = asyncapi()
    assert doc["asyncapi"] == "3.0.0"
    addresses = {c["address"] for c in doc["channels"].values()}
    assert {v.pattern for v in bus.VERBS} <= addresses
    assert {c.pattern for c in bus.CHANNELS} <= addresses

    def refs(node: object) -> list[str]:
        if isinstance(node, dict):
            return [node["$ref"]] if "$ref" in node else [r for v in node.values() for r in refs(v)]
        if isinstance(node, list):
            return [r for v in node for r in refs(v)]
        return []

    for ref in refs(doc):
        node: object = doc
        for part in ref.removeprefix("#/").split("/"):
            assert isinstance(node, dict), f"unresolved {ref}"
            assert part in node, f"unresolved {ref}"
            node = node[part]
    grant = doc["operations"]["serve_fleet_rpc_budget_grant"]
    assert grant["messages"] == [{"$ref": "#/channels/fleet_rpc_budget_grant/messages/Grant"}]
    assert grant["reply"]["messages"] == [{"$ref": "#/channels/reply_inbox/messages/GrantReply"}]


def test_the_permission_table_of_the_deployment_doc_is_current() -> None:
    table = _section("permissions", ROOT / "docs" / "deployment.md")
    assert table == permission_markdown(), "docs/deployment.md is stale: run scripts/catalog"
