"""`fleet up --llm ...`: decide which model the mesh uses, and for the local one install it
(once), start its server as a supervised child, and point the default profile at it.

It runs as `fleet up`'s before-services hook: after the bootstrap (so stored profiles can be
consulted and the key sealed), before the services (so the agent's first turn finds a profile).
"""

import asyncio
import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

import httpx
from nacl.public import PublicKey
from nats.js import JetStreamContext

from fleet_cli.localllm import profile, server, state
from fleet_cli.localllm.errors import LocalLlmError
from fleet_cli.localllm.install import ended_step, ensure_installed, estimates, steps_to_do
from fleet_cli.localllm.paths import Cache
from fleet_cli.localllm.state import StateReporter, measure_speed
from fleet_cli.supervisor import Supervisor
from fleet_events import streams
from fleet_events.llm import LocalState, check_profile_name, minutes_left
from fleet_mesh.connection import connect
from fleet_mesh.runtime_config import LlmConfig
from fleet_mesh.secrets import (
    PRIVATE_KEY_ENV,
    PUBLIC_KEY_ENV,
    ensure_keypair,
    public_key_from_env,
)

log = logging.getLogger("fleet.llm")

AUTO, LOCAL, NONE = "auto", "local", "none"
LOAD_TIMEOUT_S = 120.0
FAILED_ADVICE = (
    "fix what the error names and start fleet up again; or start without the local model "
    "(--llm none) or with a real one (FLEET_LLM_MODEL, docs/local-llm.md)"
)


class LlmUnavailable(LocalLlmError):
    """`--llm` asked for something that cannot be had; the message says what to do."""


@dataclass(frozen=True)
class LlmOptions:
    mode: str  # auto | local | none | <profile name>
    data_dir: Path
    port: int
    cache: Cache


def check_mode(mode: str) -> str:
    """Refuse a malformed `--llm` before anything starts."""
    if mode in (AUTO, LOCAL, NONE):
        return mode
    try:
        return check_profile_name(mode)
    except ValueError as exc:
        raise LlmUnavailable(
            f"--llm {mode!r} is neither local, none nor a profile name ({exc})"
        ) from None


def secrets_env(data_dir: Path, env: Mapping[str, str]) -> dict[str, str]:
    """The services' key pair: the operator's (FLEET_SECRETS_*), else one in the data dir."""
    if env.get(PRIVATE_KEY_ENV) or env.get(PUBLIC_KEY_ENV):
        return {}
    files = ensure_keypair(data_dir / "secrets")
    return {PRIVATE_KEY_ENV: str(files.private), PUBLIC_KEY_ENV: str(files.public)}


