"""RemoteInterpreter against dspy 3.4.1's CodeInterpreter protocol, through a real broker."""

import threading
from collections.abc import Iterator
from typing import Any

import dspy
import pytest
from dspy.primitives.code_interpreter import (
    CodeExecutionError,
    CodeInterpreter,
    CodeInterpreterError,
    FinalOutput,
)

from fleet_agent.interpreter import RemoteInterpreter, RemoteInterpreterFactory
from fleet_agent.sandbox_bus import SandboxBus
from fleet_events.sandbox import Limits, SandboxInfo


@pytest.fixture(scope="module")
def sandbox(bus: SandboxBus) -> Iterator[SandboxInfo]:
    info = bus.create_sandbox(labels={"session": "conformance"})
    yield info
    bus.delete_sandbox(info.sandbox)


@pytest.fixture
def interp(bus: SandboxBus, sandbox: SandboxInfo) -> Iterator[RemoteInterpreter]:
    interpreter = RemoteInterpreter(bus, sandbox.sandbox)
    yield interpreter
    interpreter.shutdown()


def test_is_a_code_interpreter_and_its_factory_is_not(
    bus: SandboxBus, sandbox: SandboxInfo
) -> None:
    factory = RemoteInterpreterFactory(bus, sandbox.sandbox)
    assert isinstance(factory(), CodeInterpreter)
    assert not isinstance(factory, CodeInterpreter)


def test_start_is_lazy_and_idempotent(bus: SandboxBus, sandbox: SandboxInfo) -> None:
    interpreter = RemoteInterpreter(bus, sandbox.sandbox)
    assert interpreter.context not in bus.sandbox_info(sandbox.sandbox).contexts
    assert interpreter.execute("1 + 1") == 2
    assert interpreter.context in bus.sandbox_info(sandbox.sandbox).contexts
    interpreter.start()
    interpreter.start()
    assert interpreter.execute("3") == 3
    interpreter.shutdown()


def test_execution_returns_output_value_or_none(interp: RemoteInterpreter) -> None:
    assert interp.execute("print('hello'); print('world')") == "hello\nworld\n"
    assert interp.execute("6 * 7") == 42
    assert interp.execute("x = 1") is None
    assert interp.execute("{'a': [1, 2]}") == {"a": [1, 2]}


def test_output_written_below_python_is_captured_too(interp: RemoteInterpreter) -> None:
    code = "import os, subprocess\nos.write(1, b'raw fd\\n')\n_ = subprocess.run(['echo', 'child'])"
    assert interp.execute(code) == "raw fd\nchild\n"
    assert interp.execute("print('next cell')") == "next cell\n"


def test_state_persists_between_executions(interp: RemoteInterpreter) -> None:
    interp.execute("import math\ndef area(r):\n    return math.pi * r * r\nn = 3")
    assert interp.execute("n += 1\nround(area(n), 2)") == 50.27
    assert interp.execute("n") == 4


def test_fresh_instances_are_isolated(bus: SandboxBus, sandbox: SandboxInfo) -> None:
    first, second = RemoteInterpreter(bus, sandbox.sandbox), RemoteInterpreter(bus, sandbox.sandbox)
    try:
        first.execute("secret = 41")
        with pytest.raises(CodeExecutionError, match="NameError"):
            second.execute("secret")
        assert first.execute("secret + 1") == 42
    finally:
        first.shutdown()
        second.shutdown()


def test_error_taxonomy(interp: RemoteInterpreter) -> None:
    with pytest.raises(SyntaxError):
        interp.execute("def broken(:")
    with pytest.raises(CodeExecutionError, match="ZeroDivisionError"):
        interp.execute("print('before'); 1 / 0")
    assert not isinstance(SyntaxError(), CodeInterpreterError)
    # a recoverable error leaves the interpreter usable
    assert interp.execute("2 + 2") == 4


def test_a_stopped_sandbox_is_a_terminal_error(bus: SandboxBus) -> None:
    info = bus.create_sandbox(limits=Limits(wall_s=1))
    interpreter = RemoteInterpreter(bus, info.sandbox)
    try:
        with pytest.raises(CodeInterpreterError, match="wall-time limit") as caught:
            interpreter.execute("while True:\n    pass")
        assert not isinstance(caught.value, CodeExecutionError)
        with pytest.raises(CodeInterpreterError, match="shut down"):
            interpreter.execute("1")
    finally:
        interpreter.shutdown()
        bus.delete_sandbox(info.sandbox)


