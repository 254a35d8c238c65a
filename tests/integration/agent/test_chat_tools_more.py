"""The chat agent's recursion and document tools on the real mesh: an agent replica with
`FLEET_AGENT_RUNNER=chat`, a real sandbox broker, budget and sandboxes as processes, and the
scripted LM (a FAKE model server) writing both the ReAct steps and the child RLM's code.

`rlm_query` and `delegate_to_rlm` each run a real child run (the engine, code in the session's
sandbox), whose answer comes back into ReAct's trajectory; `load_document` reads a file that
code wrote in the session's sandbox; each long-context module (`SummarizeLongDocument` ...
`CoreMemoryUpdateProposal`) runs on the real engine with its own signature, the inputs and
outputs named as the earlier system named them.
"""

import json
from typing import Any

import pytest

from fleet_events.run import (
    ChildRunCompleted,
    ChildRunFailed,
    ChildRunRequested,
    Escalated,
    FellBack,
    RunCompleted,
    RunStarted,
    ToolCalled,
    ToolReturned,
)
from fleet_events.session import DocumentLoaded, TurnCompleted
from fleet_harness.scripted_lm import Reply, ScriptedLM
from fleet_mesh.blobs import JetStreamBlobs

from .rlm_kit import Processes, Session, fields, of_type, processes, session, step

__all__ = ["processes"]

pytestmark = pytest.mark.slow

THRESHOLD = 6_000
"""Low enough that one long tool result takes ReAct's context over it."""

AGENT_ENV = {
    "FLEET_AGENT_RUNNER": "chat",
    "FLEET_AGENT_TURN_SLOTS": "2",
    "FLEET_ENGINE_MAX_ITERS": "4",
    "FLEET_ENGINE_MAX_LLM_CALLS": "6",
    "FLEET_CHAT_CONTEXT_THRESHOLD": str(THRESHOLD),
}


def act(tool: str, args: dict[str, Any] | None = None) -> str:
    return fields(next_thought="next", next_tool_name=tool, next_tool_args=json.dumps(args or {}))


def extract(answer: str) -> str:
    return fields(reasoning="from the trajectory", answer=answer)


async def child_of(s: Session, events: list[Any], tool: str) -> tuple[Any, Any, list[Any]]:
    """The tool's call, its one child run's request, and the child run's own events."""
    (called,) = [c for c in of_type(events, ToolCalled) if c.tool == tool]
    (asked,) = of_type(events, ChildRunRequested)
    assert asked.call_id == called.call_id
    return called, asked, await s.events_of(asked.child_run)


async def test_rlm_query_runs_a_child_whose_answer_reaches_the_trajectory(
    processes: Processes,
) -> None:
    script = [
        act("rlm_query", {"query": "add the numbers", "context": "0 1 2 3 4"}),
        step("SUBMIT(answer='heron-' + str(sum(int(n) for n in context.split())))"),
        act("finish"),
        extract("the sum is heron-10"),
    ]
    with ScriptedLM(script) as fake:
        async with session(processes) as s:
            await s.use_model(fake)
            turn = await s.ask("Use code to add the numbers 0 1 2 3 4")
            ended = await s.ended(turn)
            events = await s.run_events(turn)
            _, asked, child = await child_of(s, events, "rlm_query")
            child_head = await s.head_of(asked.child_run)
    assert isinstance(ended, TurnCompleted), ended
    assert ended.answer == "the sum is heron-10"
    assert (asked.task, asked.depth) == ("add the numbers", 1)
    assert isinstance(child[0], RunStarted)
    assert (child[0].kind, child[0].depth) == ("rlm", 1)
    assert isinstance(child[-1], RunCompleted)
    assert child[-1].answer == "heron-10"
    (done,) = of_type(events, ChildRunCompleted)
    assert (done.answer, done.child_head_hash) == ("heron-10", child_head)
    (returned,) = [r for r in of_type(events, ToolReturned) if r.tool == "rlm_query"]
    assert (returned.result, returned.error) == ("heron-10", "")
    # the step after the tool read the child's answer as its observation
    assert "heron-10" not in fake.requests[0].prompt_text
    assert "heron-10" in fake.requests[2].prompt_text


