"""Computable questions go to code (issue 20 item 2): the chat agent decides by the stated rule
(`escalation.computable`, recorded as `run.compute_decided`), the model writes one cell, the
real sandbox runs it, and the answer is the cell's output, citing the cell. A question code
does not compute stays with chain of thought, and says why.

A real broker, budget and agent replica (`FLEET_AGENT_RUNNER=chat`) as processes; the scripted
LM (a FAKE model server) writes the model's side.
"""

import pytest

from fleet_events import new_id
from fleet_events.run import ComputeDecided, Escalated, FellBack, ToolCalled, ToolReturned
from fleet_events.session import (
    DocumentLoaded,
    DocumentRef,
    TurnCompleted,
    TurnFailed,
    TurnRequested,
)
from fleet_harness.scripted_lm import Reply, ScriptedLM
from fleet_mesh.blobs import JetStreamBlobs

from .rlm_kit import Processes, Session, fields, of_type, processes, session

__all__ = ["processes"]

pytestmark = pytest.mark.slow

AGENT_ENV = {"FLEET_AGENT_RUNNER": "chat", "FLEET_AGENT_TURN_SLOTS": "2"}


def code(text: str) -> str:
    return fields(code=text)


def cot(answer: str) -> str:
    return fields(reasoning="thinking", answer=answer, needs_tools="False")


async def ask_about(s: Session, question: str, alias: str, origin: str, text: str) -> str:
    """`text` uploaded as the session's document `alias`, then `question` asked with it."""
    blobs = await JetStreamBlobs.open(s.nc.jetstream())
    blob = await blobs.put(s.tenant, text.encode())
    doc = DocumentRef(alias=alias, source="upload", origin=origin, blob=blob, chars=len(text))
    await s.append(None, DocumentLoaded(document=doc))
    turn = new_id()
    await s.append(turn, TurnRequested(message=question, document_ids=(alias,)))
    return turn


async def test_arithmetic_is_computed_by_one_cell_and_the_answer_cites_it(
    processes: Processes,
) -> None:
    # the embedded 0.5B model answered "17 * 23" with 451, confidently; a cell cannot
    with ScriptedLM([code("```python\nprint(17 * 23)\n```")]) as fake:
        async with session(processes) as s:
            await s.use_model(fake)
            turn = await s.ask("What is 17 * 23?")
            ended = await s.ended(turn, timeout=120)
            events = await s.run_events(turn)
    assert isinstance(ended, TurnCompleted), ended
    assert ended.answer.splitlines()[0] == "391"
    assert "print(17 * 23)" in ended.answer  # the cell, cited
    assert (ended.answered_by, ended.fallback) == ("code", "")
    (decided,) = of_type(events, ComputeDecided)
    assert (decided.computable, decided.rule) == (True, "arithmetic")
    assert "'17 * 23'" in decided.detail
    (up,) = of_type(events, Escalated)
    assert (up.from_module, up.to_module, up.rule) == ("cot", "code", "computable")
    (ran,) = of_type(events, ToolReturned)
    assert (ran.tool, ran.result.strip(), ran.error) == ("execute_code", "391", "")
    assert len(fake.requests) == 1  # one model call: the cell, no chain of thought first


async def test_a_count_over_an_attached_document_runs_over_its_text(processes: Processes) -> None:
    lines = [f"line {n} NEEDLE" if n % 13 == 0 else f"line {n} hay" for n in range(1, 301)]
    text = "\n".join(lines) + "\n"
    count = "print(sum('NEEDLE' in line for line in context.splitlines()))"
    with ScriptedLM([code(count)]) as fake:
        async with session(processes) as s:
            await s.use_model(fake)
            asked = "How many lines contain NEEDLE?"
            turn = await ask_about(s, asked, "hay", "haystack.txt", text)
            ended = await s.ended(turn, timeout=120)
            events = await s.run_events(turn)
    assert isinstance(ended, TurnCompleted), ended
    assert ended.answer.splitlines()[0] == str(sum("NEEDLE" in line for line in lines)) == "23"
    (decided,) = of_type(events, ComputeDecided)
    assert decided.rule == "count_over_context"
    # the model was told the variable as it exists, and its size
    assert "context: str" in fake.requests[0].prompt_text


