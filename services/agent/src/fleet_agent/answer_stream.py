"""The answer field's text out of a streamed chat-adapter reply, as the tokens arrive.

The reply is `[[ ## reasoning ## ]]\\n...\\n\\n[[ ## answer ## ]]\\n...\\n\\n[[ ## completed ## ]]`;
watchers want the answer while it is written, not the headers or the reasoning. A header can
arrive split over several tokens, so text that might still become one is held back until it
cannot; whitespace at the field's end is held too, so the deltas joined equal the field the
adapter parses (it strips the value), and a preview never shows what the answer will not.
"""

import re

_HEADER = re.compile(r"\[\[ ## (\w+) ## \]\]")
_OPENING = "[[ ## "
_LONGEST_HEADER = 128  # "[[ ## <field name> ## ]]": dspy field names are Python identifiers


def _could_open_header(tail: str) -> bool:
    """Whether `tail` (which starts with "[") may still grow into a header."""
    if len(tail) <= len(_OPENING):
        return _OPENING.startswith(tail)
    if not tail.startswith(_OPENING):
        return False
    rest = tail[len(_OPENING) :]
    return re.fullmatch(r"\w*( (#(#( (\](\])?)?)?)?)?)?", rest) is not None


def _held_from(value: str) -> int:
    """Where the part of `value` that may still become a header starts (its length if none)."""
    start = max(0, len(value) - _LONGEST_HEADER)
    while (cut := value.find("[", start)) >= 0:
        if _could_open_header(value[cut:]):
            return cut
        start = cut + 1
    return len(value)


class FieldStream:
    """Feed it the reply's pieces; each `feed` returns the new text of the watched field."""

    def __init__(self, field: str = "answer") -> None:
        self.field = field
        self.text = ""
        self.sent = 0  # characters of the field's value already handed out
        self.done = False

    def _value(self, final: bool) -> str:
        """The field's value as far as it can be shown now."""
        start = None
        for match in _HEADER.finditer(self.text):
            if start is not None:
                self.done = True
                return self.text[start : match.start()].strip()
            if match.group(1) == self.field:
                start = match.end()
        if start is None:
            return ""
        value = self.text[start:].lstrip()
        if not final:
            value = value[: _held_from(value)]
        return value.rstrip()

    def feed(self, piece: str) -> str:
        if self.done:
            return ""
        self.text += piece
        return self._take(self._value(final=False))

    def finish(self) -> str:
        """What is left once the reply ended (a value with no header after it)."""
        if self.done:
            return ""
        return self._take(self._value(final=True))

    def _take(self, value: str) -> str:
        if len(value) <= self.sent:
            return ""
        fresh, self.sent = value[self.sent :], len(value)
        return fresh


__all__ = ["FieldStream"]
