"""A real dspy.RLM run through the bus, on a scripted LM (a dspy custom engine).

The main LM writes five steps: explore, hit an error and recover, call the built-in
`llm_query` (answered by a scripted `sub_lm`), build a sub-agent through dspy's sandbox facade
(`dspy.Predict`, run on the host by the same `sub_lm`), and SUBMIT typed outputs.
"""

import os
from collections.abc import Iterator
from typing import Any

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

import dspy
import pytest
from dspy.lm15 import Message, Response, TextPart, Usage

from fleet_agent.interpreter import RemoteInterpreterFactory
from fleet_agent.sandbox_bus import SandboxBus
from fleet_events.sandbox import SandboxInfo


def _text(parts: Any) -> str:
    if parts is None:
        return ""
    if isinstance(parts, str):
        return parts
    return "".join(getattr(part, "text", "") or "" for part in parts)


class ScriptedEngine:
    """Answers each request with `reply(system, user)`; records every request it saw."""

    def __init__(self, reply: Any) -> None:
        self.reply = reply
        self.seen: list[tuple[str, str]] = []

    def complete(self, request: Any) -> Response:
        system = _text(request.system)
        user = "\n".join(m.text or "" for m in request.messages)
        self.seen.append((system, user))
        return Response(
            id=None,
            model="scripted",
            message=Message.assistant([TextPart(self.reply(system, user))]),
            finish_reason="stop",
            usage=Usage(input_tokens=1, output_tokens=1, total_tokens=2),
        )

    def stream(self, request: Any) -> Any:
        raise NotImplementedError

    def close(self) -> None:
        pass


class AsyncScripted:
    """dspy's async engine protocol over a ScriptedEngine."""

    def __init__(self, sync: ScriptedEngine) -> None:
        self.sync = sync

    async def complete(self, request: Any) -> Response:
        return self.sync.complete(request)

    def stream(self, request: Any) -> Any:
        raise NotImplementedError

    async def aclose(self) -> None:
        pass


STEPS = [
    "print(len(context))\nprint(context[:12])",
    "print(total_words + 1)",
    "total_words = len(context.split())\nprint(total_words)",
    "summary = llm_query('Summarize in one word: ' + context[:40])\nprint(summary)",
    "qa = dspy.Predict('question -> answer')\n"
    "r = qa(question='Capital of France?')\n"
    "print(r.answer)",
    "SUBMIT(answer=summary + '/' + r.answer, words=total_words)",
]


def action(reasoning: str, code: str) -> str:
    return (
        f"[[ ## reasoning ## ]]\n{reasoning}\n\n[[ ## code ## ]]\n{code}\n\n[[ ## completed ## ]]\n"
    )


@pytest.fixture
def sandbox(bus: SandboxBus) -> Iterator[SandboxInfo]:
    info = bus.create_sandbox(labels={"session": "rlm"})
    yield info
    bus.delete_sandbox(info.sandbox)


def test_rlm_runs_through_the_bus(bus: SandboxBus, sandbox: SandboxInfo) -> None:
    def main_reply(system: str, user: str) -> str:
        step = len(main.seen) - 1
        return action(f"step {step}", STEPS[min(step, len(STEPS) - 1)])

    def sub_reply(system: str, user: str) -> str:
        if "[[ ## answer ## ]]" in system:  # the facade's dspy.Predict sub-agent
            return "[[ ## answer ## ]]\nParis\n\n[[ ## completed ## ]]\n"
        return "lorem"  # llm_query

    main = ScriptedEngine(main_reply)
    sub = ScriptedEngine(sub_reply)
    main_lm = dspy.LM("scripted/main", engine=main, cache=False)
    sub_lm = dspy.LM("scripted/sub", engine=sub, cache=False)
    factory = RemoteInterpreterFactory(bus, sandbox.sandbox)
    rlm = dspy.RLM(
        "context -> answer: str, words: int",
        max_iters=10,
        max_llm_calls=10,
        sub_lm=sub_lm,
        interpreter_factory=factory,
    )
    context = "lorem ipsum dolor sit amet " * 10
    with dspy.context(lm=main_lm, adapter=dspy.ChatAdapter(use_json_adapter_fallback=False)):
        result = rlm(context=context)

    assert result.answer == "lorem/Paris"
    assert result.words == 50
    trajectory = result.trajectory
    assert len(trajectory) == len(STEPS)
    assert trajectory[0]["output"].splitlines() == [str(len(context)), "lorem ipsum "]
    assert "NameError" in trajectory[1]["output"]
    assert trajectory[2]["output"].strip() == "50"
    assert trajectory[3]["output"].strip() == "lorem"
    assert trajectory[4]["output"].strip() == "Paris"
    # the model saw its error in the next prompt, and sub_lm served both kinds of call
    assert "NameError" in main.seen[2][1]
    assert any("Summarize in one word" in user for _, user in sub.seen)
    assert any("[[ ## answer ## ]]" in system for system, _ in sub.seen)
    # RLM shut its interpreter down: the context is closed, the session's sandbox lives on
    info = bus.sandbox_info(sandbox.sandbox)
    assert info.status == "running"
    assert info.contexts == []


