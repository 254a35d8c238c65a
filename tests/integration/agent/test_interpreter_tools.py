"""Host tools called positionally from sandbox code, through `RemoteInterpreter._on_tool`.

dspy 3.4.1's RLM wraps every user tool as a keyword-only `invoke(**kwargs)` with the
function's signature attached (`RLM._make_interpreter_tool`), while the sandbox sends what the
code wrote: `lookup("a")` arrives as `args=["a"]`. The plain interpreter (the one any
`dspy.RLM(interpreter_factory=RemoteInterpreterFactory(...))` uses, and the chat agent's
`execute_code`) passed those straight on, so every positional call of a user tool failed with
"invoke() takes 0 positional arguments", a message the model cannot act on. A real broker,
a real sandbox.
"""

from collections.abc import Iterator
from typing import Any

import dspy
import pytest
from dspy.primitives.code_interpreter import CodeExecutionError

from fleet_agent.interpreter import RemoteInterpreter
from fleet_agent.sandbox_bus import SandboxBus
from fleet_events.sandbox import SandboxInfo
from fleet_harness.procs import Replica, start_answering
from fleet_mesh.natsserver import NatsServer


@pytest.fixture(scope="module")
def broker(nats_server: NatsServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Replica]:
    root = tmp_path_factory.mktemp("interp-tools")
    replica = start_answering(
        "sandbox-broker", nats_server.url, root / "broker.log",
        {
            "FLEET_SANDBOX_ROOT": str(root / "root"), "FLEET_SANDBOX_UID_BASE": "350000",
            "FLEET_SANDBOX_UID_COUNT": "64",
        },
    )  # fmt: skip
    yield replica
    replica.stop()


@pytest.fixture(scope="module")
def bus(broker: Replica, nats_server: NatsServer) -> Iterator[SandboxBus]:
    with SandboxBus(nats_server.url, tenant="t-interp-tools") as connected:
        yield connected


@pytest.fixture
def interp(bus: SandboxBus) -> Iterator[RemoteInterpreter]:
    info: SandboxInfo = bus.create_sandbox(labels={"session": "tools"})
    interpreter = RemoteInterpreter(bus, info.sandbox)
    yield interpreter
    interpreter.shutdown()
    bus.delete_sandbox(info.sandbox)


def lookup(key: str, default: str = "none") -> str:
    """Look a key up."""
    return {"a": "alpha"}.get(key, default)


def rlm_tools(*tools: Any) -> dict[str, Any]:
    """The tools exactly as dspy.RLM hands them to its interpreter."""
    rlm = dspy.RLM("question -> answer", tools=list(tools), max_iters=2)
    prepared: dict[str, Any] = rlm._prepare_execution_tools()
    return prepared


def test_an_rlm_wrapped_tool_takes_positional_arguments(interp: RemoteInterpreter) -> None:
    interp.tools.update(rlm_tools(lookup))
    assert interp.execute("lookup('a')") == "alpha"
    assert interp.execute("lookup('b', 'dflt')") == "dflt"
    assert interp.execute("lookup('b', default='kw')") == "kw"
    assert interp.execute("lookup(key='a')") == "alpha"


def test_a_call_that_does_not_fit_the_signature_says_how(interp: RemoteInterpreter) -> None:
    interp.tools.update(rlm_tools(lookup))
    with pytest.raises(CodeExecutionError) as missing:
        interp.execute("lookup()")
    assert "lookup" in str(missing.value)
    assert "missing a required argument: 'key'" in str(missing.value)
    with pytest.raises(CodeExecutionError) as extra:
        interp.execute("lookup('a', 'b', 'c')")
    assert "too many positional arguments" in str(extra.value)


def test_plain_callables_keep_their_own_calling_convention(interp: RemoteInterpreter) -> None:
    def only_positional(a: int, b: int, /) -> int:
        return a - b

    def variadic(*values: int, scale: int = 1) -> int:
        return sum(values) * scale

    interp.tools.update({"only_positional": only_positional, "variadic": variadic})
    assert interp.execute("only_positional(5, 2)") == 3
    assert interp.execute("variadic(1, 2, 3, scale=2)") == 12
    assert interp.execute("variadic()") == 0