class LocalModelHook:
    """`fleet up`'s before-services hook for the model (`hook`). A machine that has the model
    installed starts its server before the services, as a warm restart should (seconds). A
    machine that has not yet (minutes: the weights, the server's build) gets the mesh and the
    UI at once: the default profile already names the server's address, the install runs in
    `background`, its state says what it is doing and about how long it still needs, and a
    model call meanwhile waits for it (`fleet_agent.lm`)."""

    def __init__(
        self, options: LlmOptions, say: Callable[[str], None], stop: asyncio.Event
    ) -> None:
        self.options = options
        self.say = say
        self.stop = stop
        self.background: asyncio.Task[None] | None = None

    async def __call__(self, nats_url: str, supervisor: Supervisor) -> dict[str, str]:
        options, say, stop = self.options, self.say, self.stop
        if options.mode == NONE:
            await _forget_local(nats_url, options.data_dir / "llm")
            say("LLM: none (--llm none): no model server started")
            return {}
        extra = secrets_env(options.data_dir, os.environ)
        public = public_key_from_env({**os.environ, **extra})
        if public is None:  # secrets_env makes a pair unless the operator named one
            raise LlmUnavailable(f"no services' public key: set {PUBLIC_KEY_ENV} to its file")
        nc = await connect(nats_url, name="fleet-up-llm")
        try:
            js = nc.jetstream()
            kv = await js.key_value(streams.CONFIG.bucket)
            elsewhere = await _model_elsewhere(js, options.mode, public)
            if elsewhere:
                await state.clear(kv, options.data_dir / "llm")
                say(f"LLM: {elsewhere}")
                return extra
            if _port_taken(options.port):
                raise LlmUnavailable(
                    f"the local LLM port {options.port} on 127.0.0.1 is in use; pass --llm-port "
                    "with a free port (0 picks one)"
                )
            todo = await asyncio.to_thread(steps_to_do, options.cache)
            key = server.ensure_key(options.data_dir / "llm")
            if todo:
                api_base = f"http://127.0.0.1:{options.port}/v1"
                for change in await profile.point_default_at(js, api_base, key, public):
                    log.info("seeded %s", change)
                eta = Eta(estimates(todo, os.cpu_count() or 1))
                reporter = StateReporter(options.data_dir / "llm", kv, asyncio.get_running_loop())
                reporter.report(
                    "installing", f"installing in the background: {', '.join(todo)}",
                    api_base=api_base, eta_s=eta.left(),
                )  # fmt: skip
                await reporter.flushed()
                say(
                    f"LLM: the local model installs in the background ({', '.join(todo)}; "
                    f"{minutes_left(eta.left())}); the mesh serves meanwhile and model calls "
                    "wait for it"
                )
                self.background = asyncio.create_task(
                    self._in_background(nats_url, supervisor, eta)
                )
                return extra
            reporter = StateReporter(options.data_dir / "llm", kv, asyncio.get_running_loop())
            try:
                config = await start_local(options, supervisor, say, stop, reporter)
            except LocalLlmError as exc:
                if not stop.is_set():
                    reporter.report("failed", str(exc), advice=FAILED_ADVICE)
                    await reporter.flushed()
                    raise
                reporter.report("stopped", "fleet up was stopped before the model was up")
                await reporter.flushed()
                say("LLM: stopped before the local model was up")  # Ctrl-C: a clean stop
                return extra
            for change in await profile.point_default_at(js, config.api_base, key, public):
                log.info("seeded %s", change)
            await reporter.flushed()
        finally:
            await nc.close()
        return extra

    async def _in_background(self, nats_url: str, supervisor: Supervisor, eta: "Eta") -> None:
        """The install, the server and its first answer, while the services run; a failure is
        reported (`/ready`, `fleet doctor`, every model call) and leaves the mesh up."""
        options, say, stop = self.options, self.say, self.stop
        nc = await connect(nats_url, name="fleet-up-llm-install")
        try:
            kv = await nc.jetstream().key_value(streams.CONFIG.bucket)
            reporter = StateReporter(options.data_dir / "llm", kv, asyncio.get_running_loop())
            try:
                await start_local(options, supervisor, say, stop, reporter, eta=eta)
            except LocalLlmError as exc:
                if stop.is_set():
                    reporter.report("stopped", "fleet up was stopped before the model was up")
                    say("LLM: stopped before the local model was up")
                else:
                    reporter.report("failed", str(exc), advice=FAILED_ADVICE)
                    say(f"LLM: the local model failed to start: {exc}; {FAILED_ADVICE}")
            await reporter.flushed()
        finally:
            await nc.close()


def hook(options: LlmOptions, say: Callable[[str], None], stop: asyncio.Event) -> LocalModelHook:
    return LocalModelHook(options, say, stop)


class Eta:
    """Seconds left: what remains of the step under way (never below 30 s: an overrun
    estimate still says the model is coming, not that it is late) and the estimates of the
    steps after it. A step that ends early gives its time back (`done`)."""

    def __init__(self, steps: dict[str, float]) -> None:
        self.steps = dict(steps)
        self.since = time.monotonic()
        self._lock = threading.Lock()

    def done(self, step: str) -> None:
        with self._lock:
            if self.steps.pop(step, None) is not None:
                self.since = time.monotonic()

    def left(self) -> float:
        with self._lock:
            times = list(self.steps.values())
            if not times:
                return 30.0
            current = max(30.0, times[0] - (time.monotonic() - self.since))
            return current + sum(times[1:])


async def _forget_local(nats_url: str, directory: Path) -> None:
    nc = await connect(nats_url, name="fleet-up-llm")
    try:
        await state.clear(await nc.jetstream().key_value(streams.CONFIG.bucket), directory)
    finally:
        await nc.close()