async def test_delegate_to_rlm_over_a_loaded_document(processes: Processes) -> None:
    text = "alpha\nbeta\ngamma\n"
    async with session(processes) as s:
        blobs = await JetStreamBlobs.open(s.nc.jetstream())
        ref = await blobs.put(s.tenant, text.encode())
        script = [
            act("load_document", {"source": f"upload:{ref.sha256}", "alias": "notes"}),
            act("delegate_to_rlm", {"query": "count the lines", "document_alias": "notes"}),
            step("SUBMIT(answer='lines=' + str(len(context.splitlines())))"),
            act("finish"),
            extract("it has lines=3"),
        ]
        with ScriptedLM(script) as fake:
            await s.use_model(fake)
            turn = await s.ask("Delegate counting the uploaded document's lines")
            ended = await s.ended(turn)
            events = await s.run_events(turn)
            _, asked, child = await child_of(s, events, "delegate_to_rlm")
    assert isinstance(ended, TurnCompleted), ended
    assert ended.answer == "it has lines=3"
    assert asked.task == "count the lines"
    assert isinstance(child[-1], RunCompleted)
    assert child[-1].answer == "lines=3"
    (returned,) = [r for r in of_type(events, ToolReturned) if r.tool == "delegate_to_rlm"]
    assert returned.result == {
        "status": "completed",
        "answer": "lines=3",
        "degraded": False,
        "reason": "",
    }
    assert "lines=3" not in fake.requests[1].prompt_text
    assert "lines=3" in fake.requests[3].prompt_text


async def test_a_document_written_in_the_sandbox_is_loaded_by_path_and_sliced(
    processes: Processes,
) -> None:
    text = "first line\nthe word is heron\nlast line\n"
    code = (
        "import os\nos.makedirs('data', exist_ok=True)\n"
        f"open('data/notes.txt', 'w').write({text!r})"
    )
    script = [
        act("execute_code", {"code": code}),
        act("load_document", {"source": "data/missing.txt"}),
        act("load_document", {"source": "data/notes.txt"}),
        act("read_file_slice", {"start_line": 2, "num_lines": 1}),
        act("finish"),
        extract("heron"),
    ]
    with ScriptedLM(script) as fake:
        async with session(processes) as s:
            await s.use_model(fake)
            turn = await s.ask("Write a file in the sandbox, load it as a document, read line 2")
            ended = await s.ended(turn)
            events = await s.run_events(turn)
            log = await s.log()
            (loaded,) = of_type(log, DocumentLoaded)
            blobs = await JetStreamBlobs.open(s.nc.jetstream())
            stored = await blobs.get(s.tenant, loaded.document.blob.sha256)
    assert isinstance(ended, TurnCompleted), ended
    assert ended.answer == "heron"
    returned = of_type(events, ToolReturned)
    assert [r.tool for r in returned] == [
        "execute_code", "load_document", "load_document", "read_file_slice",
    ]  # fmt: skip
    ran, missing, found, sliced = returned
    assert ran.error == ""
    assert "'data/missing.txt'" in missing.error
    assert "no file" in missing.error
    assert "list_files" in missing.error  # what to do about it
    assert found.error == ""
    doc = loaded.document
    assert (doc.alias, doc.source, doc.origin) == ("notes.txt", "sandbox_path", "data/notes.txt")
    assert (doc.chars, doc.media_type) == (len(text), "text/plain")
    assert stored == text.encode()
    assert sliced.result == "2: the word is heron\n[lines 2-2 of 3]"


