"""Budget context: the LLM-call ledger of each recursive tree (`fleet.budget.<tree>`)."""

from fleet_events.envelope import Event
from fleet_events.ids import check_id


def tree_subject(tree: str) -> str:
    return f"fleet.budget.{check_id('tree', tree)}"


EVENTS: tuple[type[Event], ...] = ()
