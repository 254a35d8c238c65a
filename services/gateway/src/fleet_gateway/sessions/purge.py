"""Purging a deleted session: the checkpointer (the one process holding the checkpoint key)
checkpoints what is there, signs a checkpoint naming each subject's last sequence and hash, and
only then purges, so an auditor's verification against the checkpoints still passes and names
the receipt. `session.purged` then records the receipt on the session's `.run.purge` subject
(`sessionlog.PURGE_RUN`), a subject of its own: the `.log` stays empty, so every route (and the
agent) sees no session, the writer refuses to open a session under the id again, and every
replica drops the session's rows."""

import msgspec
from nats.errors import NoRespondersError

from fleet_events import bus, new_id
from fleet_events.session import PurgeReceipt, PurgeSession, SessionPurged, run_subject
from fleet_gateway.sessionlog import PURGE_RUN, SessionLog
from fleet_gateway.sessions.errors import PurgeRefused, PurgeTimeout, PurgeUnavailable
from fleet_mesh import rpc

PURGE_TIMEOUT_S = 30.0


async def purge_session(
    log: SessionLog, tenant: str, session: str, *, by: str, reason: str
) -> tuple[PurgeReceipt, int]:
    ask = PurgeSession(request_id=new_id(), tenant=tenant, session=session, by=by, reason=reason)
    try:
        receipt = await rpc.call_verb(log.nc, bus.PURGE_SESSION, ask, timeout=PURGE_TIMEOUT_S)
    except NoRespondersError:
        raise PurgeUnavailable() from None
    except TimeoutError:
        raise PurgeTimeout(PURGE_TIMEOUT_S) from None
    except rpc.RemoteError as exc:
        raise PurgeRefused(exc.message) from None
    marker = log.envelope(
        tenant, session,
        SessionPurged(
            receipt=receipt.receipt, receipt_digest=receipt.digest, purged=receipt.purged,
            by=by, reason=reason,
        ),
    )  # fmt: skip
    marker = msgspec.structs.replace(marker, run=PURGE_RUN)
    subject = run_subject(tenant, session, PURGE_RUN)
    stored = await log.store.append(subject, marker, expect=await log.store.head(subject))
    return receipt, stored.seq
