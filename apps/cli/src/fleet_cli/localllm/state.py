"""The embedded model's state, where the rest of the mesh and `fleet doctor` can read it.

`fleet up` installs, builds and loads the model (before the services start when it is
installed already, beside them the first time), and says what it is doing, about how long it
still needs and why it stopped here. Each step is written twice: into the
config bucket (`fleet_events.llm.LOCAL_MODEL_KEY`: the gateway's `/ready` and the agent's
model probe read it, over NATS like everything else) and into `<data-dir>/llm/state.json`,
which `fleet doctor` reads when there is no gateway to ask (a failed build stops `fleet up`).

Once the server answers, one short streamed completion measures what a user will feel: the
time to the first token and the generation speed.
"""

import asyncio
import concurrent.futures
import json
import threading
import time
from pathlib import Path

import httpx
import msgspec
from nats.js.kv import KeyValue

from fleet_cli.localllm import server
from fleet_events import utc_now
from fleet_events.llm import LOCAL_MODEL_KEY, LocalModelState, LocalState

STATE_FILE = "state.json"
SPEED_PROMPT = "Count from 1 to 30, separated by spaces."
SPEED_TOKENS = 32


class StateReporter:
    """Writes each state to the file at once and to the bucket on `loop`; callable from the
    install's thread as well as from the loop."""

    def __init__(
        self, directory: Path, kv: KeyValue | None, loop: asyncio.AbstractEventLoop
    ) -> None:
        self.path = directory / STATE_FILE
        self.kv = kv
        self.loop = loop
        self.last: LocalModelState | None = None
        self._pending: list[concurrent.futures.Future[int]] = []
        self._lock = threading.Lock()

    def report(
        self,
        state: LocalState,
        detail: str = "",
        *,
        advice: str = "",
        api_base: str | None = None,
        speed: tuple[float, float] | None = None,
        eta_s: float | None = None,
    ) -> LocalModelState:
        value = LocalModelState(
            state=state, model=server.MODEL_ALIAS, updated_at=utc_now(), api_base=api_base,
            detail=detail[:500], advice=advice,
            first_token_ms=speed[0] if speed else None, tokens_per_s=speed[1] if speed else None,
            eta_s=round(eta_s) if eta_s is not None else None,
        )  # fmt: skip
        data = msgspec.json.encode(value)
        with self._lock:
            self.last = value
            self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            scratch = self.path.with_suffix(".tmp")
            scratch.write_bytes(data)
            scratch.replace(self.path)
            if self.kv is not None:
                put = self.kv.put(LOCAL_MODEL_KEY, data)
                self._pending.append(asyncio.run_coroutine_threadsafe(put, self.loop))
        return value

    async def flushed(self, timeout: float = 10.0) -> None:
        """Wait (bounded) until every write to the bucket is done."""
        with self._lock:
            pending, self._pending = self._pending, []
        if pending:
            await asyncio.wait([asyncio.wrap_future(f) for f in pending], timeout=timeout)


async def clear(kv: KeyValue, directory: Path) -> None:
    """This start runs no local model: an earlier start's state must not say it does (the
    config bucket outlives `fleet up` in the data dir, and `/ready` would wait on it)."""
    (directory / STATE_FILE).unlink(missing_ok=True)
    await kv.delete(LOCAL_MODEL_KEY)


def read_file(directory: Path) -> LocalModelState | None:
    try:
        return msgspec.json.decode((directory / STATE_FILE).read_bytes(), type=LocalModelState)
    except (OSError, msgspec.DecodeError):
        return None


async def measure_speed(config: server.ServerConfig, key: str) -> tuple[float, float]:
    """(first-token latency in ms, generated tokens per second) of one streamed completion;
    the server streams one chunk per token."""
    body = {
        "model": server.MODEL_ALIAS,
        "messages": [{"role": "user", "content": SPEED_PROMPT}],
        "max_tokens": SPEED_TOKENS, "temperature": 0, "seed": 1, "stream": True,
    }  # fmt: skip
    headers = {"Authorization": f"Bearer {key}"}
    started = time.perf_counter()
    first: float | None = None
    tokens = 0
    async with (
        httpx.AsyncClient(timeout=120) as client,
        client.stream(
            "POST", f"{config.api_base}/chat/completions", json=body, headers=headers
        ) as reply,
    ):
        reply.raise_for_status()
        async for line in reply.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            for choice in json.loads(line[6:]).get("choices", []):
                if (choice.get("delta") or {}).get("content"):
                    tokens += 1
                    first = first if first is not None else time.perf_counter()
    ended = time.perf_counter()
    if first is None:
        return (ended - started) * 1000, 0.0
    rate = (tokens - 1) / (ended - first) if tokens > 1 and ended > first else 0.0
    return round((first - started) * 1000, 1), round(rate, 1)


__all__ = ["STATE_FILE", "StateReporter", "clear", "measure_speed", "read_file"]
