"""Every broker verb of the catalog is served on the subject the catalog names: a malformed
body gets the server's own `bad_request`, never NATS's "no responders"."""

import pytest

from fleet_agent.sandbox_bus import SandboxBus
from fleet_events import bus as verbs
from fleet_mesh.rpc import ERROR_HEADER


async def _answer_to_garbage(sandbox_bus: SandboxBus, subject: str) -> str:
    msg = await sandbox_bus.nc.request(subject, b'{"request_id": 5}', timeout=10)
    return (msg.headers or {}).get(ERROR_HEADER, "no error header")


@pytest.mark.parametrize(
    "verb",
    [v for v in verbs.verbs_of("sandbox-broker") if v.name != "ping"],  # a Ping has no fields
    ids=lambda v: v.name,
)
def test_every_broker_verb_is_served_where_the_catalog_says(
    bus: SandboxBus, verb: verbs.Verb[object, object]
) -> None:
    target = None
    if verb.scope == "sandbox":
        box = bus.create_sandbox(labels={"test": "catalog"})
        target = box.sandbox
    try:
        code = bus.run(_answer_to_garbage(bus, verb.subject(target)), timeout=15)
    finally:
        if target is not None:
            bus.delete_sandbox(target)
    assert code == "bad_request"
