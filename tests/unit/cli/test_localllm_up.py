"""`fleet up`'s LLM hook on a real NATS server: which model wins, what the default profile
becomes, and that the key stays out of every log.

The install and the model server are replaced here, and only here, by stand-ins: a FAKE
server (a few lines of http.server that answer `/v1/models` to the right bearer key, like
llama-cpp-python does) and an install that returns a file. The real install and the real server
are tested in tests/integration/llm (slow tier).
"""

import asyncio
import logging
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from nats.aio.client import Client
from nats.js.errors import KeyNotFoundError

from fleet_cli.localllm import server, up
from fleet_cli.localllm.build import BuildFailed, Cancelled
from fleet_cli.localllm.install import Installed, ended_step
from fleet_cli.localllm.paths import Cache
from fleet_cli.localllm.profile import LOCAL_KEY_REF, LOCAL_MODEL
from fleet_cli.localllm.state import read_file
from fleet_cli.supervisor import Supervisor
from fleet_events import streams
from fleet_events.llm import (
    DEFAULT_PROFILE,
    LOCAL_MODEL_KEY,
    ROLES,
    LlmProfile,
    LocalModelState,
    decode_local_state,
    local_state_line,
)
from fleet_harness.waits import eventually
from fleet_mesh.bootstrap import bootstrap
from fleet_mesh.connection import connect
from fleet_mesh.natsserver import NatsServer, free_port
from fleet_mesh.runtime_config import LlmConfig
from fleet_mesh.secrets import SecretsReader, load_private_key

FAKE_SERVER = """
import http.server, os, sys
KEY = os.environ["API_KEY"]
class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        ok = self.headers.get("Authorization") == "Bearer " + KEY
        self.send_response(200 if ok else 401)
        self.end_headers()
        self.wfile.write(b'{"data": []}' if ok else b"{}")
http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), Handler).serve_forever()
"""


