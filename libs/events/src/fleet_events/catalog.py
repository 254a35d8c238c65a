"""Every event type, gathered once, and the union the codec decodes into."""

from typing import Any, Union

from fleet_events import budget, quality, run, sandbox, session
from fleet_events.envelope import Envelope, Event, Offloaded

ALL_EVENTS: tuple[type[Event], ...] = (
    Offloaded,
    *session.EVENTS,
    *run.EVENTS,
    *sandbox.EVENTS,
    *budget.EVENTS,
    *quality.EVENTS,
)


def _tags() -> dict[str, type[Event]]:
    seen: dict[str, type[Event]] = {}
    for cls in ALL_EVENTS:
        tag = cls.__struct_config__.tag
        if not isinstance(tag, str):
            raise TypeError(f"{cls.__name__} needs an explicit string tag")
        if tag in seen:
            raise TypeError(f"tag {tag!r} used by {seen[tag].__name__} and {cls.__name__}")
        seen[tag] = cls
    return seen


BY_TAG: dict[str, type[Event]] = _tags()

# The runtime union msgspec decodes `data` into; statically it is just "some Event".
AnyEvent: Any = Union[ALL_EVENTS]  # noqa: UP007 - a runtime-built union needs the subscript form
AnyEnvelope: Any = Envelope[AnyEvent]


def type_of(event: Event) -> str:
    tag = type(event).__struct_config__.tag
    assert isinstance(tag, str)
    return tag
