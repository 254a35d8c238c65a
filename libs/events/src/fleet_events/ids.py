"""Ids that become NATS subject tokens are validated where they enter, once."""

import re

ID_PATTERN = re.compile(r"[A-Za-z0-9_-]{1,64}")


class InvalidId(ValueError):
    """An id that cannot be a subject token (it would split, wildcard or overflow a subject)."""

    def __init__(self, kind: str, value: object) -> None:
        shown = repr(value) if len(repr(value)) <= 80 else repr(value)[:77] + "..."
        super().__init__(
            f"invalid {kind} id {shown}: use 1-64 characters from A-Z, a-z, 0-9, '_' and '-' "
            "(no '.', '*', '>', spaces or other characters)"
        )
        self.kind = kind
        self.value = value


def check_id(kind: str, value: object) -> str:
    """Return `value` if it is a valid `kind` id; raise `InvalidId` naming it otherwise."""
    if not isinstance(value, str) or ID_PATTERN.fullmatch(value) is None:
        raise InvalidId(kind, value)
    return value
