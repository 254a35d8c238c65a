"""The FAKE scripted LM for the browser smoke (not a model): answers an RLM's steps in order.

Each reply is chosen by what the prompt already holds, so a resumed or repeated step gets the
same answer: compute 6 * 7 and print it, run a failing cell, then SUBMIT. It prints its base
URL on the first line and serves until killed.
"""

import time

from fleet_harness.scripted_lm import Reply, ScriptedLM, ScriptedRequest


def _step(code: str, reasoning: str) -> str:
    body = f"[[ ## reasoning ## ]]\n{reasoning}\n\n[[ ## code ## ]]\n```python\n{code}\n```\n\n"
    return body + "[[ ## completed ## ]]\n"


def answer(request: ScriptedRequest) -> Reply:
    text = request.prompt_text
    if "print(6 * 7)" not in text:
        return Reply(_step("x = 6 * 7\nprint(6 * 7)", "compute it"), prompt_tokens=120)
    if "1 / 0" not in text:
        return Reply(_step("1 / 0", "a cell that fails"), prompt_tokens=160)
    return Reply(_step("SUBMIT(answer=str(x))", "submit"), prompt_tokens=200)


if __name__ == "__main__":
    lm = ScriptedLM(answer, latency_s=0.5).start()
    print(lm.base_url, flush=True)
    while True:
        time.sleep(3600)