async def test_a_column_of_an_attached_csv_is_summed_over_rows_the_prelude_parsed(
    processes: Processes,
) -> None:
    sales = "region,units,price\nnorth,12,3.5\nsouth,7,4.0\neast,30,2.25\nwest,25,1.0\n"
    total = "print(sum(row['units'] for row in sales_rows))"
    with ScriptedLM([code(total)]) as fake:
        async with session(processes) as s:
            await s.use_model(fake)
            asked = "What is the sum of the units column?"
            turn = await ask_about(s, asked, "sales", "sales.csv", sales)
            ended = await s.ended(turn, timeout=120)
    assert isinstance(ended, TurnCompleted), ended
    assert ended.answer.splitlines()[0] == "74"  # ints, not the strings "12" + "7" + ...
    assert "sales_rows = [" in ended.answer  # the cited cell shows how the rows were read
    prompt = fake.requests[0].prompt_text
    assert "sales_rows: list of dict, sales read as CSV" in prompt
    assert "keys 'region', 'units', 'price'" in prompt


async def test_code_that_fails_twice_fails_the_turn_saying_so_and_no_guess_stands_in(
    processes: Processes,
) -> None:
    # the embedded model wrote "17 * 23 = 409" twice; chain of thought then said 451: a
    # question code computes is answered by code or not at all
    script = [code("print(undefined_name)"), code("print(1 / 0)"), cot("451, I believe")]
    with ScriptedLM(script) as fake:
        async with session(processes) as s:
            await s.use_model(fake)
            turn = await s.ask("What is 17 * 23?")
            ended = await s.ended(turn, timeout=120)
            events = await s.run_events(turn)
            prompts = [r.prompt_text for r in fake.requests]
            temperatures = [r.body.get("temperature") for r in fake.requests]
    assert isinstance(ended, TurnFailed), ended
    assert ended.code == "not_computed"
    assert "ZeroDivisionError" in ended.error  # the last cell's error, named
    assert "no guess is given instead" in ended.error
    assert len(prompts) == 2  # the two cells' calls: chain of thought was never asked
    assert of_type(events, FellBack) == []
    assert [c.tool for c in of_type(events, ToolCalled)] == ["execute_code", "execute_code"]
    # the second attempt was shown the first one's error, and sampled: a step after an error
    # differs (at temperature 0 a small model repeats its failing line)
    assert "NameError" in prompts[1]
    assert "NameError" not in prompts[0]
    assert temperatures[1] == 0.7
    assert temperatures[0] != 0.7


async def test_a_question_code_does_not_compute_stays_with_cot_and_says_why(
    processes: Processes,
) -> None:
    with ScriptedLM([cot("Paris")]) as fake:
        async with session(processes) as s:
            await s.use_model(fake)
            turn = await s.ask("What is the capital of France?")
            ended = await s.ended(turn, timeout=120)
            events = await s.run_events(turn)
    assert isinstance(ended, TurnCompleted), ended
    assert (ended.answer, ended.answered_by) == ("Paris", "cot")
    (decided,) = of_type(events, ComputeDecided)
    assert (decided.computable, decided.rule) == (False, "none")
    assert of_type(events, ToolCalled) == []
    assert of_type(events, Escalated) == []


async def test_an_rlm_only_turn_whose_model_call_times_out_fails_naming_it(
    processes: Processes,
) -> None:
    # a 600 s call in rlm_only fell back to chain of thought and ended "completed" with a made
    # up count, while the server generated to its cap for a caller who had left
    words = " ".join(f"w{n}" for n in range(400))
    slow = Reply(words, pace_s=0.05)  # 20 s of generation
    with ScriptedLM([slow, cot("a guess")]) as fake:
        async with session(processes) as s:
            await s.use_model(fake, timeout_s=3.0, max_tokens=1000)
            turn = new_id()
            await s.append(turn, TurnRequested(message="Count the lines", mode="rlm_only"))
            ended = await s.ended(turn, timeout=120)
            events = await s.run_events(turn)
            ended_streams = set(fake.streams_ended)
            sent = list(fake.streamed)
    assert isinstance(ended, TurnFailed), ended
    assert ended.code == "llm_timeout"
    assert "ran past the profile's timeout of 3 s" in ended.error
    assert "tokens/s" in ended.error
    assert of_type(events, FellBack) == []  # rlm_only: nothing else answered
    assert len(fake.requests) == 1  # chain of thought was never asked
    # the abandoned request generated far fewer than its bound: the agent closed it
    assert 0 in ended_streams
    assert sent[0] < 400
