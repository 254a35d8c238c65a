"""A deadline on every request head: uvicorn has none (each byte a client sends cancels its
keep-alive timer, and nothing re-arms it until a response completes), so a slow-loris client
trickling one header line at a time held its connection forever; 3,000 such were held.

`HeadDeadline` is uvicorn's h11 protocol with a timer armed when a connection opens and after
each response: a client that has not sent a whole request head when it fires is disconnected.
A request whose head arrived is never cut by it (its body and a streamed or WebSocket
response take as long as they take; the routes bound those)."""

import asyncio

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol


class HeadDeadline(H11Protocol):
    head_timeout_s = 10.0
    _head_timer: asyncio.TimerHandle | None = None

    # uvicorn's own signature, narrower than asyncio.Protocol's (it ignores the same way)
    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._expect_head()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._expect_head()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_head_timer()
        super().connection_lost(exc)

    def _expect_head(self) -> None:
        self._cancel_head_timer()
        if not self.transport.is_closing():
            self._head_timer = self.loop.call_later(self.head_timeout_s, self._head_late)

    def _cancel_head_timer(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_late(self) -> None:
        self._head_timer = None
        # IDLE: h11 has not parsed a whole request head since the connection opened or the
        # last response ended (a parsed one moves it on, an upgrade switches it away)
        if self.conn.their_state is h11.IDLE and not self.transport.is_closing():
            self.transport.close()


def with_head_deadline(timeout_s: float) -> type[HeadDeadline]:
    """The protocol class for a server whose clients get `timeout_s` to send a request head."""

    class Deadlined(HeadDeadline):
        head_timeout_s = timeout_s

    return Deadlined


__all__ = ["HeadDeadline", "with_head_deadline"]
