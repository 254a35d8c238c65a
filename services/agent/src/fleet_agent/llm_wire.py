"""A request as the profile's server should get it: the seed, and for llama-cpp-python's
server (`server_kind: llama.cpp`) the fields it honours.

A 0.5B model on that server is only usable with help the server offers and dspy does not ask
for: it ignores `max_completion_tokens` (dspy's spelling; a 5-token limit produced 8,155
tokens), so the limit goes in `max_tokens`; it refuses `json_schema`, but takes `json_object`
with a `schema`; and it takes a GBNF `grammar`, which here forces the chat adapter's own
output structure (`[[ ## field ## ]]` headers in the signature's order, typed values where the
type is simple, then `[[ ## completed ## ]]`). Unconstrained, an RLM step parsed 8/15 first
try; constrained 21/21. A `generic` server gets the request untouched apart from the seed.

The adapter's output fields are read from the format reminder dspy 3.4.1's `ChatAdapter` ends
its last user message with ("Respond with the corresponding output fields, starting with the
field `[[ ## reasoning ## ]]`, then ..."); a request without it gets no grammar.
"""

import dataclasses
import re
from typing import Any

from dspy.lm15 import Request

from fleet_events.llm import LlmProfile

REMINDER = "Respond with the corresponding output fields, starting with the field "
_FIELD = re.compile(r"`\[\[ ## (\w+) ## \]\]`(?: \(must be formatted as a valid Python (\w+)\))?")

# A field's free text may hold anything but the start of a header ("[[ ##"), so the model can
# only end a field by opening the next one the grammar names.
_FREE = r'( [^\[] | "[" [^\[] | "[[" [^ ] | "[[ " [^#] | "[[ #" [^#] )*'
# ...and opens with something to say: left free, the 0.5B model answered "What is 2+2?" with
# empty fields (a newline each), which parse as an empty answer.
_LEAD = r'( [^\[ \t\r\n] | "[" [^\[ \t\r\n] )'
REASONING_CHARS = 400
"""dspy's `reasoning` field, capped (characters) and without backticks: the 0.5B model, left
free, wrote its code inside the reasoning until the token limit and never reached the `code`
field (seen in the RLM test); kept short, it gets to the fields that carry the work."""
_REASONING = (
    r'( [^\[` \t\r\n] | "[" [^\[` \t\r\n] ) '
    f'( [^\\[`] | "[" [^\\[`] ){{0,{REASONING_CHARS - 1}}}'
)
_TYPED = {
    "bool": '( "True" | "False" )',
    "int": '"-"? [0-9]+',
    "float": '"-"? [0-9]+ ( "." [0-9]+ )?',
}


def output_fields(request: Request) -> list[tuple[str, str | None]]:
    """(name, simple type or None) of each output field the chat adapter asks for, in order."""
    return fields_in(last_user_text(request))


def fields_in(text: str) -> list[tuple[str, str | None]]:
    """The output fields the chat adapter's reminder in `text` names (none without one)."""
    start = text.rfind(REMINDER)
    if start < 0:
        return []
    found = _FIELD.findall(text[start + len(REMINDER) :])
    return [(name, kind or None) for name, kind in found if name != "completed"]


def last_user_text(request: Request) -> str:
    for message in reversed(request.messages):
        if message.role == "user":
            return "".join(getattr(part, "text", "") or "" for part in message.parts)
    return ""


def chat_grammar(fields: list[tuple[str, str | None]]) -> str:
    """The GBNF grammar of the chat adapter's answer with these output fields."""
    rules = ["root ::= " + ' "\\n\\n" '.join(f"f{i}" for i in range(len(fields)))]
    rules[0] += ' "\\n\\n[[ ## completed ## ]]"'
    for index, (name, kind) in enumerate(fields):
        value = "reasoning" if name == "reasoning" else _TYPED.get(kind or "", "free")
        rules.append(f'f{index} ::= "[[ ## {name} ## ]]\\n" {value}')
    rules.append(f"free ::= {_LEAD} {_FREE}")
    if any(name == "reasoning" for name, _ in fields):
        rules.append(f"reasoning ::= {_REASONING}")
    return "\n".join(rules) + "\n"


def for_server(request: Request, profile: LlmProfile) -> Request:
    """`request` with the profile's seed (unless the caller set one) and, for llama.cpp, the
    token limit, output format and grammar in the fields that server reads."""
    config = request.config
    changes: dict[str, Any] = {}
    if profile.seed is not None and config.seed is None:
        changes["seed"] = profile.seed
    if profile.server_kind == "llama.cpp":
        extensions = dict(config.extensions or {})
        if config.max_tokens is not None:
            extensions["max_tokens"] = config.max_tokens
            changes["max_tokens"] = None
        response_format = config.response_format
        if response_format is not None and response_format.get("type") == "json_schema":
            extensions["response_format"] = {
                "type": "json_object",
                "schema": response_format["schema"],
            }
            changes["response_format"] = None
        elif response_format is None and "grammar" not in extensions:
            fields = output_fields(request)
            if fields:
                extensions["grammar"] = chat_grammar(fields)
        if extensions != (config.extensions or {}):
            changes["extensions"] = extensions
    if not changes:
        return request
    return dataclasses.replace(request, config=dataclasses.replace(config, **changes))


__all__ = [
    "REMINDER",
    "chat_grammar",
    "fields_in",
    "for_server",
    "last_user_text",
    "output_fields",
]
