"""The broker's view of the SANDBOXES stream keeps serving past an event it cannot read."""

from fleet_agent.sandbox_bus import SandboxBus
from fleet_events import bus as verbs
from fleet_events import sandbox as sb
from fleet_events import streams
from fleet_events.envelope import new_id


def test_an_unreadable_event_in_the_log_does_not_stop_list_or_create(bus: SandboxBus) -> None:
    async def plant() -> None:
        js = bus.nc.jetstream()
        subject = sb.sandbox_subject(bus.tenant, new_id())
        await js.publish(subject, b"\x00 not an envelope", stream=streams.SANDBOXES.name)

    bus.run(plant(), timeout=10)
    info = bus.create_sandbox()
    listed = bus.call(
        verbs.LIST_SANDBOXES, sb.ListSandboxes(request_id=new_id(), tenant=bus.tenant), timeout=10
    )
    assert info.sandbox in [item.sandbox for item in listed.items]
    bus.delete_sandbox(info.sandbox)
