"""Quality context (`fleet.quality.<kind>.<id>`): datasets, evaluation runs, promotions.

The quality service is a ping-only stub until its own issue; its events arrive with it.
"""

from fleet_events.envelope import Event
from fleet_events.ids import check_id


def quality_subject(kind: str, ident: str) -> str:
    return f"fleet.quality.{check_id('kind', kind)}.{check_id('id', ident)}"


EVENTS: tuple[type[Event], ...] = ()
