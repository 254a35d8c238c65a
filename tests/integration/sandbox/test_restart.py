"""A broker SIGKILLed with live sandboxes: children reaped, the session's sandbox usable again;
a session whose sandbox is held by no broker gets a replacement (`sandbox.replaced`)."""

import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from dspy.primitives.code_interpreter import CodeInterpreterError

from fleet_agent.interpreter import RemoteInterpreter
from fleet_agent.sandbox_bus import SandboxBus
from fleet_cli.children import Child
from fleet_cli.mesh import UpOptions, service_specs
from fleet_events import bus as verbs
from fleet_events import sandbox as sb
from fleet_events import streams
from fleet_events.bus import Ping
from fleet_events.codec import Codec
from fleet_events.envelope import Actor, Envelope, Event, new_id, utc_now
from fleet_events.run import RunCancelled, RunCompleted, RunFailed
from fleet_events.session import run_subject
from fleet_harness.daytona_fake import DaytonaFake
from fleet_harness.procs import Replica
from fleet_harness.waits import eventually_sync
from fleet_mesh.blobs import JetStreamBlobs
from fleet_mesh.credentials import env_for
from fleet_mesh.natsserver import NatsServer
from fleet_mesh.store import EventStore

from .provider_kit import PROVIDERS, set_provider


class Brokers:
    def __init__(self, url: str, root: Path, volumes: str) -> None:
        self.url, self.root, self.volumes = url, root, volumes
        self.started: list[Replica] = []

    def start(
        self, replica: str, root: str = "root", daytona: DaytonaFake | None = None
    ) -> Replica:
        """`root`: another root stands for another host (it cannot see this one's files).
        `daytona`: the broker has the daytona provider too, on that fake."""
        extra = {} if daytona is None else {
            "DAYTONA_API_KEY": "fake-key", "DAYTONA_API_URL": daytona.url,
            "DAYTONA_TARGET": "fake", "FLEET_SANDBOX_DAYTONA_SNAPSHOT": "fleet-vm",
        }  # fmt: skip
        process = Replica(
            service="sandbox-broker", index=len(self.started),
            argv=[sys.executable, "-m", "fleet_sandbox_broker"],
            env={
                "PATH": "/usr/local/bin:/usr/bin:/bin", "NATS_URL": self.url,
                **env_for("sandbox-broker"),
                "FLEET_REPLICA": replica, "FLEET_SANDBOX_ROOT": str(self.root / root),
                "FLEET_SANDBOX_VOLUMES": self.volumes,
                "FLEET_SANDBOX_UID_BASE": "340000", "FLEET_SANDBOX_POOL_SIZE": "0",
                "PYTHONUNBUFFERED": "1", **extra,
            },
            log_path=self.root / f"{replica}-{len(self.started)}.log",
        ).start()  # fmt: skip
        self.started.append(process)
        return process


@pytest.fixture
def brokers(nats_server: NatsServer, tmp_path: Path, broker: Replica) -> Iterator[Brokers]:
    # `broker` (the module's) has bootstrapped the streams; these brokers get their own
    # replica names and roots, and share its volumes root as replicas share durable storage
    # (any replica may answer `resume` and build the replacement)
    made = Brokers(nats_server.url, tmp_path, broker.env["FLEET_SANDBOX_VOLUMES"])
    yield made
    for process in made.started:
        process.kill()


@pytest.fixture
def bus(nats_server: NatsServer) -> Iterator[SandboxBus]:
    with SandboxBus(nats_server.url, tenant=f"t-{new_id()[:10]}") as connected:
        yield connected


def wait_replica(bus: SandboxBus, replica: str, count: int | None = None) -> None:
    def answered() -> bool:
        try:
            pong = bus.call(verbs.ping("sandbox-broker"), Ping(), timeout=0.3)
        except Exception:
            return False
        return pong.replica == replica

    eventually_sync(answered, timeout=30, what=f"{replica} to answer ping")


def stream(bus: SandboxBus, sandbox: str) -> list[Any]:
    async def read() -> list[Any]:
        js = bus.nc.jetstream()
        store = EventStore(js, streams.SANDBOXES, Codec(await JetStreamBlobs.open(js)))
        subject = sb.sandbox_subject(bus.tenant, sandbox)
        return [s.envelope.data async for s in store.replay(subject)]

    return bus.run(read(), timeout=20)


