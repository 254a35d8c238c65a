"""One error root for the budget service; each family maps to one RPC error code."""

from fleet_events import bus


class BudgetError(Exception):
    code = "budget_error"


class Malformed(BudgetError):
    """The request can never be valid as sent: nothing is stored, a retry gets the same."""

    code = "bad_request"


class UnknownTree(BudgetError):
    code = "unknown_tree"

    def __init__(self, tree: str) -> None:
        super().__init__(
            f"unknown tree {tree!r}: no tree with this id was opened; open it first with "
            f"{bus.OPEN_TREE.subject()} (the agent opens one tree per turn)"
        )


class Contended(BudgetError):
    """Optimistic appends kept losing races; the caller retries with the same request id."""

    code = "unavailable"
