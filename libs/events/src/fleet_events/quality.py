"""Quality context (`fleet.quality.<kind>.<id>`): datasets, evaluation runs, promotions.

The quality service is a ping-only stub until its own issue; its events arrive with it.
"""

from fleet_events import subjects
from fleet_events.envelope import Event


def quality_subject(kind: str, ident: str) -> str:
    return subjects.QUALITY.build(kind=kind, id=ident)


EVENTS: tuple[type[Event], ...] = ()