def answering(bus: SandboxBus, sandbox: str) -> sb.SandboxInfo:
    """`sandbox.replaced` is the claim, recorded before the revived sandbox starts: wait for
    the sandbox itself to answer."""

    def running() -> sb.SandboxInfo | None:
        info = bus.sandbox_info(sandbox)
        return info if info.status == "running" else None

    return eventually_sync(running, timeout=30, what=f"{sandbox} to answer")


def create_on(bus: SandboxBus, replica: str, **fields: Any) -> sb.SandboxInfo:
    """Create until the named replica answers (create is served by the whole queue group)."""
    for _ in range(40):
        request = sb.CreateSandbox(request_id=new_id(), tenant=bus.tenant, **fields)
        info = bus.call(verbs.CREATE_SANDBOX, request, timeout=60)
        if info.replica == replica:
            return info
        bus.delete_sandbox(info.sandbox)
    raise AssertionError(f"{replica} never answered create")


@pytest.mark.slow
@pytest.mark.parametrize("provider", PROVIDERS)
def test_after_a_sigkill_children_are_reaped_and_the_session_sandbox_is_usable(
    brokers: Brokers, bus: SandboxBus, provider: str, daytona_fake: DaytonaFake
) -> None:
    """On each provider: a local sandbox's processes die with the broker, a Daytona one
    outlives it (labelled); either way the child is reaped and the session taken back."""
    set_provider(bus, provider)
    fake = daytona_fake if provider == "daytona" else None
    name = f"sbx-restart-{provider}"
    first = brokers.start(name, daytona=fake)
    wait_replica(bus, name)
    session = create_on(bus, name, labels={"session": "s1", "role": "session"})
    assert session.provider == provider
    repl = RemoteInterpreter(bus, session.sandbox)
    repl.execute("open('notes.txt', 'w').write('kept')\nmemory = 1")
    request = sb.BuildChild(request_id=new_id(), tenant=bus.tenant, sandbox=session.sandbox,
                            context=repl.context)  # fmt: skip
    child = bus.call(verbs.BUILD_CHILD, request, target=session.sandbox, timeout=60)  # fmt: skip
    assert child.branch == "fork"
    first.kill()
    brokers.start(name, daytona=fake)
    eventually_sync(lambda: isinstance(stream(bus, child.sandbox)[-1], sb.SandboxDeleted),
                    timeout=30, what="the child reaped")  # fmt: skip
    assert "reaped" in stream(bus, child.sandbox)[-1].reason
    # the reap is recorded first, then the sandbox's files (or its Daytona sandbox) go
    if fake is None:
        eventually_sync(lambda: not Path(child.workspace).exists(), timeout=30,
                        what="the child's workspace removed")  # fmt: skip
    else:
        eventually_sync(lambda: child.sandbox not in live_on(fake), timeout=30,
                        what="the child gone on Daytona")  # fmt: skip
    eventually_sync(lambda: isinstance(stream(bus, session.sandbox)[-1], sb.SandboxReplaced),
                    timeout=30, what="the session sandbox revived")  # fmt: skip
    revived = stream(bus, session.sandbox)[-1]
    assert revived.replaced == revived.sandbox == session.sandbox
    answering(bus, session.sandbox)
    again = RemoteInterpreter(bus, session.sandbox)
    assert again.execute("open('notes.txt').read()") == "kept"
    assert again.execute("'memory' in globals()") is False
    again.shutdown()
    bus.delete_sandbox(session.sandbox)
    if fake is not None:
        assert session.sandbox not in live_on(fake)


def live_on(fake: DaytonaFake) -> list[str]:
    """The fleet sandboxes the Daytona fake still holds (not destroyed)."""
    return [
        b.dto["labels"]["fleet-rlm/sandbox"] for b in fake.sandboxes.values()
        if b.dto["state"] != "destroyed" and "fleet-rlm/sandbox" in b.dto["labels"]
    ]  # fmt: skip


