"""Sandbox context: lifecycle of every sandbox (`fleet.sandbox.<tenant>.<sandbox>`)."""

from fleet_events.envelope import Event
from fleet_events.ids import check_id


def sandbox_subject(tenant: str, sandbox: str) -> str:
    return f"fleet.sandbox.{check_id('tenant', tenant)}.{check_id('sandbox', sandbox)}"


EVENTS: tuple[type[Event], ...] = ()
