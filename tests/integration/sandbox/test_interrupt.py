"""`sb.InterruptCell`: a running cell stops at once; the sandbox and its REPL state survive
(issue 8: a cancelled turn waited out the cell's whole wall-time limit)."""

import pytest

from fleet_agent.interpreter import RemoteInterpreter
from fleet_agent.sandbox_bus import SandboxBus
from fleet_events import bus as verbs
from fleet_events import sandbox as sb
from fleet_events.envelope import new_id
from fleet_harness.waits import eventually_sync
from fleet_mesh import rpc


def _interrupt(bus: SandboxBus, sandbox: str, context: str) -> bool:
    ask = sb.InterruptCell(request_id=new_id(), tenant=bus.tenant, sandbox=sandbox, context=context)
    return bus.call(verbs.INTERRUPT_CELL, ask, target=sandbox, timeout=10).interrupted


@pytest.mark.parametrize("cell", ["while True:\n    pass", "import time\ntime.sleep(60)"])
def test_a_running_cell_is_interrupted_and_the_sandbox_keeps_its_variables(
    bus: SandboxBus, cell: str
) -> None:
    # the wall limit is far beyond the test's own timeout: only the interrupt can end the cell
    info = bus.create_sandbox(limits=sb.Limits(wall_s=600, cpu_s_per_cell=600))
    repl = RemoteInterpreter(bus, info.sandbox)
    repl.execute("kept = 41")
    run = sb.Execute(
        request_id=new_id(), tenant=bus.tenant, sandbox=info.sandbox, context=repl.context,
        code=f"started = True\n{cell}",
    )  # fmt: skip
    running = bus.submit(
        rpc.call_verb(bus.nc, verbs.EXECUTE, run, target=info.sandbox, timeout=120)
    )
    # interrupt until the cell is seen running (the first ask may land before it starts)
    eventually_sync(
        lambda: _interrupt(bus, info.sandbox, repl.context), timeout=20, what="an interrupt"
    )
    reply = running.result(30)
    assert reply.kind == "error"
    assert "interrupted" in reply.error.lower()
    assert bus.sandbox_info(info.sandbox).status == "running"
    assert repl.execute("kept + 1") == 42
    assert _interrupt(bus, info.sandbox, repl.context) is False  # nothing running now
    repl.shutdown()
    bus.delete_sandbox(info.sandbox)


def test_interrupting_a_context_that_is_not_open_is_refused(bus: SandboxBus) -> None:
    info = bus.create_sandbox()
    ask = sb.InterruptCell(
        request_id=new_id(), tenant=bus.tenant, sandbox=info.sandbox, context="nope"
    )
    with pytest.raises(Exception, match="no open context 'nope'"):
        bus.call(verbs.INTERRUPT_CELL, ask, target=info.sandbox, timeout=10)
    bus.delete_sandbox(info.sandbox)