async def _model_elsewhere(js: JetStreamContext, mode: str, public: PublicKey) -> str | None:
    """Why the local model is not the one to start, or None when it is."""
    llm = await LlmConfig.open(js)
    if mode == LOCAL:
        return None
    if mode != AUTO:  # a profile's name
        if await llm.get_profile(mode) is None:
            raise LlmUnavailable(
                f"--llm {mode}: no global LLM profile {mode!r} is stored; create it through "
                "the config API, or use --llm local"
            )
        return f"the stored profile {mode!r}; no local model started"
    if profile.env_configured(os.environ):
        for change in await profile.hand_over_to_env(js, os.environ, public):
            log.info("seeded %s from FLEET_LLM_* (was the local model)", change)
    elsewhere = profile.env_configured(os.environ) or await profile.stored_elsewhere(llm)
    if elsewhere:
        return f"{elsewhere}; the local model is not started (--llm local forces it)"
    return None


async def start_local(
    options: LlmOptions,
    supervisor: Supervisor,
    say: Callable[[str], None],
    stop: asyncio.Event,
    reporter: StateReporter | None = None,
    *,
    eta: "Eta | None" = None,
) -> server.ServerConfig:
    api_base = f"http://127.0.0.1:{options.port}/v1"
    left = (lambda: eta.left()) if eta is not None else (lambda: None)

    def progress(line: str) -> None:
        say(line)
        ended = ended_step(line)
        if eta is not None and ended is not None:
            eta.done(ended)
        if reporter is not None:
            step: LocalState = "building" if line.startswith("building") else "installing"
            reporter.report(step, line, api_base=api_base, eta_s=left())

    progress("LLM: local (Qwen2.5-Coder-0.5B-Instruct on loopback); checking the install")
    cancel = threading.Event()  # the install runs in a thread: a stop must reach its build
    relay = asyncio.create_task(_relay(stop, cancel))
    try:
        installed = await asyncio.to_thread(
            ensure_installed, options.cache, progress, cancel=cancel
        )
    finally:
        relay.cancel()
    if eta is not None:  # installed: only the load is left
        for step in ("weights", "build", "server"):
            eta.done(step)
    if stop.is_set():  # stopped while it installed: the supervisor is stopping, start nothing
        raise LlmUnavailable("fleet up was stopped before the model was up")
    key = server.ensure_key(options.data_dir / "llm")
    config = server.ServerConfig(model=installed.model, port=options.port, python=installed.python)
    (child,) = supervisor.launch(
        server.child_spec(config, key, options.data_dir / "logs" / "llm.log")
    )
    if reporter is not None:
        reporter.report(
            "loading", "the server is loading the model", api_base=config.api_base, eta_s=left()
        )
    await wait_answering(config, key, lambda: child.alive() and not stop.is_set(), LOAD_TIMEOUT_S)
    speed = await _speed(config, key)
    if reporter is not None:
        reporter.report("up", "answering", api_base=config.api_base, speed=speed)
    shown = f" (first token {speed[0]:.0f} ms, {speed[1]:.1f} tokens/s)" if speed else ""
    say(f"LLM: local model server answering on {config.api_base}{shown}")
    return config


async def _speed(config: server.ServerConfig, key: str) -> tuple[float, float] | None:
    try:
        return await measure_speed(config, key)
    except (httpx.HTTPError, ValueError) as exc:  # a speed we cannot tell is no failure
        log.warning("could not measure the local model's speed: %s", type(exc).__name__)
        return None


def _port_taken(port: int) -> bool:
    with socket.socket() as probe:
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return True
    return False


async def _relay(stop: asyncio.Event, cancel: threading.Event) -> None:
    await stop.wait()
    cancel.set()


async def wait_answering(
    config: server.ServerConfig, key: str, alive: Callable[[], bool], timeout: float
) -> None:
    """Bounded: the server answers with the key, or it died, or the time is up."""
    deadline = asyncio.get_running_loop().time() + timeout
    async with httpx.AsyncClient(timeout=1.0) as client:
        while True:
            try:
                reply = await client.get(
                    f"{config.api_base}/models", headers={"Authorization": f"Bearer {key}"}
                )
                if reply.status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            if not alive():
                raise LlmUnavailable(
                    "the local LLM server exited (or fleet up was stopped) while it loaded; see "
                    "logs/llm.log"
                )
            if asyncio.get_running_loop().time() > deadline:
                raise LlmUnavailable(
                    f"the local LLM server did not answer within {timeout:.0f}s; see logs/llm.log"
                )
            await asyncio.sleep(0.2)
