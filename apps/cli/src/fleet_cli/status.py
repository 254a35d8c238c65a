"""A client of the gateway's `/ready`: one look, or a bounded wait until it says ready."""

import asyncio
import json
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

DEFAULT_GATEWAY = "http://127.0.0.1:8080"


@dataclass(frozen=True)
class ReadyAnswer:
    url: str
    status_code: int | None  # None: nothing answered
    body: dict[str, Any] | None
    error: str = ""

    @property
    def ready(self) -> bool:
        return self.status_code == 200


def recorded_gateway(data_dir: Path) -> str | None:
    """The gateway URL a running `fleet up` recorded in `data_dir`; None when none runs: no
    `up.json`, or one left by a `fleet up` that was killed (its pid is gone, and whatever
    listens on that port now is not this mesh's gateway)."""
    state = data_dir / "up.json"
    if state.exists():
        try:
            recorded = json.loads(state.read_text())
            return None if _gone(recorded.get("pid")) else str(recorded["gateway"])
        except (ValueError, KeyError, AttributeError):
            pass
    return None


def _gone(pid: object) -> bool:
    """Whether the `fleet up` that wrote the state file has ended (a file with no pid, from
    before it was recorded, is taken at its word)."""
    if not isinstance(pid, int) or isinstance(pid, bool):
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:  # a process of another user holds that pid now: not our fleet up
        return True
    return False


def gateway_url(data_dir: Path, explicit: str | None) -> str:
    """An explicit URL wins; else the one a running `fleet up` recorded; else the default."""
    if explicit:
        return explicit.rstrip("/")
    return recorded_gateway(data_dir) or DEFAULT_GATEWAY


def admin_token(
    data_dir: Path, *, local: bool = True, env: Mapping[str, str] | None = None
) -> str | None:
    """The token that shows `/ready`'s detail (an anonymous caller gets only the verdict):
    `FLEET_TOKEN`, else the development token of the mesh in `data_dir` when the gateway asked
    is that mesh's (`local`: a token of this machine's mesh is never sent to another), else
    none."""
    env = os.environ if env is None else env
    if env.get("FLEET_TOKEN"):
        return env["FLEET_TOKEN"]
    if not local:
        return None
    from fleet_cli.client import ClientError, mint_token  # client imports this module

    try:
        return mint_token(data_dir)
    except (ClientError, RuntimeError):  # no secret yet, or one half written: the verdict only
        return None


async def ask(url: str, timeout: float = 5.0, token: str | None = None) -> ReadyAnswer:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    try:
        async with httpx.AsyncClient(timeout=timeout) as client:
            response = await client.get(f"{url}/ready", headers=headers)
    except httpx.HTTPError as exc:
        return ReadyAnswer(url, None, None, f"{type(exc).__name__}: {exc}")
    try:
        body = response.json()
    except ValueError:
        return ReadyAnswer(url, response.status_code, None, "answer was not JSON")
    return ReadyAnswer(url, response.status_code, body)


async def wait_ready(url: str, timeout: float, interval: float = 0.25) -> ReadyAnswer:
    """Ask until ready or `timeout`; returns the last answer either way."""
    deadline = time.monotonic() + timeout
    while True:
        answer = await ask(url, timeout=min(5.0, max(0.5, deadline - time.monotonic())))
        if answer.ready or time.monotonic() >= deadline:
            return answer
        await asyncio.sleep(interval)
