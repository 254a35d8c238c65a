"""What a profile's server kind does to a request: llama.cpp gets `max_tokens`, a grammar of the
chat adapter's fields, `json_object` with a schema; a generic server gets dspy's request."""

import dspy
import pytest
from dspy.clients.lm15_boundary import request_kwargs
from dspy.lm15 import Config, Message, Request

from fleet_agent.llm_wire import chat_grammar, for_server, output_fields
from fleet_events.llm import (
    InvalidProfile,
    LlmProfile,
    check_profile,
    decode_profile,
    encode_profile,
)

LLAMA = LlmProfile(name="local", model="openai/q", server_kind="llama.cpp", seed=7)
GENERIC = LlmProfile(name="big", model="openai/big")


class Turn(dspy.Signature):  # type: ignore[misc]  # dspy ships no types
    question: str = dspy.InputField()
    answer: str = dspy.OutputField()
    needs_tools: bool = dspy.OutputField()
    count: int = dspy.OutputField()


def chat_request(**config: object) -> Request:
    """The request dspy's ChatAdapter makes for a ChainOfThought of `Turn`."""
    signature = dspy.ChainOfThought(Turn).predict.signature
    adapter = dspy.ChatAdapter(use_json_adapter_fallback=False)
    formatted = adapter.format(signature, demos=[], inputs={"question": "what is 2+2?"})
    system = next(m["content"] for m in formatted if m["role"] == "system")
    users = [Message.user(m["content"]) for m in formatted if m["role"] == "user"]
    return Request(model="openai/x", system=system, messages=tuple(users), config=Config(**config))


def wire(request: Request) -> dict[str, object]:
    sent: dict[str, object] = request_kwargs(request, "chat")
    return sent


def test_the_chat_adapters_output_fields_are_read_from_its_reminder() -> None:
    fields = output_fields(chat_request())
    assert fields == [("reasoning", None), ("answer", None), ("needs_tools", "bool"),
                      ("count", "int")]  # fmt: skip
    plain = Request(model="openai/x", messages=(Message.user("just text"),))
    assert output_fields(plain) == []


def test_llama_cpp_gets_max_tokens_not_max_completion_tokens_and_the_seed() -> None:
    shaped = wire(for_server(chat_request(max_tokens=5), LLAMA))
    assert shaped["max_tokens"] == 5
    assert "max_completion_tokens" not in shaped
    assert shaped["seed"] == 7
    generic = wire(for_server(chat_request(max_tokens=5), GENERIC))
    assert generic["max_completion_tokens"] == 5
    assert not {"max_tokens", "grammar", "seed"} & set(generic)


def test_a_seed_the_caller_chose_is_kept() -> None:
    assert wire(for_server(chat_request(seed=3), LLAMA))["seed"] == 3


def test_llama_cpp_gets_a_grammar_of_the_adapters_fields_in_order() -> None:
    grammar = wire(for_server(chat_request(), LLAMA))["grammar"]
    assert isinstance(grammar, str)
    assert grammar == chat_grammar(output_fields(chat_request()))
    root = grammar.splitlines()[0]
    assert root == 'root ::= f0 "\\n\\n" f1 "\\n\\n" f2 "\\n\\n" f3 "\\n\\n[[ ## completed ## ]]"'
    assert 'f0 ::= "[[ ## reasoning ## ]]\\n" reasoning' in grammar
    # short, no code, and opening with something other than blank space (the 0.5B model filled
    # every field with a bare newline when it could)
    lead = '( [^\\[` \\t\\r\\n] | "[" [^\\[` \\t\\r\\n] )'
    assert f'reasoning ::= {lead} ( [^\\[`] | "[" [^\\[`] ){{0,399}}' in grammar
    assert 'f1 ::= "[[ ## answer ## ]]\\n" free' in grammar
    assert 'free ::= ( [^\\[ \\t\\r\\n] | "[" [^\\[ \\t\\r\\n] ) (' in grammar
    assert 'f2 ::= "[[ ## needs_tools ## ]]\\n" ( "True" | "False" )' in grammar
    assert 'f3 ::= "[[ ## count ## ]]\\n" "-"? [0-9]+' in grammar
    plain = Request(model="openai/x", messages=(Message.user("just text"),))
    assert "grammar" not in wire(for_server(plain, LLAMA))


def test_json_schema_becomes_json_object_with_the_schema_on_llama_cpp() -> None:
    schema = {"type": "object", "properties": {"answer": {"type": "string"}}}
    asked = Request(
        model="openai/x",
        messages=(Message.user("hi"),),
        config=Config(response_format={"type": "json_schema", "schema": schema, "name": "out"}),
    )
    shaped = wire(for_server(asked, LLAMA))
    assert shaped["response_format"] == {"type": "json_object", "schema": schema}
    assert "grammar" not in shaped
    generic = wire(for_server(asked, GENERIC))
    assert generic["response_format"] != {"type": "json_object", "schema": schema}


def test_a_generic_profile_without_a_seed_leaves_the_request_as_it_is() -> None:
    request = chat_request(max_tokens=9)
    assert for_server(request, GENERIC) is request


def test_a_bad_seed_or_server_kind_is_refused_naming_the_field() -> None:
    with pytest.raises(InvalidProfile, match="'seed' cannot be -1"):
        check_profile(LlmProfile(name="p", model="openai/x", seed=-1))
    with pytest.raises(InvalidProfile, match="server_kind"):
        decode_profile(b'{"name":"p","model":"openai/x","server_kind":"vllm-ish"}')
    stored = decode_profile(encode_profile(LLAMA))
    assert (stored.server_kind, stored.seed) == ("llama.cpp", 7)
    assert decode_profile(b'{"name":"p","model":"openai/x"}').server_kind == "generic"
