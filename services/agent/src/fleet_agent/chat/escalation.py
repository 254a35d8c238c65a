"""Which module answers a turn: the escalation rule, CoT -> ReAct -> RLM, and the fallbacks.
Pure: no I/O, no dspy.

The rule, in order (the first that fires decides; each move is a `run.escalated` event):

1. mode `rlm_only`: straight to the RLM (`rlm_only`).
2. the turn's context (message + history + core memory) is over the threshold (32,000
   characters by default) and the mode allows the RLM: straight to the RLM
   (`context_over_threshold`); a context that size does not fit a chat prompt.
3. the message names something only a tool can reach (documents, files, memory, a URL, code,
   logs, the sandbox): to ReAct without paying for a ChainOfThought first (`tools_needed`).
4. otherwise ChainOfThought answers; if it says it needs tools (its `needs_tools` output, or
   `[TOOLS NEEDED]` in its reasoning), to ReAct (`tools_needed`).
5. before each ReAct step: when the turn's context plus ReAct's trajectory so far (what its
   tools answered) is over the threshold and the mode allows the RLM, the turn goes on in
   the RLM with that trajectory in its context (`context_over_threshold`), rather than
   sending a prompt that size. Not after a fallback (the RLM already failed this turn).

A module whose step fails hands the turn down one module (`run.fell_back`): the RLM to ReAct,
ReAct to ChainOfThought; ChainOfThought failing fails the turn. `tools_only` never reaches the
RLM. Two rules keep a fallback from answering in the first module's name:

- a mode is a contract: under `rlm_only` the RLM answers or the turn fails with the RLM's own
  reason; nothing else answers;
- a fallback that cannot see the task's context is not tried: ChainOfThought has no tools, so
  a turn whose context lives only in the sandbox (`--context` files, a repository, a document
  too long to put in the prompt) fails with ReAct's reason rather than be answered blind.

A fallback that answers is named where the user reads the answer (`fallback_note`, carried by
`run.completed` and `turn.completed` as `fallback`).
"""

import re

from fleet_agent.run.failures import InputError
from fleet_events.run import Escalated
from fleet_events.session import EXECUTION_MODES

MODES = EXECUTION_MODES
CONTEXT_THRESHOLD = 32_000
TOOLS_MARKER = "[TOOLS NEEDED]"

TOOL_WORDS = re.compile(
    r"https?://\S+|\b(?:documents?|files?|uploads?|uploaded|pdfs?|memory|remember|"
    r"forget|sandbox|logs?|repo(?:sitory)?|code|scripts?|urls?|web ?page)\b",
    re.IGNORECASE,
)


class UnknownMode(InputError):
    """A turn asked for an execution mode this agent does not have."""


def check_mode(mode: str) -> str:
    if mode not in MODES:
        raise UnknownMode(
            f"execution mode {mode[:40]!r} is not one of {', '.join(MODES)}: use one of them "
            "(auto lets the agent choose)"
        )
    return mode


def context_chars(message: str, history: list[dict[str, str]], memory: str) -> int:
    return len(message) + len(memory) + sum(len(t["question"]) + len(t["answer"]) for t in history)


def opening(mode: str, chars: int, message: str, threshold: int) -> Escalated | None:
    """Where a turn starts, when not at ChainOfThought (None: ChainOfThought first)."""
    if mode == "rlm_only":
        return Escalated(
            from_module="cot", to_module="rlm", rule="rlm_only", detail="the turn's mode"
        )
    if mode != "tools_only" and chars > threshold:
        return Escalated(
            from_module="cot",
            to_module="rlm",
            rule="context_over_threshold",
            detail=f"{chars} characters of context, over the threshold of {threshold}",
        )
    named = TOOL_WORDS.search(message)
    if named is not None:
        return Escalated(
            from_module="cot",
            to_module="react",
            rule="tools_needed",
            detail=f"the message mentions {named.group(0)[:80]!r}",
        )
    return None


def after_cot(needs_tools: bool, reasoning: str) -> Escalated | None:
    """ChainOfThought answered: does the turn go on to ReAct?"""
    if needs_tools:
        detail = "ChainOfThought answered needs_tools=True"
    elif TOOLS_MARKER in reasoning:
        detail = f"ChainOfThought's reasoning says {TOOLS_MARKER}"
    else:
        return None
    return Escalated(from_module="cot", to_module="react", rule="tools_needed", detail=detail)


def during_react(mode: str, chars: int, threshold: int) -> Escalated | None:
    """Before a ReAct step whose context (turn + trajectory) is `chars` long: on to the RLM?"""
    if mode == "tools_only" or chars <= threshold:
        return None
    return Escalated(
        from_module="react",
        to_module="rlm",
        rule="context_over_threshold",
        detail=(
            f"ReAct's trajectory brought the context to {chars} characters, over the "
            f"threshold of {threshold}"
        ),
    )


MODULE_NAMES = {"cot": "chain of thought", "react": "ReAct (the tools)", "rlm": "the RLM"}
NOTE_REASON_CHARS = 400


def fallback_from(module: str, mode: str, *, context_in_sandbox: bool = False) -> str | None:
    """The module a failed step hands the turn to (None: the turn fails with the step's reason).
    `context_in_sandbox`: the turn's context is reachable only with tools (the module docstring's
    second rule)."""
    if mode == "rlm_only":
        return None
    if module == "rlm":
        return "react"
    if module == "react" and not context_in_sandbox:
        return "cot"
    return None


def fallback_note(from_module: str, to_module: str, reason: str) -> str:
    """The line shown beside a fallback's answer: who answered, who failed first, and why
    (`reason` cut at a word, never mid-word)."""
    reason = " ".join(reason.split())
    if len(reason) > NOTE_REASON_CHARS:
        cut = reason[:NOTE_REASON_CHARS].rsplit(" ", 1)[0]
        reason = f"{cut} …"
    return (
        f"answered by {MODULE_NAMES.get(to_module, to_module)} after "
        f"{MODULE_NAMES.get(from_module, from_module)} failed: {reason}"
    )