@pytest.mark.slow
def test_a_session_whose_sandbox_vanished_gets_a_replacement_on_the_same_volume(
    brokers: Brokers, bus: SandboxBus
) -> None:
    first = brokers.start("sbx-gone")
    wait_replica(bus, "sbx-gone")
    old = create_on(bus, "sbx-gone", labels={"session": "s2"}, volume="v", volume_subpath="s2")
    repl = RemoteInterpreter(bus, old.sandbox)
    repl.execute("open('volume/data.txt', 'w').write('durable')")
    first.kill()
    # a different replica on another host: it cannot revive the old sandbox on its files
    brokers.start("sbx-other", root="elsewhere")
    wait_replica(bus, "sbx-other")
    request = sb.ResumeSandbox(request_id=new_id(), tenant=bus.tenant, sandbox=old.sandbox)
    new = bus.call(verbs.RESUME_SANDBOX, request, timeout=60)
    assert new.sandbox != old.sandbox
    assert (new.volume, new.volume_subpath) == ("v", "s2")
    (replaced,) = [e for e in stream(bus, new.sandbox) if isinstance(e, sb.SandboxReplaced)]
    assert replaced.replaced == old.sandbox
    assert "is gone" in replaced.reason
    fresh = RemoteInterpreter(bus, new.sandbox)
    assert fresh.execute("open('volume/data.txt').read()") == "durable"
    fresh.shutdown()
    again = bus.call(
        verbs.RESUME_SANDBOX,
        sb.ResumeSandbox(request_id=new_id(), tenant=bus.tenant, sandbox=new.sandbox),
        timeout=30,
    )
    assert again.sandbox == new.sandbox  # a live sandbox is simply returned
    bus.delete_sandbox(new.sandbox)


@pytest.mark.slow
def test_an_interpreter_notices_its_broker_dying_mid_cell(
    brokers: Brokers, bus: SandboxBus
) -> None:
    first = brokers.start("sbx-dies")
    wait_replica(bus, "sbx-dies")
    info = create_on(bus, "sbx-dies")
    repl = RemoteInterpreter(bus, info.sandbox, liveness_s=0.5)
    released = threading.Event()

    def kill_the_broker() -> int:
        first.kill()  # the cell is now waiting on this tool: its wall clock is paused
        released.wait(10)
        return 1

    repl.tools["kill_the_broker"] = kill_the_broker
    # Without the liveness check this would wait for the cell's wall-time limit and the test's
    # own timeout would fail it; with it, the interpreter learns within `liveness_s`.
    with pytest.raises(CodeInterpreterError, match="went away during the cell"):
        repl.execute("kill_the_broker()")
    released.set()
    with pytest.raises(CodeInterpreterError):
        repl.execute("1")


@pytest.mark.slow
def test_an_interpreter_notices_its_sandbox_restarted_under_a_cell(
    brokers: Brokers, bus: SandboxBus
) -> None:
    """A broker SIGKILLed and started again under a running cell revives the session's
    sandbox in place (REPL memory gone): the probe answers "running" again, and before the
    fix the cell waited for its reply until `request_timeout_s` (an hour by default). The
    interpreter now sees its context gone and says the sandbox was restarted; a probe that
    finds no broker while one restarts is asked again, not taken for a loss at once."""
    first = brokers.start("sbx-back")
    wait_replica(bus, "sbx-back")
    info = create_on(bus, "sbx-back", labels={"session": "s9", "role": "session"})
    repl = RemoteInterpreter(bus, info.sandbox, liveness_s=0.5, request_timeout_s=90)
    restarted = threading.Event()

    def restart_the_broker() -> int:
        first.kill()  # the cell waits on this tool: the reply goes to a broker now gone
        brokers.start("sbx-back")
        answering(bus, info.sandbox)
        restarted.set()
        return 1

    repl.tools["restart_the_broker"] = restart_the_broker
    with pytest.raises(CodeInterpreterError, match="was restarted during the cell"):
        repl.execute("restart_the_broker()")
    assert restarted.is_set()
    again = RemoteInterpreter(bus, info.sandbox)
    assert again.execute("1 + 1") == 2
    again.shutdown()
    bus.delete_sandbox(info.sandbox)


@pytest.mark.slow
def test_requests_reach_the_replica_holding_the_sandbox(brokers: Brokers, bus: SandboxBus) -> None:
    brokers.start("rep-a")
    brokers.start("rep-b")
    wait_replica(bus, "rep-a")
    wait_replica(bus, "rep-b")
    on_a, on_b = create_on(bus, "rep-a"), create_on(bus, "rep-b")
    for info, replica in ((on_a, "rep-a"), (on_b, "rep-b")):
        repl = RemoteInterpreter(bus, info.sandbox)
        assert repl.execute("import os\nos.getuid()") == bus.sandbox_info(info.sandbox).uid
        child = bus.fork_sandbox(info.sandbox)
        assert child.replica == replica  # a fork lives with its parent's processes
        assert bus.sandbox_info(child.sandbox).replica == replica
        repl.shutdown()
        bus.delete_sandbox(info.sandbox)  # takes the child with it
    listed = bus.call(
        verbs.LIST_SANDBOXES, sb.ListSandboxes(request_id=new_id(), tenant=bus.tenant), timeout=10
    )
    assert listed.items == []


