"""Which module answers a turn: the escalation rule, CoT -> ReAct -> RLM, and the fallbacks.
Pure: no I/O, no dspy.

The rule, in order (the first that fires decides; each move is a `run.escalated` event):

1. mode `rlm_only`: straight to the RLM (`rlm_only`).
2. the turn's context (message + history + core memory) is over the threshold (32,000
   characters by default) and the mode allows the RLM: straight to the RLM
   (`context_over_threshold`); a context that size does not fit a chat prompt.
3. (`auto`, `tools_only`) the question is one code computes (`computable`: arithmetic, a date
   calculation, or a count/sum/average over attached context): one sandbox cell answers it
   (`code`), and the answer cites the cell. The decision is recorded either way
   (`run.compute_decided`): a question left to ChainOfThought says why.
4. the message names something only a tool can reach (documents, files, memory, a URL, code,
   logs, the sandbox): to ReAct without paying for a ChainOfThought first (`tools_needed`).
5. otherwise ChainOfThought answers; if it says it needs tools (its `needs_tools` output, or
   `[TOOLS NEEDED]` in its reasoning), to ReAct (`tools_needed`).
6. before each ReAct step: when the turn's context plus ReAct's trajectory so far (what its
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
from fleet_events.run import ComputeDecided, Escalated
from fleet_events.session import EXECUTION_MODES

MODES = EXECUTION_MODES
CONTEXT_THRESHOLD = 32_000
TOOLS_MARKER = "[TOOLS NEEDED]"

TOOL_WORDS = re.compile(
    r"https?://\S+|\b(?:documents?|files?|uploads?|uploaded|pdfs?|memory|remember|"
    r"forget|sandbox|logs?|repo(?:sitory)?|code|scripts?|urls?|web ?page)\b",
    re.IGNORECASE,
)


_NUMBER = r"-?\d[\d,_]*(?:\.\d+)?"
ARITHMETIC = re.compile(
    rf"{_NUMBER}(?:\s*(?:\*\*|[+*/\u00d7\u00f7^])\s*|\s+(?:-|x|times|plus|minus|divided by|"
    rf"multiplied by|to the power of|mod(?:ulo)?)\s+)\(?\s*{_NUMBER}"
    rf"|\b(?:square root|factorial|sqrt|percent(?:age)? of)\b.{{0,20}}\d"
    rf"|\d+(?:\.\d+)?\s*%\s*of\s*{_NUMBER}",
    re.IGNORECASE,
)
"""Arithmetic a cell computes exactly and a small model gets wrong ("17 * 23" -> "451")."""
DATES = re.compile(
    r"\b(?:days?|weeks?|months?|years?|hours?)\s+(?:are\s+there\s+)?(?:between|until|since|"
    r"from|before|after)\b.{0,40}\d"
    r"|\bday of the week\b|\bwhat (?:day|date) (?:is|was|will be)\b.{0,40}\d",
    re.IGNORECASE,
)
COUNTING = re.compile(
    r"\b(?:how many|count|number of|sum|total|average|mean|median|maximum|minimum|largest|"
    r"smallest|longest|shortest)\b",
    re.IGNORECASE,
)
"""A count or aggregate: computable when there is attached context to compute it over."""


def computable(question: str, has_context: bool) -> ComputeDecided:
    """The stated rule: does code compute the answer to `question` (the user's message, not
    the attached text)? `has_context`: documents or files are attached to the turn. Pure."""
    found = ARITHMETIC.search(question)
    if found is not None:
        return ComputeDecided(
            computable=True, rule="arithmetic",
            detail=f"the message has the arithmetic {found.group(0)[:80]!r}",
        )  # fmt: skip
    found = DATES.search(question)
    if found is not None:
        return ComputeDecided(
            computable=True, rule="dates",
            detail=f"the message asks a date calculation: {found.group(0)[:80]!r}",
        )  # fmt: skip
    found = COUNTING.search(question)
    if found is not None and has_context:
        return ComputeDecided(
            computable=True, rule="count_over_context",
            detail=f"the message asks {found.group(0)!r} over the attached context",
        )  # fmt: skip
    return ComputeDecided(
        computable=False, rule="none",
        detail="no arithmetic, date calculation, or count over attached context in the message",
    )  # fmt: skip


def to_code(decided: ComputeDecided) -> Escalated:
    return Escalated(from_module="cot", to_module="code", rule="computable", detail=decided.detail)


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


MODULE_NAMES = {
    "cot": "chain of thought",
    "code": "code in the sandbox",
    "react": "ReAct (the tools)",
    "rlm": "the RLM",
}
NOTE_REASON_CHARS = 400


def fallback_from(module: str, mode: str, *, context_in_sandbox: bool = False) -> str | None:
    """The module a failed step hands the turn to (None: the turn fails with the step's reason).
    `context_in_sandbox`: the turn's context is reachable only with tools (the module docstring's
    second rule)."""
    if mode == "rlm_only":
        return None
    if module == "rlm":
        return "react"
    if module == "code":  # the tools can read what the cell could; ChainOfThought only inline
        return "react" if context_in_sandbox else "cot"
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
