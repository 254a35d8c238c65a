"""The answer field out of a streamed chat-adapter reply: headers split across tokens, the
reasoning before it and the fields after it are never shown; the deltas join to the parsed field."""

import itertools
import re

import dspy
from hypothesis import given
from hypothesis import strategies as st

from fleet_agent.answer_stream import FieldStream

REPLY = (
    "[[ ## reasoning ## ]]\nAdd them: [1, 2] sums to 3.\n\n"
    "[[ ## answer ## ]]\nThe sum is 3; see x[[0]] and [note].\n\n"
    "[[ ## needs_tools ## ]]\nFalse\n\n[[ ## completed ## ]]"
)


class Turn(dspy.Signature):  # type: ignore[misc]  # dspy ships no types
    question: str = dspy.InputField()
    answer: str = dspy.OutputField()
    needs_tools: bool = dspy.OutputField()


def parsed_answer(reply: str) -> str:
    signature = dspy.ChainOfThought(Turn).predict.signature
    return str(dspy.ChatAdapter(use_json_adapter_fallback=False).parse(signature, reply)["answer"])


def streamed(pieces: list[str]) -> list[str]:
    field = FieldStream("answer")
    out = [field.feed(piece) for piece in pieces]
    out.append(field.finish())
    return [piece for piece in out if piece]


def test_token_by_token_the_deltas_are_the_answer_only() -> None:
    pieces = re.findall(r"\S+\s*|\s+", REPLY)
    deltas = streamed(pieces)
    assert "".join(deltas) == parsed_answer(REPLY) == "The sum is 3; see x[[0]] and [note]."
    assert len(deltas) > 3  # it streamed, it did not arrive in one piece at the end


@given(st.lists(st.integers(min_value=1, max_value=len(REPLY) - 1), max_size=40))
def test_wherever_the_reply_is_cut_the_deltas_join_to_the_answer(cuts: list[int]) -> None:
    points = [0, *sorted(set(cuts)), len(REPLY)]
    pieces = [REPLY[a:b] for a, b in itertools.pairwise(points)]
    assert "".join(streamed(pieces)) == parsed_answer(REPLY)


def test_a_reply_without_the_field_streams_nothing() -> None:
    assert streamed(["[[ ## reasoning ## ]]\nthink\n\n[[ ## code ## ]]\nprint(1)\n"]) == []
    assert streamed(["plain text, as an llm_query answer is"]) == []


def test_an_answer_cut_short_is_flushed_at_the_end() -> None:
    assert streamed(["[[ ## answer ## ]]\npartial [", "[ #"]) == ["partial", " [[ #"]
