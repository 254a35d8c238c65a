"""The broker's modules keep their rooms: the domain does no I/O, nothing below the routes
speaks RPC errors, and no two modules import each other (issue 8: broker.py <-> lifecycle.py).
Read from the source tree: kept out of the mutation run's unit tests."""

import importlib
from pathlib import Path

import grimp
import pytest

PACKAGE = "fleet_sandbox_broker"
APPLICATION = ["broker", "sandboxes", "repl", "files", "lifecycle", "view", "pool", "volumes"]


@pytest.fixture(scope="module")
def graph() -> grimp.ImportGraph:
    return grimp.build_graph(PACKAGE, include_external_packages=True)


def test_no_module_of_the_broker_is_in_an_import_cycle(graph: grimp.ImportGraph) -> None:
    modules = sorted(m for m in graph.find_children(PACKAGE))
    cycles = [
        (a, b)
        for a in modules
        for b in modules
        if a < b
        and graph.find_shortest_chain(importer=a, imported=b) is not None
        and graph.find_shortest_chain(importer=b, imported=a) is not None
    ]
    assert cycles == []


def test_the_domain_imports_nothing_that_does_io(graph: grimp.ImportGraph) -> None:
    imported = graph.find_modules_directly_imported_by(f"{PACKAGE}.domain")
    assert imported <= {
        "fleet_events", "fleet_events.sandbox", "fleet_events.envelope",
        "fleet_sandbox_broker.errors", "msgspec", "time", "typing", "collections", "dataclasses",
    }  # fmt: skip


@pytest.mark.parametrize("module", APPLICATION)
def test_below_the_routes_errors_are_the_brokers_own_not_rpc_answers(module: str) -> None:
    source = importlib.import_module(f"{PACKAGE}.{module}").__file__
    assert source is not None
    text = Path(source).read_text()
    assert "rpc.BadRequest" not in text
    assert "rpc.RpcError" not in text
