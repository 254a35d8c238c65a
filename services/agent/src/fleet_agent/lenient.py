"""Reading a log that a newer replica wrote to: an event type this version lacks is kept as
`Unknown` instead of failing the whole replay.

During a rolling upgrade the old and new agent replicas share sessions. `fleet_events.codec`
refuses a type it does not know (right for audits and for every service that must understand
each event), so the agent reads sessions through `LenientCodec`, and its session fold skips
`Unknown` and reports it (`fleet_events.session_fold.skipped_line`). Bytes that are not an
envelope, or a known type whose fields do not decode, are still a `CodecError`: those are
damage, not a newer version.
"""

from typing import Any

import msgspec

from fleet_events import Envelope
from fleet_events.catalog import BY_TAG
from fleet_events.codec import Codec, CodecError
from fleet_events.session_fold import Unknown

__all__ = ["LenientCodec", "Unknown"]


class _Named(msgspec.Struct):
    """Just the tag of an event payload, whatever its other fields."""

    type: str


class LenientCodec(Codec):
    """A codec for replaying sessions across versions: unknown event types become `Unknown`."""

    _names: msgspec.json.Decoder[Envelope[_Named]] = msgspec.json.Decoder(Envelope[_Named])

    def decode_stored(self, raw: bytes | memoryview) -> Envelope[Any]:
        try:
            return super().decode_stored(raw)
        except CodecError:
            kept = self._as_unknown(raw)
            if kept is None:
                raise
            return kept

    def _as_unknown(self, raw: bytes | memoryview) -> Envelope[Any] | None:
        try:
            named = self._names.decode(raw)
        except msgspec.DecodeError:
            return None
        if named.data.type in BY_TAG:
            return None
        return msgspec.structs.replace(named, data=Unknown(of_type=named.data.type))
