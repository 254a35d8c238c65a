"""A client of the gateway's `/ready`: one look, or a bounded wait until it says ready."""

import asyncio
import time
from dataclasses import dataclass
from typing import Any

import httpx


@dataclass(frozen=True)
class ReadyAnswer:
    url: str
    status_code: int | None  # None: nothing answered
    body: dict[str, Any] | None
    error: str = ""

    @property
    def ready(self) -> bool:
        return self.status_code == 200


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
