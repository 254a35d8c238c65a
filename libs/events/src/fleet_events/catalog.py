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
    return type_of_class(type(event))


def _context(cls: type[Event]) -> str:
    return cls.__module__.rsplit(".", 1)[-1]


def _summary(cls: type[Event]) -> str:
    doc = (cls.__doc__ or "").strip().split("\n\n")[0]
    return " ".join(doc.split()).replace("|", "\\|")


def _fields(cls: type[Event]) -> str:
    names = cls.__struct_fields__
    defaults = dict(
        zip(
            names[len(names) - len(cls.__struct_defaults__) :], cls.__struct_defaults__, strict=True
        )
    )
    shown = [f"{name}?" if name in defaults else name for name in names]
    return ", ".join(shown) or "—"


def catalog_markdown() -> str:
    """The event catalog table of docs/architecture.md (a test keeps the doc in step)."""
    rows = [
        "| context | type (wire tag) | class | fields (? = defaulted) | meaning |",
        "|---|---|---|---|---|",
    ]
    for cls in ALL_EVENTS:
        cells = [
            _context(cls),
            f"`{type_of_class(cls)}`",
            f"`{cls.__name__}`",
            _fields(cls),
            _summary(cls),
        ]
        rows.append("| " + " | ".join(cells) + " |")
    return "\n".join(rows)


def type_of_class(cls: type[Event]) -> str:
    tag = cls.__struct_config__.tag
    assert isinstance(tag, str)
    return tag


if __name__ == "__main__":
    print(catalog_markdown())