def test_variables_are_json_and_pydantic_inputs_work(interp: RemoteInterpreter) -> None:
    history = dspy.History(messages=[{"question": "q1", "answer": "a1"}])
    got = interp.execute(
        "history['messages'][0]['answer'], data['k'][1], n * 2",
        {"history": history, "data": {"k": [1, 2]}, "n": 21},
    )
    assert got == ["a1", 2, 42]
    with pytest.raises(CodeInterpreterError, match="JSON"):
        interp.execute("1", {"bad": object()})
    with pytest.raises(CodeInterpreterError, match="variable names"):
        interp.execute("1", {"SUBMIT": 1})


def test_variables_are_sent_once_by_content_hash(
    interp: RemoteInterpreter, monkeypatch: pytest.MonkeyPatch
) -> None:
    sent: list[int] = []
    original = interp._send

    def spy(code: str, names: dict[str, str], blobs: dict[str, str], tools: list[str]) -> Any:
        sent.append(sum(len(text) for text in blobs.values()))
        return original(code, names, blobs, tools)

    monkeypatch.setattr(interp, "_send", spy)
    big = "x" * (1024 * 1024)
    assert interp.execute("len(doc)", {"doc": big}) == len(big)
    assert interp.execute("len(doc)", {"doc": big}) == len(big)
    assert interp.execute("len(doc)", {"doc": "x" * (1024 * 1024)}) == len(big)
    assert sent[0] > len(big)
    assert sent[1:] == [0, 0]


def test_a_resent_variable_is_fresh_unless_it_is_immutable(interp: RemoteInterpreter) -> None:
    # a cell may mutate a list it was given: the next cell still gets the value as sent
    assert interp.execute("items.append(4)\nitems", {"items": [1, 2, 3]}) == [1, 2, 3, 4]
    assert interp.execute("items", {"items": [1, 2, 3]}) == [1, 2, 3]
    # a string cannot be mutated: the sandbox decodes it once and hands every cell that object
    doc = "d" * 100_000
    interp.execute("kept = doc", {"doc": doc})
    assert interp.execute("doc is kept, len(doc)", {"doc": doc}) == [True, len(doc)]


def test_big_variables_travel_through_the_object_store(
    interp: RemoteInterpreter, monkeypatch: pytest.MonkeyPatch
) -> None:
    staged: list[int] = []
    put_blob = interp.bus.put_blob

    def spy(data: bytes, **options: Any) -> Any:
        staged.append(len(data))
        return put_blob(data, **options)

    monkeypatch.setattr(interp.bus, "put_blob", spy)
    doc = "y" * (3 * 1024 * 1024)  # over the request limit if it travelled inline
    assert interp.execute("len(doc), doc[:3]", {"doc": doc}) == [len(doc), "yyy"]
    assert staged == [len(doc) + 2]  # its JSON text, quotes included
    assert interp.execute("len(small)", {"small": "s" * 1000}) == 1000
    assert staged == [len(doc) + 2]  # small values stay inline


def test_a_variable_the_sandbox_lacks_is_sent_again(interp: RemoteInterpreter) -> None:
    """The interpreter believes it sent `doc` (say, to a sandbox since revived): the sandbox
    answers `missing` and the interpreter resends the value once."""
    doc = "content-" + "z" * 100
    first = interp._encode_variables({"doc": doc}, {})["doc"]
    interp._sent.add(first.digest)
    assert interp.execute("len(doc)", {"doc": doc}) == len(doc)


def test_tool_round_trip_and_tool_errors(interp: RemoteInterpreter) -> None:
    interp.tools["add"] = lambda a, b=0: a + b
    interp.tools["fail"] = lambda: 1 / 0
    assert interp.execute("add(40, b=2)") == 42
    with pytest.raises(CodeExecutionError, match="ZeroDivisionError"):
        interp.execute("fail()")
    assert interp.execute("try:\n    fail()\nexcept RuntimeError as e:\n    out = str(e)\nout") == (
        "ZeroDivisionError: division by zero"
    )