LOGS = "error at 10:01\nok\nerror at 10:02\n"
LONG_CONTEXT_CASES = [
    # tool, its args, the module, its inputs and outputs as the earlier system named them
    # (fleet-rlm-behaviour.md section 2), the child's code, the outputs that code gives
    pytest.param(
        "summarize_long_document", {"focus": "errors"},
        "SummarizeLongDocument", ["document", "focus"],
        "SUBMIT(summary=f'{len(document.splitlines())} lines on {focus}', "
        "key_points=['two errors'], coverage_pct=100)",
        {"summary": "3 lines on errors", "key_points": ["two errors"], "coverage_pct": 100},
        id="SummarizeLongDocument",
    ),
    pytest.param(
        "extract_from_logs", {"query": "error"},
        "ExtractFromLogs", ["logs", "query"],
        "SUBMIT(matches=[l for l in logs.splitlines() if query in l], "
        "patterns=['error at HH:MM'], time_range='10:01-10:02')",
        {
            "matches": ["error at 10:01", "error at 10:02"], "patterns": ["error at HH:MM"],
            "time_range": "10:01-10:02",
        },
        id="ExtractFromLogs",
    ),
    pytest.param(
        "grounded_answer", {"query": "when did it fail?"},
        "GroundedAnswerWithCitations", ["query", "evidence_chunks", "response_style"],
        "SUBMIT(answer=evidence_chunks[0].splitlines()[0], citations=['chunk 0'], "
        "confidence='high', coverage_notes=f'{len(evidence_chunks)} chunk, {response_style}')",
        {
            "answer": "error at 10:01", "citations": ["chunk 0"], "confidence": "high",
            "coverage_notes": "1 chunk, concise",
        },
        id="GroundedAnswerWithCitations",
    ),
    pytest.param(
        "triage_incident_logs", {"query": "what broke?", "service_context": "api gateway"},
        "IncidentTriageFromLogs", ["logs", "service_context", "query"],
        "SUBMIT(severity='high', probable_root_causes=[service_context + ' errors'], "
        "impacted_components=['api'], recommended_actions=['restart'], "
        "time_range=logs.splitlines()[0][-5:] + '-' + logs.splitlines()[-1][-5:])",
        {
            "severity": "high", "probable_root_causes": ["api gateway errors"],
            "impacted_components": ["api"], "recommended_actions": ["restart"],
            "time_range": "10:01-10:02",
        },
        id="IncidentTriageFromLogs",
    ),
    pytest.param(
        "plan_code_change",
        {"task": "add retries", "repo_context": "client.py", "constraints": "no new deps"},
        "CodeChangePlan", ["task", "repo_context", "constraints"],
        "SUBMIT(plan_steps=[task + ' in ' + repo_context], files_to_touch=[repo_context], "
        "validation_commands=['pytest'], risks=[constraints])",
        {
            "plan_steps": ["add retries in client.py"], "files_to_touch": ["client.py"],
            "validation_commands": ["pytest"], "risks": ["no new deps"],
        },
        id="CodeChangePlan",
    ),
    pytest.param(
        "propose_core_memory_update", {},
        "CoreMemoryUpdateProposal", ["turn_history", "current_memory"],
        "SUBMIT(keep=sorted(current_memory), update=[], remove=[], "
        "rationale=f'{len(turn_history)} earlier turns')",
        {
            "keep": ["human", "persona", "scratchpad"], "update": [], "remove": [],
            "rationale": "0 earlier turns",
        },
        id="CoreMemoryUpdateProposal",
    ),
]  # fmt: skip


SEEN = {
    "SummarizeLongDocument": "3 lines on errors",
    "ExtractFromLogs": "HH:MM",
    "GroundedAnswerWithCitations": "1 chunk, concise",
    "IncidentTriageFromLogs": "api gateway errors",
    "CodeChangePlan": "add retries in client.py",
    "CoreMemoryUpdateProposal": "0 earlier turns",
}
"""An output value of each case's child that nothing before the tool's answer contains."""


@pytest.mark.parametrize(
    ("tool", "args", "module", "inputs", "code", "outputs"), LONG_CONTEXT_CASES
)
async def test_a_long_context_module_runs_on_the_engine_with_its_own_signature(
    processes: Processes,
    tool: str,
    args: dict[str, Any],
    module: str,
    inputs: list[str],
    code: str,
    outputs: dict[str, Any],
) -> None:
    async with session(processes) as s:
        blobs = await JetStreamBlobs.open(s.nc.jetstream())
        ref = await blobs.put(s.tenant, LOGS.encode())
        script = [
            act("load_document", {"source": f"upload:{ref.sha256}", "alias": "app.log"}),
            act(tool, args),
            step(code),
            act("finish"),
            extract("analysed"),
        ]
        with ScriptedLM(script) as fake:
            await s.use_model(fake)
            turn = await s.ask("Analyse the uploaded log document")
            ended = await s.ended(turn)
            events = await s.run_events(turn)
            _, asked, child = await child_of(s, events, tool)
    assert isinstance(ended, TurnCompleted), ended
    assert asked.task == module
    started = child[0]
    assert isinstance(started, RunStarted)
    assert started.kind == "rlm"
    assert list(started.inputs) == inputs
    given, produced = started.signature.split("->")
    assert names(given) == inputs
    assert names(produced) == list(outputs)
    assert isinstance(child[-1], RunCompleted), child[-1]
    (returned,) = [r for r in of_type(events, ToolReturned) if r.tool == tool]
    assert returned.error == ""
    assert returned.result == outputs
    # ReAct's step after the tool read the outputs as its observation
    assert SEEN[module] not in fake.requests[1].prompt_text
    assert SEEN[module] in fake.requests[3].prompt_text


