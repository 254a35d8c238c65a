"""The gate every host callback from Daytona sandbox code passes (`llm_query`, `sub_rlm`, tools).

A Daytona sandbox runs on someone else's machines and cannot be handed a socket of the
broker's, so the channel is one the broker pulls: a cell writes call frames under
`.fleet/calls/<token>/` and the broker reads them through *that sandbox's* toolbox API (see
docs/sandboxes.md, "Host callbacks from Daytona"). This module is the part that decides, for
one frame read from one sandbox, whether it is a call to relay and as whom:

- identity comes from where the frame was read (`source`) and the token's issue record,
  never from the frame: a frame that names a sandbox, context or execution is malformed;
- a token is issued per execution and revoked when it ends: a frame under a finished
  execution's token, or under a token issued to another sandbox, is refused;
- each frame has a sequence number, strictly increasing per token: a replayed frame is refused
  (its call is never run twice);
- at most `max_in_flight` calls per sandbox are pending and `max_calls` per execution in all;
  past either the frame is refused at once, and `max_refusals` refusals stop the execution.
"""

import secrets
from dataclasses import dataclass

import msgspec

from fleet_events.sandbox import ToolCall


class CallbackRefused(Exception):
    """One frame is not relayed; `fatal` says the execution must be stopped as well."""

    def __init__(self, message: str, *, fatal: bool = False) -> None:
        super().__init__(message)
        self.fatal = fatal


class CallFrame(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    seq: int
    name: str
    args: list[object] = []
    kwargs: dict[str, object] = {}


@dataclass
class _Issued:
    sandbox: str
    context: str
    execution: str
    last_seq: int = 0
    calls: int = 0
    refusals: int = 0


_DECODER = msgspec.json.Decoder(CallFrame)


class CallbackGate:
    def __init__(
        self,
        *,
        max_in_flight: int = 8,
        max_calls: int = 1024,
        max_frame_bytes: int = 1 << 20,
        max_refusals: int = 64,
    ) -> None:
        self.max_in_flight = max_in_flight
        self.max_calls = max_calls
        self.max_frame_bytes = max_frame_bytes
        self.max_refusals = max_refusals
        self._issued: dict[str, _Issued] = {}
        self._in_flight: dict[str, int] = {}  # sandbox -> pending calls

    def issue(self, sandbox: str, context: str, execution: str) -> str:
        token = secrets.token_hex(16)
        self._issued[token] = _Issued(sandbox, context, execution)
        return token

    def revoke(self, token: str) -> None:
        self._issued.pop(token, None)

    def admit(self, source: str, token: str, raw: bytes) -> ToolCall:
        """The call to relay for one frame read from sandbox `source`, or `CallbackRefused`."""
        issued = self._issued.get(token)
        if issued is None or issued.sandbox != source:
            # a finished execution's token, a guessed one, or another sandbox's: all the same
            # to the sender, so the answer does not say which (it would confirm a token)
            raise CallbackRefused(
                f"callback refused: no execution of sandbox {source} is running under this token"
            )
        try:
            frame = self._decode(raw)
            if frame.seq <= issued.last_seq:
                raise CallbackRefused(
                    f"callback refused: frame {frame.seq} was already read "
                    f"(replayed; the last was {issued.last_seq})"
                )
            if issued.calls >= self.max_calls:
                raise CallbackRefused(
                    f"callback refused: this execution made its {self.max_calls} "
                    "host calls (the most one execution may make)"
                )
            pending = self._in_flight.get(source, 0)
            if pending >= self.max_in_flight:
                raise CallbackRefused(
                    f"host tool {frame.name!r} refused: {pending} host calls of "
                    f"this sandbox are already in flight (at most "
                    f"{self.max_in_flight} at once)"
                )
        except CallbackRefused as refused:
            issued.refusals += 1
            if issued.refusals >= self.max_refusals:
                raise CallbackRefused(
                    f"{refused}; {issued.refusals} frames of this execution were "
                    "refused, so it is stopped",
                    fatal=True,
                ) from None
            raise
        issued.last_seq = frame.seq
        issued.calls += 1
        self._in_flight[source] = self._in_flight.get(source, 0) + 1
        return ToolCall(
            request_id=f"{issued.execution}:{frame.seq}",
            sandbox=issued.sandbox,
            context=issued.context,
            name=frame.name,
            args=list(frame.args),
            kwargs=dict(frame.kwargs),
        )

    def finished(self, source: str) -> None:
        """One admitted call of `source` was answered."""
        self._in_flight[source] = max(0, self._in_flight.get(source, 0) - 1)

    def _decode(self, raw: bytes) -> CallFrame:
        if len(raw) > self.max_frame_bytes:
            raise CallbackRefused(
                f"callback refused: a {len(raw)} byte frame is over the "
                f"{self.max_frame_bytes} byte limit"
            )
        try:
            frame = _DECODER.decode(raw)
        except msgspec.ValidationError as exc:
            # a frame naming a sandbox, context or execution lands here: identity is not
            # the frame's to give
            raise CallbackRefused(f"callback refused: malformed frame ({exc})") from None
        except msgspec.DecodeError as exc:
            raise CallbackRefused(f"callback refused: not a JSON frame ({exc})") from None
        if frame.seq < 1:
            raise CallbackRefused(f"callback refused: seq must be 1 or more, got {frame.seq}")
        return frame
