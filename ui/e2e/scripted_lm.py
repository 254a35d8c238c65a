"""The FAKE scripted LM for the browser tests (not a model): answers the chat agent's and the
RLM's steps by what the prompt already holds, so a resumed or repeated step gets the same
answer. It prints its base URL on the first line and serves until killed.

- an RLM step (output fields `reasoning`, `code`): compute 6 * 7 and print it, run a failing
  cell, then SUBMIT; a task that says "count slowly" gets a cell that prints for 8 s (the
  cancel test); a model named `*scripted-alt*` (the profile the settings test makes) submits
  "42 via alt";
- a ReAct step (`next_tool_name`): ask the user which region, and finish once answered (or
  at once when the uploaded minutes' text is in the prompt);
- a ChainOfThought asked to "think slowly": an answer streamed at 0.4 s a word (~6 s, the
  call-in-flight test);
- a computable question that says "fall back": the code route's cell divides by zero (twice):
  the turn fails `not_computed` (the honest-failure test);
- a question that says "tools fail": ChainOfThought wants the tools, ReAct's step gets a 503,
  and the ChainOfThought it falls back to answers "sunny, I think" (the fallback-line test);
- ReAct's extract or a ChainOfThought (`answer`): the region chosen, the launch code when the
  prompt holds the uploaded minutes' text ("the launch code is ZEBRA-4417"), or "four";
- the connectivity probe ("Reply with exactly OK"): OK.
"""

import time

from fleet_harness.scripted_lm import Reply, ScriptedLM, ScriptedRequest

LAUNCH = "the launch code is ZEBRA-4417"  # the browser test's uploaded minutes say so
SLOW = "import time\nfor i in range(80):\n    print('tick', i, flush=True)\n    time.sleep(0.1)"


def _fields(**values: str) -> str:
    body = "".join(f"[[ ## {name} ## ]]\n{value}\n\n" for name, value in values.items())
    return body + "[[ ## completed ## ]]\n"


def _step(code: str, reasoning: str) -> str:
    return _fields(reasoning=reasoning, code=f"```python\n{code}\n```")


def _rlm(request: ScriptedRequest) -> Reply:
    text = request.prompt_text
    if "count slowly" in text.lower():
        return Reply(_step(SLOW, "count, slowly"), prompt_tokens=90)
    if "print(6 * 7)" not in text:
        return Reply(_step("x = 6 * 7\nprint(6 * 7)", "compute it"), prompt_tokens=120)
    if "1 / 0" not in text:
        return Reply(_step("1 / 0", "a cell that fails"), prompt_tokens=160)
    if "scripted-alt" in request.model:
        return Reply(_step("SUBMIT(answer=str(x) + ' via alt')", "submit"), prompt_tokens=210)
    return Reply(_step("SUBMIT(answer=str(x))", "submit"), prompt_tokens=200)


def answer(request: ScriptedRequest) -> Reply:
    system, text = request.system, request.prompt_text
    if "Reply with exactly OK" in text:  # the connectivity probe (Settings: Test)
        return Reply("OK")
    if "next_tool_name" in system and "tools fail" in text.lower():  # the fallback test
        return Reply("", status=503, error_code="overloaded")
    if "next_tool_name" in system:  # a ReAct step
        if "eu please" in text or LAUNCH in text:  # answered, or the document says it
            return Reply(_fields(next_thought="done", next_tool_name="finish", next_tool_args="{}"))
        args = '{"question": "Which region?", "options": ["eu", "us"]}'
        return Reply(_fields(next_thought="ask", next_tool_name="ask_user", next_tool_args=args))
    if "`code`" not in system and "think slowly" in text.lower():  # the in-flight test
        slow = "Thinking it through slowly, one word at a time: Paris is the capital of France."
        return Reply(_fields(reasoning="slowly", answer=slow, needs_tools="False"),
                     pace_s=0.4)  # fmt: skip
    if "previous_error" in system and "fall back" in text.lower():  # the code route fails
        return Reply(_fields(code="print(7 / 0)"))
    if "`code`" not in system and "tools fail" in text.lower():  # needs the tools, then not
        return Reply(_fields(reasoning="tools", answer="sunny, I think", needs_tools="True"))
    if "`code`" not in system:  # ReAct's extract, or a ChainOfThought
        if "eu please" in text:
            return Reply(_fields(reasoning="they chose", answer="deploying to eu"))
        if LAUNCH in text:  # the uploaded document's text reached the prompt
            return Reply(
                _fields(
                    reasoning="it is in the minutes",
                    answer="ZEBRA-4417, per the minutes",
                    needs_tools="False",
                )
            )
        return Reply(_fields(reasoning="easy", answer="four", needs_tools="False"))
    return _rlm(request)


if __name__ == "__main__":
    lm = ScriptedLM(answer, latency_s=0.5).start()
    print(lm.base_url, flush=True)
    while True:
        time.sleep(3600)