@pytest.mark.slow
def test_a_restarted_broker_reaps_sandboxes_of_finished_runs_only(
    brokers: Brokers, bus: SandboxBus
) -> None:
    """Every end of a run counts (`run.TERMINAL`): completed, failed and cancelled. A cancelled
    run's sandbox was kept and revived before (only completed and failed were read)."""
    first = brokers.start("sbx-runs")
    wait_replica(bus, "sbx-runs")
    ends: dict[str, Event] = {
        "r-done": RunCompleted(answer="42"),
        "r-failed": RunFailed(error="boom"),
        "r-cancelled": RunCancelled(reason="the user cancelled", partial_answer="half"),
    }
    ended = {
        run: create_on(bus, "sbx-runs", labels={"session": "s9", "run": run, "role": "task"})
        for run in ends
    }
    live = create_on(bus, "sbx-runs", labels={"session": "s9", "run": "r-live", "role": "task"})

    async def finish_runs() -> None:
        js = bus.nc.jetstream()
        store = EventStore(js, streams.SESSIONS, Codec(await JetStreamBlobs.open(js)))
        for run, end in ends.items():
            envelope: Envelope[Any] = Envelope(
                id=new_id(), tenant=bus.tenant, actor=Actor(service="agent", replica="test"),
                ts=utc_now(), data=end, session="s9", run=run,
            )  # fmt: skip
            await store.append(run_subject(bus.tenant, "s9", run), envelope)

    bus.run(finish_runs(), timeout=20)
    first.kill()
    brokers.start("sbx-runs")

    def reaped(box: str) -> Callable[[], bool]:
        return lambda: isinstance(stream(bus, box)[-1], sb.SandboxDeleted)

    for run, info in ended.items():
        eventually_sync(reaped(info.sandbox), timeout=30, what=f"the sandbox of {run} reaped")
    eventually_sync(lambda: isinstance(stream(bus, live.sandbox)[-1], sb.SandboxReplaced),
                    timeout=30, what="the live run's sandbox revived")  # fmt: skip
    answering(bus, live.sandbox)
    repl = RemoteInterpreter(bus, live.sandbox)
    assert repl.execute("6 * 7") == 42
    repl.shutdown()
    bus.delete_sandbox(live.sandbox)


@pytest.mark.slow
def test_a_starting_broker_kills_what_a_dead_broker_left_running(
    brokers: Brokers, bus: SandboxBus
) -> None:
    first = brokers.start("sbx-orphans")
    wait_replica(bus, "sbx-orphans")
    box = create_on(bus, "sbx-orphans")
    repl = RemoteInterpreter(bus, box.sandbox)
    stray = repl.execute(
        "import os, signal\n"
        "read, write = os.pipe()\n"
        "if os.fork() == 0:\n"
        "    os.setsid()\n"  # leaves the sandbox's process group: a daemonised stray
        "    if os.fork() == 0:\n"
        "        os.write(write, str(os.getpid()).encode()); signal.pause()\n"
        "    os._exit(0)\n"
        "int(os.read(read, 32))"
    )
    assert isinstance(stray, int)
    # the sandbox runs in a pid namespace of its own (issue 28): the pid it printed is the
    # namespace's; the host's is the one whose NSpid ends with it, working in this sandbox
    host = host_pid(stray, box.sandbox)
    first.kill()
    assert Path(f"/proc/{host}").exists()  # the broker's death alone does not stop it
    # Another replica starting on this host (not the dead one's successor, which would also
    # reap its sandboxes from the log) still kills what the dead broker left running.
    brokers.start("sbx-orphans-neighbour")
    wait_replica(bus, "sbx-orphans-neighbour")
    eventually_sync(lambda: not _alive(host), timeout=30,
                    what="the stray killed by the starting broker")  # fmt: skip


def _alive(pid: int) -> bool:
    """Running (a zombie waiting for its reaper has stopped running)."""
    try:
        return " (Z)" not in Path(f"/proc/{pid}/stat").read_text().split(")", 1)[1][:4]
    except OSError:
        return False


