"""A FAKE OpenAI-compatible model server for tests and benchmarks: it answers from a script.

A model cannot be made to answer deterministically, and the agent runs in its own process, so
the tests that drive whole turns need a server that speaks the wire a real one speaks
(`POST /v1/chat/completions`, plain JSON or `stream: true` server-sent events, with usage) and
answers exactly what the test wrote. Nothing here is a model; it is named a fake wherever it
is used. It runs on loopback in a thread of the test process (uvicorn + starlette), so the
test can count and hold calls at the place they happen:

- `calls[key]` counts requests per script key (the crash tests assert no call was repeated);
- a reply can wait at a **gate** until the test releases it, so a test can SIGKILL a replica at
  a known point without guessing a time;
- `latency_s` delays every reply by a fixed time, for benchmarks;
- a reply can fail the way providers fail: any HTTP `status` with an OpenAI-shaped error body
  (its `error_code`, e.g. `context_length_exceeded`), a `Retry-After` header (`retry_after`), or
  no answer at all (`hang`: the request stays open until the fake stops, so the client's own
  timeout is what ends the call).
"""

import asyncio
import collections
import contextlib
import json
import re
import socket
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import dataclass
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route


@dataclass(frozen=True)
class Reply:
    """What the fake answers. `key` names the call for counting and gates (default: the last
    user message); `status` other than 200 answers an OpenAI-shaped error instead, with
    `error_code` as its code and, when `retry_after` is set, a `Retry-After` header (seconds);
    `hang` never answers (the client times out; the fake's `stop()` ends the request)."""

    text: str
    key: str | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    gate: str | None = None
    status: int = 200
    finish_reason: str = "stop"
    error_code: str = "scripted_error"
    retry_after: float | None = None
    hang: bool = False
    pace_s: float = 0.0
    """Streamed replies: the wait before each piece (a slow model's generation speed); the
    pieces sent before the client closed the stream are counted in `ScriptedLM.streamed`."""


@dataclass(frozen=True)
class ScriptedRequest:
    """One request as the fake saw it (the body is kept whole for assertions)."""

    body: dict[str, Any]
    authorization: str | None

    @property
    def messages(self) -> list[dict[str, Any]]:
        return list(self.body.get("messages") or [])

    @property
    def model(self) -> str:
        return str(self.body.get("model", ""))

    @property
    def stream(self) -> bool:
        return bool(self.body.get("stream"))

    def texts(self, role: str) -> list[str]:
        return [_content_text(m.get("content")) for m in self.messages if m.get("role") == role]

    @property
    def last_user(self) -> str:
        users = self.texts("user")
        return users[-1] if users else ""

    @property
    def system(self) -> str:
        return "\n".join(self.texts("system"))

    @property
    def prompt_text(self) -> str:
        return "\n".join(_content_text(m.get("content")) for m in self.messages)


def _content_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return ""


Script = Iterable[Reply | str] | Callable[[ScriptedRequest], Reply | str]


def by_marker(table: dict[str, Reply | str], default: Reply | str | None = None) -> Script:
    """A script answering by the first marker (a regular expression) found in the prompt;
    the marker becomes the call's key unless the reply names its own."""
    compiled = [(re.compile(pattern), pattern, reply) for pattern, reply in table.items()]

    def answer(request: ScriptedRequest) -> Reply | str:
        text = request.prompt_text
        for regex, pattern, reply in compiled:
            if regex.search(text):
                if isinstance(reply, str):
                    return Reply(reply, key=pattern)
                return reply if reply.key else Reply(**{**reply.__dict__, "key": pattern})
        if default is None:
            raise ScriptError(f"no marker of {sorted(table)} is in the prompt")
        return default

    return answer


class ScriptError(LookupError):
    """The script has no answer for a request; the fake answers 500 saying so."""


