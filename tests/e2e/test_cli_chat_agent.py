"""`fleet chat` through a pseudo-terminal against a real `fleet up` running its default chat
agent (no `FLEET_AGENT_RUNNER`), which asks the scripted LM (a FAKE OpenAI-compatible server in
this test process). One typed line is a whole RLM turn: CoT says it needs tools, ReAct calls
`rlm_query`, that child run's RLM runs a code cell in a real sandbox and submits, ReAct
finishes and the extract's answer streams back. The terminal shows the cell, the child run
and the answer's streamed tokens (on a line of their own) before the turn's end; Ctrl-C while
a turn's one model call is held at a gate of the fake cancels the turn once that call returns
(it used to complete with the answer: nothing looked at the cancel after the last call), and
the session's log records it cancelled."""

import os
import re

import httpx
import pytest

from fleet_cli.mesh import gateway_dir
from fleet_harness.scripted_lm import Reply, ScriptedLM, ScriptedRequest
from fleet_harness.waits import eventually
from fleet_mesh.tokens import dev_token

from .conftest import StartMesh
from .test_cli_chat import ANSI, Terminal
from .test_cli_context import _ready, fields

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]
CELL = "print(f'WORDS={len(context.split())}')"
CHILD_ANSWER = "three words counted"
ANSWER = "The child run counted three words in the sandbox, streamed token by token."
HOLD = "please hold this turn"


class Screen(Terminal):
    def text(self) -> str:
        """What it printed so far, without the colours (offsets as `wait_for` counts them)."""
        return ANSI.sub(b"", self.seen).decode(errors="replace")


def model(request: ScriptedRequest) -> Reply | str:
    """Answers by which module asks (its system prompt) and what the prompt holds so far."""
    prompt, system = request.prompt_text, request.system
    if HOLD in prompt:
        return Reply(fields(reasoning="held", answer="never sent", needs_tools=False), gate="held")
    if "[[ ## code ## ]]" in system:  # the child run's RLM step
        if "WORDS=3" in prompt:  # the cell ran and its output is in the trajectory
            code = f"SUBMIT(answer={CHILD_ANSWER!r})"
            return fields(reasoning="the cell counted", code=f"```python\n{code}\n```")
        return fields(reasoning="count in the sandbox", code=f"```python\n{CELL}\n```")
    if "next_tool_name" in system:  # ReAct: hand the counting to a child run, then finish
        if CHILD_ANSWER in prompt:
            return fields(next_thought="the child answered", next_tool_name="finish",
                          next_tool_args="{}")  # fmt: skip
        args = '{"query": "count the words", "context": "alpha beta gamma"}'
        return fields(next_thought="a child run counts", next_tool_name="rlm_query",
                      next_tool_args=args)  # fmt: skip
    if "needs_tools" in system:  # CoT: escalate
        return fields(reasoning="this needs code", answer="", needs_tools=True)
    return fields(reasoning="from the trajectory", answer=ANSWER)  # ReAct's extract: streamed


async def test_chat_shows_the_cell_the_child_run_and_streamed_answer_then_ctrl_c_cancels(
    start_mesh: StartMesh,
) -> None:
    with ScriptedLM(model) as fake:
        mesh = start_mesh(runner=None, env={  # fleet up's default runner: the chat agent
            "FLEET_LLM_MODEL": "openai/scripted", "FLEET_LLM_API_BASE": fake.base_url,
            "FLEET_LLM_API_KEY": "fake-key",
        })  # fmt: skip
        await eventually(lambda: _ready(mesh), timeout=120, interval=0.25, what="/ready")
        term = Screen(mesh, {"COLUMNS": "200"})
        try:
            header = term.wait_for("(Ctrl-C cancels a turn")
            plain = term.text()
            found = re.search(r"session (\S+) \(Ctrl-C", plain)
            assert found, plain
            session = found.group(1)
            at = term.wait_for("you> ", header)
            term.type(b"How many words are in my context?\r")
            child = term.wait_for("· child run ", at)
            # the cell's first line and what it printed (the sandbox's facade set-up cell
            # comes first: it is recorded as a cell too)
            term.wait_for("] print(f'WORDS={len(context.split())}') → WORDS=3", child)
            assert term.wait_for("answered: three words counted", child)
            # the tokens were written as they came, on a line of their own, before the
            # turn's end (its last event lines) and the answer it printed then
            streamed = term.wait_for(f"\n{ANSWER}\r\n", at)
            ended = term.wait_for("· turn.completed", streamed)
            term.wait_for(f"fleet> {ANSWER}", ended)
            at = term.wait_for("you> ", ended)

            held = fake.gate("held")
            term.type(f"{HOLD} now\r".encode())
            await eventually(lambda: held.arrivals > 0, timeout=60, what="the held model call")
            term.type(b"\x03")  # Ctrl-C: the terminal's SIGINT to the chat
            at = term.wait_for("cancelling the turn", at)
            at = term.wait_for("· turn.cancel_requested", at)
            # the model call in flight is not cut: the run stops at its next step
            held.release()
            at = term.wait_for("· turn.cancelled", at)
            at = term.wait_for("turn cancelled", at)
            at = term.wait_for("you> ", at)  # still chatting
            term.type(b"\x04")  # Ctrl-D at the prompt: leave
            assert term.exit_status() == 0
        finally:
            if term.status is None:  # a failed assertion left it running
                os.kill(term.pid, 9)
                term.exit_status()
            os.close(term.fd)
        token = dev_token(gateway_dir(mesh.data_dir))
        async with httpx.AsyncClient(headers={"Authorization": f"Bearer {token}"}) as http:
            turns = await http.get(f"{mesh.gateway}/api/v1/sessions/{session}/turns")
        assert turns.status_code == 200, turns.text
        statuses = [(t["user_message"], t["status"]) for t in turns.json()["items"]]
        assert statuses == [
            ("How many words are in my context?", "completed"),
            (f"{HOLD} now", "cancelled"),  # TurnCancelled on the session's log
        ]