def names(fields: str) -> list[str]:
    return [part.split(":")[0].strip() for part in fields.split(",")]


async def test_a_react_step_whose_context_outgrows_the_threshold_escalates_to_the_rlm(
    processes: Processes,
) -> None:
    text = "".join(f"line-{n:03d} " + "x" * 50 + "\n" for n in range(1, 121))
    async with session(processes) as s:
        blobs = await JetStreamBlobs.open(s.nc.jetstream())
        ref = await blobs.put(s.tenant, text.encode())
        script = [
            act("load_document", {"source": f"upload:{ref.sha256}", "alias": "big"}),
            act("read_file_slice", {"start_line": 1, "num_lines": 120}),
            # the child RLM: the trajectory so far is in its context, nothing is lost
            step(
                "t = context['trajectory']\n"
                "SUBMIT(answer=f\"{t.count('line-')} lines, ended {'[lines 1-120 of 120]' in t}\")"
            ),
        ]
        with ScriptedLM(script) as fake:
            await s.use_model(fake)
            turn = await s.ask("Read the uploaded document and count its lines")
            ended = await s.ended(turn)
            events = await s.run_events(turn)
    assert isinstance(ended, TurnCompleted), ended
    assert ended.answer == "120 lines, ended True"
    opening, up = of_type(events, Escalated)
    assert (opening.to_module, opening.rule) == ("react", "tools_needed")
    assert (up.from_module, up.to_module, up.rule) == ("react", "rlm", "context_over_threshold")
    assert f"over the threshold of {THRESHOLD}" in up.detail
    assert "ReAct" in up.detail
    assert len(fake.requests) == 3  # no ReAct step was asked with the outgrown context
    (done,) = of_type(events, ChildRunCompleted)
    assert done.answer == "120 lines, ended True"
    assert isinstance(events[-1], RunCompleted)
    assert events[-1].outputs == {"module": "rlm"}


async def test_after_the_escalated_rlm_fails_react_goes_on_without_climbing_again(
    processes: Processes,
) -> None:
    text = "".join(f"line-{n:03d} " + "x" * 50 + "\n" for n in range(1, 121))
    async with session(processes) as s:
        blobs = await JetStreamBlobs.open(s.nc.jetstream())
        ref = await blobs.put(s.tenant, text.encode())
        grow = [
            act("load_document", {"source": f"upload:{ref.sha256}", "alias": "big"}),
            act("read_file_slice", {"start_line": 1, "num_lines": 120}),
        ]
        script: list[Reply | str] = [
            *grow,
            Reply("the model server broke", status=500),  # the child RLM's step
            *grow,  # ReAct again, past the threshold again: it does not climb twice
            act("finish"),
            extract("answered by ReAct"),
        ]
        with ScriptedLM(script) as fake:
            await s.use_model(fake)
            turn = await s.ask("Read the uploaded document and count its lines")
            ended = await s.ended(turn)
            events = await s.run_events(turn)
    assert isinstance(ended, TurnCompleted), ended
    assert ended.answer == "answered by ReAct"
    assert [(e.from_module, e.to_module) for e in of_type(events, Escalated)] == [
        ("cot", "react"),
        ("react", "rlm"),
    ]
    assert len(of_type(events, ChildRunFailed)) == 1
    (down,) = of_type(events, FellBack)
    assert (down.from_module, down.to_module, down.reason) == ("rlm", "react", "rlm_failed")
    assert len(fake.requests) == len(script)
    assert isinstance(events[-1], RunCompleted)
    assert events[-1].outputs == {"module": "react"}