class Gate:
    """A place where replies wait: `reached` is set when the first one arrives, and every one
    waits until `release()`."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.reached = threading.Event()
        self.released = threading.Event()
        self.arrivals = 0

    def release(self) -> None:
        self.released.set()

    def wait_reached(self, timeout: float) -> bool:
        return self.reached.wait(timeout)


def _tokens(text: str) -> int:
    """A stand-in token count (words, at least 1), stable so cost tests can predict it."""
    return max(1, len(text.split()))


class ScriptedLM:
    """The fake server. Use as a context manager; `base_url` is what `api_base` takes."""

    def __init__(
        self,
        script: Script,
        *,
        api_key: str | None = None,
        latency_s: float = 0.0,
        model: str = "scripted",
    ) -> None:
        self._answer: Callable[[ScriptedRequest], Reply | str]
        if callable(script):
            self._answer = script
        else:
            queue = collections.deque(script)
            lock = threading.Lock()

            def next_reply(_: ScriptedRequest) -> Reply | str:
                with lock:
                    if not queue:
                        raise ScriptError("the scripted replies are used up")
                    return queue.popleft()

            self._answer = next_reply
        self.api_key = api_key
        self.latency_s = latency_s
        self.model = model
        self.calls: collections.Counter[str] = collections.Counter()
        self.requests: list[ScriptedRequest] = []
        self.streamed: list[int] = []
        self.streams_ended: set[int] = set()
        """Indexes (into `streamed`) of the streams whose generation stopped: all sent, or the
        client gone."""
        """Per streamed reply, in order: the text pieces sent before it ended or the client
        closed it (a reply's whole text is `len(re.findall(...))` pieces)."""
        self.refused_auth = 0
        self._gates: dict[str, Gate] = {}
        self._stopping = threading.Event()
        """Set by `stop()`: what a `hang` reply waits for, so no request outlives the fake."""
        self._lock = threading.Lock()
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None
        self.port = 0

    # -- life ---------------------------------------------------------------------------------

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def start(self, timeout: float = 10.0) -> "ScriptedLM":
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        # accepted sockets inherit it: without it a reply's header and body writes meet the
        # client's delayed ACK and every call costs ~40 ms on loopback
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.bind(("127.0.0.1", 0))
        self.port = sock.getsockname()[1]
        app = Starlette(routes=[Route("/v1/chat/completions", self._complete, methods=["POST"])])
        config = uvicorn.Config(app, log_level="warning", access_log=False, lifespan="off")
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(
            target=self._server.run, kwargs={"sockets": [sock]}, daemon=True, name="scripted-lm"
        )
        self._thread.start()
        deadline = time.monotonic() + timeout
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the scripted LM server did not start")
            time.sleep(0.005)
        return self

    def stop(self) -> None:
        self._stopping.set()
        for gate in list(self._gates.values()):
            gate.release()
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(10)

    def __enter__(self) -> "ScriptedLM":
        return self.start()

    def __exit__(self, *_: object) -> None:
        self.stop()

    def gate(self, name: str) -> Gate:
        """The gate replies naming `name` (Reply.gate, or their key) wait at."""
        with self._lock:
            return self._gates.setdefault(name, Gate(name))

    # -- the endpoint -------------------------------------------------------------------------

    async def _complete(self, http: Request) -> Response:
        authorization = http.headers.get("authorization")
        if self.api_key is not None and authorization != f"Bearer {self.api_key}":
            with self._lock:
                self.refused_auth += 1
            return _error(401, "invalid_api_key", "Incorrect API key provided.")
        try:
            body = json.loads(await http.body())
        except ValueError:
            return _error(400, "invalid_request_error", "the body is not JSON")
        request = ScriptedRequest(body=body, authorization=authorization)
        try:
            reply = self._answer(request)
        except ScriptError as exc:
            return _error(500, "script_error", f"scripted LM (a fake): {exc}")
        if isinstance(reply, str):
            reply = Reply(reply)
        key = reply.key if reply.key is not None else request.last_user
        with self._lock:
            self.calls[key] += 1
            self.requests.append(request)
            gate = self._gates.get(reply.gate or key)
            if gate is not None:
                gate.arrivals += 1
        if gate is not None:
            gate.reached.set()
            await asyncio.to_thread(gate.released.wait)
        if self.latency_s:
            await asyncio.sleep(self.latency_s)
        if reply.hang:
            await asyncio.to_thread(self._stopping.wait)
            return _error(503, "scripted_error", "scripted LM (a fake): stopped while hanging")
        if reply.status != 200:
            headers = {} if reply.retry_after is None else {"Retry-After": f"{reply.retry_after:g}"}
            return _error(reply.status, reply.error_code, reply.text, headers)
        usage = {
            "prompt_tokens": reply.prompt_tokens
            if reply.prompt_tokens is not None
            else _tokens(request.prompt_text),
            "completion_tokens": reply.completion_tokens
            if reply.completion_tokens is not None
            else _tokens(reply.text),
        }
        usage["total_tokens"] = usage["prompt_tokens"] + usage["completion_tokens"]
        ident = f"chatcmpl-{uuid.uuid4().hex[:12]}"
        if request.stream:
            include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
            return StreamingResponse(
                self._chunks(ident, reply, usage if include_usage else None),
                media_type="text/event-stream",
            )
        return JSONResponse(
            {
                "id": ident,
                "object": "chat.completion",
                "created": int(time.time()),
                "model": self.model,
                "choices": [
                    {
                        "index": 0,
                        "message": {"role": "assistant", "content": reply.text},
                        "finish_reason": reply.finish_reason,
                    }
                ],
                "usage": usage,
            }
        )

    async def _chunks(
        self, ident: str, reply: Reply, usage: dict[str, int] | None
    ) -> AsyncIterator[bytes]:
        def chunk(delta: dict[str, Any], finish: str | None) -> bytes:
            body = {
                "id": ident,
                "object": "chat.completion.chunk",
                "created": int(time.time()),
                "model": self.model,
                "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
            }
            return f"data: {json.dumps(body)}\n\n".encode()

        yield chunk({"role": "assistant", "content": ""}, None)
        index = len(self.streamed)
        self.streamed.append(0)
        try:
            for piece in re.findall(r"\S+\s*|\s+", reply.text):
                if reply.pace_s:
                    await asyncio.sleep(reply.pace_s)  # the fake model's generation speed
                yield chunk({"content": piece}, None)
                self.streamed[index] += 1
        finally:
            self.streams_ended.add(index)
        yield chunk({}, reply.finish_reason)
        if usage is not None:
            tail = {
                "id": ident,
                "object": "chat.completion.chunk",
                "created": int(time.time()),
                "model": self.model,
                "choices": [],
                "usage": usage,
            }
            yield f"data: {json.dumps(tail)}\n\n".encode()
        yield b"data: [DONE]\n\n"


def _error(
    status: int, code: str, message: str, headers: dict[str, str] | None = None
) -> JSONResponse:
    return JSONResponse(
        {"error": {"message": message, "type": code, "code": code}},
        status_code=status,
        headers=headers,
    )


@contextlib.contextmanager
def scripted_lm(script: Script, **options: Any) -> Any:
    """`with scripted_lm([...]) as lm:` for tests that need one fake for a block."""
    server = ScriptedLM(script, **options).start()
    try:
        yield server
    finally:
        server.stop()


__all__ = [
    "Gate",
    "Reply",
    "ScriptError",
    "ScriptedLM",
    "ScriptedRequest",
    "by_marker",
    "scripted_lm",
]