@pytest.fixture
def fake_install(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> list[Cache]:
    """Record installs instead of doing them; the server is the FAKE above."""
    calls: list[Cache] = []
    model = tmp_path / "model.gguf"
    model.write_bytes(b"GGUF")

    def ensure_installed(cache: Cache, progress: object, **_: object) -> Installed:
        calls.append(cache)
        return Installed(model=model, python=sys.executable, seconds=0.0)

    monkeypatch.setattr(up, "ensure_installed", ensure_installed)
    monkeypatch.setattr(up, "steps_to_do", lambda cache: [])  # installed: a warm start
    monkeypatch.setattr(
        server,
        "argv",
        lambda config: (sys.executable, "-c", FAKE_SERVER, str(config.port)),
    )
    monkeypatch.delenv("FLEET_LLM_MODEL", raising=False)
    monkeypatch.delenv("FLEET_SECRETS_KEY", raising=False)
    monkeypatch.delenv("FLEET_SECRETS_PUBLIC_KEY", raising=False)
    return calls


@pytest.fixture
def supervisor() -> Iterator[Supervisor]:
    running = Supervisor(grace_s=5)
    yield running
    running.stop()


async def bootstrapped(nats: NatsServer) -> Client:
    nc = await connect(nats.url, name="test")
    await bootstrap(nc.jetstream(), env={})
    return nc


def options(tmp_path: Path, mode: str, port: int | None = None) -> up.LlmOptions:
    return up.LlmOptions(
        mode=mode, data_dir=tmp_path / "data", port=port or free_port(), cache=Cache(tmp_path)
    )


async def test_none_starts_nothing_and_forgets_an_earlier_starts_local_model(
    tmp_path: Path, supervisor: Supervisor, fake_install: list[Cache], private_nats: NatsServer
) -> None:
    nc = await bootstrapped(private_nats)
    earlier = options(tmp_path, up.LOCAL)  # the same data dir ran the local model before
    await up.hook(earlier, lambda _: None, asyncio.Event())(private_nats.url, supervisor)
    supervisor.stop()
    before = list(supervisor.children)
    kv = await nc.jetstream().key_value(streams.CONFIG.bucket)
    assert (await kv.get(LOCAL_MODEL_KEY)).value
    said: list[str] = []
    hook = up.hook(options(tmp_path, up.NONE), said.append, asyncio.Event())
    env = await hook(private_nats.url, supervisor)
    assert env == {}
    assert supervisor.children == before  # nothing started
    assert len(fake_install) == 1  # the earlier start's only
    assert said == ["LLM: none (--llm none): no model server started"]
    # its state is gone: /ready must not wait for a model this start does not run
    with pytest.raises(KeyNotFoundError):
        await kv.get(LOCAL_MODEL_KEY)
    assert read_file(earlier.data_dir / "llm") is None
    await nc.close()


async def test_fleet_llm_model_in_the_environment_wins_over_the_local_model(
    tmp_path: Path,
    supervisor: Supervisor,
    fake_install: list[Cache],
    private_nats: NatsServer,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    nc = await bootstrapped(private_nats)
    monkeypatch.setenv("FLEET_LLM_MODEL", "openai/big-model")
    said: list[str] = []
    await up.hook(options(tmp_path, up.AUTO), said.append, asyncio.Event())(
        private_nats.url, supervisor
    )
    assert supervisor.children == []
    assert fake_install == []
    assert "FLEET_LLM_MODEL is set; the local model is not started" in said[-1]
    assert await (await LlmConfig.open(nc.jetstream())).get_profile(DEFAULT_PROFILE) is None
    await nc.close()


async def test_a_stored_profile_wins_and_is_never_rewritten(
    tmp_path: Path, supervisor: Supervisor, fake_install: list[Cache], private_nats: NatsServer
) -> None:
    nc = await bootstrapped(private_nats)
    llm = await LlmConfig.open(nc.jetstream())
    theirs = LlmProfile(name=DEFAULT_PROFILE, model="openai/gpt-x", api_base="http://10.0.0.5/v1")
    await llm.put_profile(theirs)
    said: list[str] = []
    await up.hook(options(tmp_path, up.AUTO), said.append, asyncio.Event())(
        private_nats.url, supervisor
    )
    assert supervisor.children == []
    assert fake_install == []
    assert "the stored profile 'default' names openai/gpt-x" in said[-1]
    # forced local: the server runs, but the operator's profile stays theirs
    await up.hook(options(tmp_path, up.LOCAL), said.append, asyncio.Event())(
        private_nats.url, supervisor
    )
    assert [child.spec.name for child in supervisor.children] == ["llm"]
    stored = await llm.get_profile(DEFAULT_PROFILE)
    assert stored is not None
    assert stored.profile == theirs
    await nc.close()


async def test_a_named_profile_that_is_not_stored_is_refused(
    tmp_path: Path, supervisor: Supervisor, fake_install: list[Cache], private_nats: NatsServer
) -> None:
    nc = await bootstrapped(private_nats)
    hook = up.hook(options(tmp_path, "big"), lambda _: None, asyncio.Event())
    with pytest.raises(up.LlmUnavailable, match="no global LLM profile 'big' is stored"):
        await hook(private_nats.url, supervisor)
    assert supervisor.children == []
    await nc.close()


async def test_local_by_default_points_the_default_profile_at_the_server_with_a_sealed_key(
    tmp_path: Path,
    supervisor: Supervisor,
    fake_install: list[Cache],
    private_nats: NatsServer,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    nc = await bootstrapped(private_nats)
    js = nc.jetstream()
    said: list[str] = []
    first = options(tmp_path, up.AUTO)
    env = await up.hook(first, said.append, asyncio.Event())(private_nats.url, supervisor)

    (child,) = supervisor.children
    assert child.spec.name == "llm"
    assert child.alive()
    assert len(fake_install) == 1
    key = (first.data_dir / "llm" / server.KEY_FILE).read_text().strip()
    llm = await LlmConfig.open(js)
    stored = await llm.get_profile(DEFAULT_PROFILE)
    assert stored is not None
    assert stored.profile.model == LOCAL_MODEL
    assert stored.profile.api_base == f"http://127.0.0.1:{first.port}/v1"
    assert stored.profile.secret == LOCAL_KEY_REF
    assert stored.profile.temperature == 0.0
    assert [await llm.role(role, tenant=None) for role in ROLES] == [DEFAULT_PROFILE] * 4
    # the services get the key pair that opens the sealed key; the key itself is in no env
    reader = await SecretsReader.open_reader(js, load_private_key(Path(env["FLEET_SECRETS_KEY"])))
    assert await reader.get(LOCAL_KEY_REF) == key
    assert key not in " ".join(env.values())

    # a later start on another port: the local profile follows its server
    supervisor.stop()
    second = options(tmp_path, up.AUTO)
    await up.hook(second, said.append, asyncio.Event())(private_nats.url, supervisor)
    moved = await llm.get_profile(DEFAULT_PROFILE)
    assert moved is not None
    assert moved.profile.api_base == f"http://127.0.0.1:{second.port}/v1"
    assert (second.data_dir / "llm" / server.KEY_FILE).read_text().strip() == key

    everything = "\n".join(said) + "\n".join(r.getMessage() for r in caplog.records)
    everything += (first.data_dir / "logs" / "llm.log").read_text()
    assert key not in everything
    await nc.close()


async def test_a_port_in_use_is_refused_with_the_flag_to_change(
    tmp_path: Path, supervisor: Supervisor, fake_install: list[Cache], private_nats: NatsServer
) -> None:
    nc = await bootstrapped(private_nats)
    holder = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
    port = holder.sockets[0].getsockname()[1]
    hook = up.hook(options(tmp_path, up.LOCAL, port), lambda _: None, asyncio.Event())
    with pytest.raises(up.LlmUnavailable, match=f"port {port} on 127.0.0.1 is in use.*--llm-port"):
        await hook(private_nats.url, supervisor)
    assert supervisor.children == []
    holder.close()
    await nc.close()


async def test_fleet_llm_model_set_later_replaces_the_local_default_but_never_an_operators(
    tmp_path: Path,
    supervisor: Supervisor,
    fake_install: list[Cache],
    private_nats: NatsServer,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The bootstrap's seed never overwrites a stored profile; without the hand-over, a mesh
    that once ran the local model would ignore FLEET_LLM_* for ever."""
    nc = await bootstrapped(private_nats)
    llm = await LlmConfig.open(nc.jetstream())
    first = options(tmp_path, up.AUTO)
    await up.hook(first, lambda _: None, asyncio.Event())(private_nats.url, supervisor)
    supervisor.stop()
    monkeypatch.setenv("FLEET_LLM_MODEL", "openai/big-model")
    monkeypatch.setenv("FLEET_LLM_API_BASE", "http://10.1.2.3:8000/v1")
    again = options(tmp_path, up.AUTO)
    await up.hook(again, lambda _: None, asyncio.Event())(private_nats.url, supervisor)
    stored = await llm.get_profile(DEFAULT_PROFILE)
    assert stored is not None
    assert (stored.profile.model, stored.profile.api_base) == (
        "openai/big-model",
        "http://10.1.2.3:8000/v1",
    )
    assert [child.spec.name for child in supervisor.children] == ["llm"]  # only the first
    # an operator's profile is not the local one: FLEET_LLM_* does not replace it either
    monkeypatch.setenv("FLEET_LLM_MODEL", "openai/other")
    await up.hook(options(tmp_path, up.AUTO), lambda _: None, asyncio.Event())(
        private_nats.url, supervisor
    )
    kept = await llm.get_profile(DEFAULT_PROFILE)
    assert kept is not None
    assert kept.profile.model == "openai/big-model"
    await nc.close()


async def test_a_stop_during_the_install_cancels_it_and_starts_nothing(
    tmp_path: Path,
    supervisor: Supervisor,
    private_nats: NatsServer,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Ctrl-C during a first install (minutes of compiling) must not wait for it to finish."""
    monkeypatch.delenv("FLEET_LLM_MODEL", raising=False)
    started = threading.Event()

    def slow_install(cache: Cache, progress: object, *, cancel: threading.Event) -> Installed:
        started.set()
        if not cancel.wait(30):
            raise AssertionError("the install was never told to stop")
        raise Cancelled("building the server: cancelled")

    monkeypatch.setattr(up, "ensure_installed", slow_install)
    monkeypatch.setattr(up, "steps_to_do", lambda cache: ["weights", "build", "server"])
    nc = await bootstrapped(private_nats)
    stop = asyncio.Event()
    said: list[str] = []
    hook = up.hook(options(tmp_path, up.AUTO), said.append, stop)
    assert await asyncio.wait_for(hook(private_nats.url, supervisor), 10) == {
        "FLEET_SECRETS_KEY": str(tmp_path / "data" / "secrets" / "services.key"),
        "FLEET_SECRETS_PUBLIC_KEY": str(tmp_path / "data" / "secrets" / "services.pub"),
    }
    await eventually(started.is_set, timeout=10, what="the install to start")
    stop.set()
    assert hook.background is not None
    await asyncio.wait_for(hook.background, 10)
    assert supervisor.children == []
    assert said[-1] == "LLM: stopped before the local model was up"
    await nc.close()


async def test_the_models_state_is_written_for_the_gateway_and_for_fleet_doctor(
    tmp_path: Path, supervisor: Supervisor, fake_install: list[Cache], private_nats: NatsServer
) -> None:
    nc = await bootstrapped(private_nats)
    chosen = options(tmp_path, up.LOCAL)
    await up.hook(chosen, lambda _: None, asyncio.Event())(private_nats.url, supervisor)
    kv = await nc.jetstream().key_value(streams.CONFIG.bucket)
    stored = decode_local_state((await kv.get(LOCAL_MODEL_KEY)).value or b"")
    assert stored is not None
    assert (stored.state, stored.api_base) == ("up", f"http://127.0.0.1:{chosen.port}/v1")
    assert read_file(chosen.data_dir / "llm") == stored  # the same, for fleet doctor
    await nc.close()


async def test_a_failed_install_is_recorded_failed_with_its_error_and_advice(
    tmp_path: Path,
    supervisor: Supervisor,
    private_nats: NatsServer,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("FLEET_LLM_MODEL", raising=False)
    missing = "cmake is not installed: apt-get install cmake (needed once, to build the server)"

    def failing_install(cache: Cache, progress: Callable[[str], None], **_: object) -> Installed:
        progress("building the server: 12s so far")
        raise BuildFailed(missing)

    monkeypatch.setattr(up, "ensure_installed", failing_install)
    monkeypatch.setattr(up, "steps_to_do", lambda cache: ["build", "server"])
    nc = await bootstrapped(private_nats)
    chosen = options(tmp_path, up.AUTO)
    said: list[str] = []
    hook = up.hook(chosen, said.append, asyncio.Event())
    await hook(private_nats.url, supervisor)  # the mesh comes up; the install fails beside it
    assert hook.background is not None
    await asyncio.wait_for(hook.background, 10)  # reported, never raised: the mesh stays up
    assert said[-1].startswith(f"LLM: the local model failed to start: {missing}")
    kv = await nc.jetstream().key_value(streams.CONFIG.bucket)
    stored = decode_local_state((await kv.get(LOCAL_MODEL_KEY)).value or b"")
    assert stored is not None
    assert (stored.state, stored.detail) == ("failed", missing)
    assert "--llm none" in stored.advice
    assert read_file(chosen.data_dir / "llm") == stored
    assert supervisor.children == []
    await nc.close()


async def test_a_first_install_runs_beside_the_services_saying_how_long_it_still_needs(
    tmp_path: Path,
    supervisor: Supervisor,
    private_nats: NatsServer,
    fake_install: list[Cache],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The mesh and the UI do not wait minutes for a build: the hook returns at once with the
    default profile already on the server's address, and the state says what is left."""
    release = threading.Event()
    model = tmp_path / "model.gguf"
    model.write_bytes(b"GGUF")

    def first_install(cache: Cache, progress: Callable[[str], None], **_: object) -> Installed:
        progress("building the server: 30s so far")
        if not release.wait(30):
            raise AssertionError("the test never released the install")
        return Installed(model=model, python=sys.executable, seconds=0.0)

    monkeypatch.setattr(up, "ensure_installed", first_install)
    monkeypatch.setattr(up, "steps_to_do", lambda cache: ["weights", "build", "server"])
    monkeypatch.setattr("os.cpu_count", lambda: 2)
    nc = await bootstrapped(private_nats)
    js = nc.jetstream()
    kv = await js.key_value(streams.CONFIG.bucket)
    chosen = options(tmp_path, up.AUTO)
    said: list[str] = []
    hook = up.hook(chosen, said.append, asyncio.Event())
    await asyncio.wait_for(hook(private_nats.url, supervisor), 10)  # not the install's minutes
    api_base = f"http://127.0.0.1:{chosen.port}/v1"
    stored = await (await LlmConfig.open(js)).get_profile(DEFAULT_PROFILE)
    assert stored is not None
    assert stored.profile.api_base == api_base
    assert supervisor.children == []
    assert "installs in the background (weights, build, server; ~17 min left)" in said[0]

    async def building() -> LocalModelState | None:
        found = decode_local_state((await kv.get(LOCAL_MODEL_KEY)).value or b"")
        return found if found is not None and found.state == "building" else None

    now = await eventually(building, timeout=10, what="the build's state")
    assert now.api_base == api_base
    assert now.eta_s is not None
    assert 900 < now.eta_s <= 990  # 90 + 840 + 40 + 20 s: the first step under way
    assert now.detail == "building the server: 30s so far"
    assert "~17 min left" in local_state_line(now)

    release.set()
    assert hook.background is not None
    await asyncio.wait_for(hook.background, 30)
    (child,) = supervisor.children
    assert child.spec.name == "llm"
    assert child.alive()
    up_now = decode_local_state((await kv.get(LOCAL_MODEL_KEY)).value or b"")
    assert up_now is not None
    assert (up_now.state, up_now.api_base) == ("up", api_base)
    assert read_file(chosen.data_dir / "llm") == up_now
    await nc.close()


def test_the_estimate_counts_down_the_step_under_way_and_gives_back_a_step_done_early(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clock = [1000.0]
    monkeypatch.setattr("time.monotonic", lambda: clock[0])
    eta = up.Eta({"weights": 90.0, "build": 840.0, "server": 40.0, "load": 20.0})
    assert eta.left() == 990.0
    clock[0] += 10  # the weights came in 10 s, not 90
    assert eta.left() == 980.0
    eta.done("weights")
    assert eta.left() == 900.0  # their 80 s are given back
    clock[0] += 2000  # the build overran its estimate
    assert eta.left() == 30.0 + 40 + 20  # still coming: never "late", never below 30 s a step
    eta.done("build")
    eta.done("build")  # a step ends once
    eta.done("server")
    assert eta.left() == 30.0  # the load's 20 s, shown as the 30 s floor
    eta.done("load")
    assert eta.left() == 30.0


def test_the_install_lines_that_end_a_step_early_are_the_ones_it_prints() -> None:
    assert ended_step("model ready: /c/models/q.gguf (sha256 matches, 3s)") == "weights"
    assert ended_step("built llama_cpp_python-0.3.36-cp311-linux_x86_64.whl in 812s") == "build"
    assert ended_step("using the cached server build llama_cpp_python-0.3.36.whl") == "build"
    assert ended_step("building the server: 240s so far (log: /c/logs/build.log)") is None
