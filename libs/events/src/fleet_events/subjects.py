"""Subject spaces. Events, work items, RPC and live deltas never overlap.

- `fleet.session.…`, `fleet.sandbox.…`, `fleet.budget.…`, `fleet.quality.…`: persisted events
- `fleet.work.<service>.<kind>`: the work queue
- `fleet.rpc.<service>.<verb>`: request/reply (core NATS; `fleet_events.bus` names every verb)
- `fleet.callback.<interpreter>`: tool callbacks relayed to one interpreter (core NATS)
- `fleet.live.<tenant>.<session>`: unpersisted deltas
"""

from fleet_events.ids import check_id

SERVICES = ("gateway", "agent", "sandbox-broker", "budget", "quality")
ROLES = ("checkpointer",)
"""Processes that serve verbs but are no service (no ping, no readiness probe): the
checkpointer holds the checkpoint key no service holds (docs/audit.md)."""


def _service(service: str) -> str:
    if service not in SERVICES and service not in ROLES:
        raise ValueError(
            f"unknown service {service!r}: expected one of {', '.join(SERVICES + ROLES)}"
        )
    return service


def rpc(service: str, verb: str) -> str:
    return f"fleet.rpc.{_service(service)}.{check_id('verb', verb)}"


def work(service: str, kind: str) -> str:
    return f"fleet.work.{_service(service)}.{check_id('work kind', kind)}"


def callback(interpreter: str) -> str:
    return f"fleet.callback.{check_id('interpreter', interpreter)}"


def live(tenant: str, session: str) -> str:
    return f"fleet.live.{check_id('tenant', tenant)}.{check_id('session', session)}"