def host_pid(ns_pid: int, sandbox: str) -> int:
    """The host pid of the process that is `ns_pid` in its namespace and works in `sandbox`'s
    directory tree (its cwd names the sandbox)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            status = (entry / "status").read_text()
            cwd = os.readlink(entry / "cwd")
        except OSError:
            continue
        nspid = next((line.split()[1:] for line in status.splitlines()
                      if line.startswith("NSpid:")), [])  # fmt: skip
        if nspid and nspid[-1] == str(ns_pid) and sandbox in cwd:
            found.append(int(entry.name))
    assert len(found) == 1, f"host pids of {ns_pid} in sandbox {sandbox}: {found}"
    return found[0]


@pytest.mark.slow
def test_a_dead_replicas_sandboxes_are_taken_over_by_the_next_broker_on_its_disk(
    brokers: Brokers, bus: SandboxBus
) -> None:
    """A replica that never comes back under its name (renamed, scaled away): the next broker
    starting on the same disk reaps its children and revives its session sandbox in place, so
    no workspace is left on disk under a uid the pool could hand to another tenant."""
    first = brokers.start("sbx-vanished")
    wait_replica(bus, "sbx-vanished")
    session = create_on(bus, "sbx-vanished", labels={"session": "s3", "role": "session"})
    bus.put_file(session.sandbox, "notes.txt", b"kept in place")
    child = bus.fork_sandbox(session.sandbox)
    first.kill()
    brokers.start("sbx-successor")
    eventually_sync(lambda: isinstance(stream(bus, child.sandbox)[-1], sb.SandboxDeleted),
                    timeout=30, what="the child reaped")  # fmt: skip
    assert "sbx-vanished is gone" in stream(bus, child.sandbox)[-1].reason
    assert not Path(child.workspace).exists()
    eventually_sync(lambda: isinstance(stream(bus, session.sandbox)[-1], sb.SandboxReplaced),
                    timeout=30, what="the session sandbox taken over")  # fmt: skip
    revived = stream(bus, session.sandbox)[-1]
    assert (revived.replaced, revived.replica) == (session.sandbox, "sbx-successor")
    info = answering(bus, session.sandbox)
    assert (info.replica, info.workspace) == ("sbx-successor", session.workspace)
    assert bus.read_file(session.sandbox, "notes.txt") == b"kept in place"
    listed = bus.call(
        verbs.LIST_SANDBOXES, sb.ListSandboxes(request_id=new_id(), tenant=bus.tenant), timeout=10
    )
    assert [(i.sandbox, i.replica) for i in listed.items] == [(session.sandbox, "sbx-successor")]
    bus.delete_sandbox(session.sandbox)


@pytest.mark.slow
def test_a_broker_started_as_fleet_up_starts_it_revives_its_sandboxes_after_a_sigkill(
    nats_server: NatsServer, tmp_path: Path, broker: Replica, bus: SandboxBus
) -> None:
    """The launcher's own path (`service_specs`, `Child`): the name comes from the data dir."""
    options = UpOptions(tmp_path / "data")

    def launch() -> Child:
        (spec,) = [s for s in service_specs(options, nats_server.url) if s.name == "sandbox-broker"]
        env = {**spec.env, "FLEET_SANDBOX_UID_BASE": "341000", "FLEET_SANDBOX_POOL_SIZE": "0"}
        child = Child(replace(spec, env=env))
        child.start()
        return child

    first = launch()
    try:
        replica = first.spec.env["FLEET_REPLICA"]
        wait_replica(bus, replica)
        session = create_on(bus, replica, labels={"session": "s4", "role": "session"})
        bus.put_file(session.sandbox, "notes.txt", b"survives")
        assert first.process is not None
        os.killpg(first.process.pid, signal.SIGKILL)
        first.process.wait(10)
    finally:
        first.finish(0)
    second = launch()
    try:
        assert second.spec.env["FLEET_REPLICA"] == replica
        eventually_sync(lambda: isinstance(stream(bus, session.sandbox)[-1], sb.SandboxReplaced),
                        timeout=30, what="the session sandbox revived")  # fmt: skip
        answering(bus, session.sandbox)
        assert bus.read_file(session.sandbox, "notes.txt") == b"survives"
        bus.delete_sandbox(session.sandbox)
    finally:
        second.terminate()
        second.finish(10)
