"""The chat agent's signatures, and the long-context modules it runs on the recursive engine.

The long-context signatures keep the earlier system's names and fields (fleet-rlm-behaviour.md
section 2), so a user who knew them finds them; the engine takes a signature as a string.
"""

import dspy

CORE_MEMORY_HELP = "the agent's core memory: persona, human and scratchpad blocks"


class ChatTurn(dspy.Signature):  # type: ignore[misc]  # dspy ships no types
    """Answer the user's message from the conversation so far. If answering needs a tool
    (loading or reading documents or files, changing memory, running code, a long-context
    analysis, or asking the user), set needs_tools and say [TOOLS NEEDED] in your reasoning."""

    question: str = dspy.InputField()
    history: dspy.History = dspy.InputField()
    core_memory: str = dspy.InputField(desc=CORE_MEMORY_HELP)
    answer: str = dspy.OutputField()
    needs_tools: bool = dspy.OutputField(desc="True when a tool is needed to answer well")


class ChatAgent(dspy.Signature):  # type: ignore[misc]
    """Answer the user's message, using the tools where they help. Documents are loaded by
    reference: read slices, search or chunk them rather than asking for the whole text. Ask
    the user (ask_user) only when the message cannot be answered without them."""

    question: str = dspy.InputField()
    history: dspy.History = dspy.InputField()
    core_memory: str = dspy.InputField(desc=CORE_MEMORY_HELP)
    documents: str = dspy.InputField(desc="the session's loaded documents, the active one marked")
    answer: str = dspy.OutputField()


class ComputeTurn(dspy.Signature):  # type: ignore[misc]
    """Write one short Python cell that computes the answer to the question and prints it.
    Use only the standard library and the variables listed (they already exist: do not
    define them again); files listed are in the working directory. Print only the answer.
    The code computes; it never states the answer: for "What is 6 * 7?" write
    `print(6 * 7)`, and for "How many words are in the context?" write
    `print(len(context.split()))`.
    If previous_error is set, your last code raised it: write different code."""

    question: str = dspy.InputField()
    variables: str = dspy.InputField(desc="the variables and files the code can use")
    previous_error: str = dspy.InputField(desc="what the last attempt's code raised, or empty")
    code: str = dspy.OutputField(
        desc="Python code only, no explanation, no markdown; it ends by printing the answer"
    )


RLM_TURN = "task, context -> answer"
"""The RLM route of a turn (escalation) and of `rlm_query` / `delegate_to_rlm`."""

LONG_CONTEXT: dict[str, tuple[str, str]] = {
    "SummarizeLongDocument": (
        "document, focus -> summary, key_points: list[str], coverage_pct: int",
        "summary",
    ),
    "ExtractFromLogs": (
        "logs, query -> matches: list[str], patterns: list[str], time_range",
        "matches",
    ),
    "GroundedAnswerWithCitations": (
        "query, evidence_chunks: list[str], response_style -> answer, citations: list[str], "
        "confidence, coverage_notes",
        "answer",
    ),
    "IncidentTriageFromLogs": (
        "logs, service_context, query -> severity, probable_root_causes: list[str], "
        "impacted_components: list[str], recommended_actions: list[str], time_range",
        "probable_root_causes",
    ),
    "CodeChangePlan": (
        "task, repo_context, constraints -> plan_steps: list[str], files_to_touch: list[str], "
        "validation_commands: list[str], risks: list[str]",
        "plan_steps",
    ),
    "CoreMemoryUpdateProposal": (
        "turn_history, current_memory -> keep: list[str], update: list[str], "
        "remove: list[str], rationale",
        "rationale",
    ),
}
"""Module name -> (signature, the output a caller reads as its answer)."""
