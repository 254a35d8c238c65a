"""Request bodies over the limit answer 413 before a route reads them, whether the client
declares the length or streams it; nothing of such a request is stored.

The limit is `FLEET_GATEWAY_MAX_BODY_BYTES` everywhere except the path prefixes an upload
route registers with a larger one (`GatewayState.body_limits`).
"""

import json
from collections.abc import Callable
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send


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
        over = False
        refused = False

        async def counted() -> Message:
            nonlocal received, over
            if over:  # the route keeps reading: it gets nothing more of the body
                return {"type": "http.disconnect"}
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > limit:
                    over = True
                    return {"type": "http.disconnect"}
            return message

        async def guarded(message: Message) -> None:
            # Over the limit, whatever the route answers (a parse error, a disconnect) is
            # replaced by the 413: the client learns the real reason.
            nonlocal refused
            if not over:
                await send(message)
            elif not refused:
                refused = True
                await self._refuse(send, limit, None)

        await self.app(scope, counted, guarded)
        if over and not refused:
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
