"""The one vocabulary of fleet-rlm.

Owns: the event envelope, every event and command Struct (one module per bounded context),
subject builders, stream / KV / object-store definitions and the payload codec.
Consumes and emits nothing itself: it is pure data, imported by every service and importing none.
"""

from fleet_events.envelope import Actor, BlobRef, Envelope, Event, new_id, utc_now
from fleet_events.ids import InvalidId, check_id

__all__ = ["Actor", "BlobRef", "Envelope", "Event", "InvalidId", "check_id", "new_id", "utc_now"]