def test_a_sandbox_built_rlm_runs_on_a_nested_interpreter(
    bus: SandboxBus, sandbox: SandboxInfo
) -> None:
    """dspy's facade builds `dspy.RLM` on the host while the outer cell waits on the tool call;
    the inner RLM asks the same factory for an interpreter: a second context, same sandbox."""
    outer_steps = iter([
        "inner = dspy.RLM('text -> n: int', max_iters=3)\n"
        "got = inner(text='a b c')\nprint(got.n)",
        "SUBMIT(answer=str(got.n), words=got.n)",
    ])  # fmt: skip

    def main_reply(system: str, user: str) -> str:
        if "Variable: `text`" in user:  # the inner RLM's action step
            return action("inner", "SUBMIT(n=len(text.split()))")
        return action("outer", next(outer_steps))

    main = ScriptedEngine(main_reply)
    main_lm = dspy.LM("scripted/main", engine=main, cache=False)
    factory = RemoteInterpreterFactory(bus, sandbox.sandbox)
    opened: list[str] = []

    def counting_factory() -> Any:
        interpreter = factory()
        opened.append(interpreter.context)
        return interpreter

    counting_factory.execution_instructions = factory.execution_instructions  # type: ignore[attr-defined]
    rlm = dspy.RLM(
        "context -> answer: str, words: int",
        max_iters=4,
        max_llm_calls=10,
        sub_lm=main_lm,
        interpreter_factory=counting_factory,
    )
    with dspy.context(lm=main_lm, adapter=dspy.ChatAdapter(use_json_adapter_fallback=False)):
        result = rlm(context="ignored")
    assert (result.answer, result.words) == ("3", 3)
    assert len(opened) == 2  # the outer interpreter and the nested one, distinct contexts
    assert len(set(opened)) == 2
    assert bus.sandbox_info(sandbox.sandbox).contexts == []


async def test_rlm_aforward_runs_through_the_bus_from_inside_an_event_loop(
    bus: SandboxBus, sandbox: SandboxInfo
) -> None:
    """`aforward` calls `execute` synchronously on the running loop: the interpreter's own bus
    thread and tool threads keep it from deadlocking."""
    steps = iter(["x = llm_query('hi')\nprint(x)", "SUBMIT(answer=x, words=1)"])
    main = ScriptedEngine(lambda system, user: action("async", next(steps)))
    sub = ScriptedEngine(lambda system, user: "hello back")
    rlm = dspy.RLM(
        "context -> answer: str, words: int",
        max_iters=4,
        sub_lm=dspy.LM("scripted/sub", engine=sub, async_engine=AsyncScripted(sub), cache=False),
        interpreter_factory=RemoteInterpreterFactory(bus, sandbox.sandbox),
    )
    main_lm = dspy.LM("scripted/main", engine=main, async_engine=AsyncScripted(main), cache=False)
    with dspy.context(lm=main_lm, adapter=dspy.ChatAdapter(use_json_adapter_fallback=False)):
        result = await rlm.acall(context="c")
    assert (result.answer, result.words) == ("hello back", 1)
