"""Request bodies over the limit answer 413 before a route reads them, whether the client
declares the length or streams it; nothing of such a request is stored.

The limit is `FLEET_GATEWAY_MAX_BODY_BYTES` everywhere except the path prefixes an upload
route registers with a larger one (`GatewayState.body_limits`).
"""

import json
from collections.abc import Callable
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send


class _TooLarge(Exception):
    pass


def _body(limit: int, seen: int | None) -> bytes:
    got = f"{seen} bytes" if seen is not None else "more"
    return json.dumps(
        {
            "code": "payload_too_large",
            "message": f"the request body is {got}, over this route's limit of {limit} bytes; "
            "send less (split it, or upload large files through the documents route)",
            "details": {"limit": limit},
        }
    ).encode()


class BodyLimit:
    def __init__(self, app: ASGIApp, limit_for: Callable[[str], int]) -> None:
        self.app = app
        self.limit_for = limit_for

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit = self.limit_for(scope["path"])
        declared = next(
            (value for name, value in scope["headers"] if name == b"content-length"), None
        )
        if declared is not None and declared.isdigit() and int(declared) > limit:
            await self._refuse(send, limit, int(declared))
            return
        received = 0
        started = False

        async def counted() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > limit:
                    raise _TooLarge
            return message

        async def tracking(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, counted, tracking)
        except _TooLarge:
            if not started:
                await self._refuse(send, limit, None)

    @staticmethod
    async def _refuse(send: Send, limit: int, seen: int | None) -> None:
        body = _body(limit, seen)
        headers: list[Any] = [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
        ]
        await send({"type": "http.response.start", "status": 413, "headers": headers})
        await send({"type": "http.response.body", "body": body})