def test_tools_dict_is_reread_and_a_removed_tool_is_gone(interp: RemoteInterpreter) -> None:
    interp.tools["greet"] = lambda name: f"hi {name}"
    assert interp.execute("greet('ada')") == "hi ada"
    del interp.tools["greet"]
    with pytest.raises(CodeExecutionError, match="NameError"):
        interp.execute("greet('ada')")


def test_tool_calls_from_several_sandbox_threads_run_concurrently(
    interp: RemoteInterpreter,
) -> None:
    barrier = threading.Barrier(4, timeout=20)

    def meet(i: int) -> int:
        barrier.wait()  # only returns when 4 calls are in flight at once
        return i * i

    interp.tools["meet"] = meet
    code = (
        "from concurrent.futures import ThreadPoolExecutor\n"
        "with ThreadPoolExecutor(4) as pool:\n"
        "    got = sorted(pool.map(meet, range(4)))\n"
        "got"
    )
    assert interp.execute(code) == [0, 1, 4, 9]


def test_submit_without_output_fields(interp: RemoteInterpreter) -> None:
    assert interp.execute("SUBMIT('done')") == FinalOutput({"output": "done"})


def test_typed_submit_with_output_fields(interp: RemoteInterpreter) -> None:
    interp.output_fields = [{"name": "answer", "type": "str"}, {"name": "n", "type": "int"}]
    assert interp.execute("SUBMIT(answer='x', n=3)") == FinalOutput({"answer": "x", "n": 3})
    assert interp.execute("SUBMIT('y', 4)") == FinalOutput({"answer": "y", "n": 4})
    with pytest.raises(CodeExecutionError, match="missing"):
        interp.execute("SUBMIT(answer='only')")


def test_submit_ends_execution_at_once(interp: RemoteInterpreter) -> None:
    result = interp.execute("print('before')\nSUBMIT(1)\nprint('after')\nafter = True")
    assert result == FinalOutput({"output": 1})
    code = "try:\n    SUBMIT(2)\nexcept Exception:\n    print('swallowed')\nlater = True"
    assert interp.execute(code) == FinalOutput({"output": 2})
    bare = "try:\n    SUBMIT(3)\nexcept:\n    leaked = True\nlater = True"
    assert interp.execute(bare) == FinalOutput({"output": 3})
    assert interp.execute("[n for n in ('after', 'later', 'leaked') if n in globals()]") == []


def test_shutdown_is_terminal_idempotent_and_keeps_the_sandbox(
    bus: SandboxBus, sandbox: SandboxInfo
) -> None:
    interpreter = RemoteInterpreter(bus, sandbox.sandbox)
    interpreter.execute("x = 1")
    interpreter.shutdown()
    interpreter.shutdown()
    with pytest.raises(CodeInterpreterError):
        interpreter.execute("x")
    with pytest.raises(CodeInterpreterError):
        interpreter.start()
    info = bus.sandbox_info(sandbox.sandbox)
    assert info.status == "running"
    assert interpreter.context not in info.contexts


def test_execution_instructions_live_on_the_factory(bus: SandboxBus, sandbox: SandboxInfo) -> None:
    factory = RemoteInterpreterFactory(bus, sandbox.sandbox)
    assert "sandbox" in factory.execution_instructions
    assert dspy.RLM._get_execution_instructions(factory) == factory.execution_instructions


def test_time_waiting_on_a_host_tool_does_not_count(bus: SandboxBus) -> None:
    info = bus.create_sandbox(limits=Limits(wall_s=1))
    interpreter = RemoteInterpreter(bus, info.sandbox)
    never = threading.Event()

    def slow() -> str:
        never.wait(1.5)  # host work longer than the cell's whole wall budget
        return "done"

    interpreter.tools["slow"] = slow
    try:
        assert interpreter.execute("slow() + slow()") == "donedone"
    finally:
        interpreter.shutdown()
        bus.delete_sandbox(info.sandbox)


def test_nested_interpreter_while_a_tool_call_is_in_flight(
    bus: SandboxBus, sandbox: SandboxInfo
) -> None:
    factory = RemoteInterpreterFactory(bus, sandbox.sandbox)
    outer = factory()

    def nested(code: str) -> Any:
        inner = factory()
        try:
            return inner.execute(code)
        finally:
            inner.shutdown()

    outer.tools["nested"] = nested
    try:
        assert outer.execute("v = 5\nnested('v = 6\\nv * 7') + v") == 47
    finally:
        outer.shutdown()
