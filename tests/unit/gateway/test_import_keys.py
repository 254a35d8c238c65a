"""The import's signature check with no server (`read_bundle(keys=)`, the import route's
`carried_keys`): pinned keys decide; a gateway with none checks a bundle against the key-set
line it carries, which catches a rehash that was not re-signed and nothing more."""

import base64
import json

from fleet_events import Actor, Envelope, utc_now
from fleet_events.chain import GENESIS, link
from fleet_events.codec import Codec
from fleet_events.session import SessionCreated, SessionRenamed
from fleet_events.signing import KeySet, Signer
from fleet_gateway.routes.transfer import carried_keys
from fleet_mesh.bundle import read_bundle

SUBJECT = "fleet.session.acme.s1.log"


def export(signer: Signer) -> list[dict[str, object]]:
    rows: list[dict[str, object]] = [KeySet.of([signer]).to_json()]
    prev = GENESIS
    for n, data in enumerate((SessionCreated(title="t"), SessionRenamed(title="u")), 1):
        payload = Codec().encode_inline(Envelope(
            id=f"e{n}", tenant="acme", session="s1", actor=Actor(service="gateway", replica="g"),
            ts=utc_now(), data=data,
        ))  # fmt: skip
        digest = link(prev, payload)
        rows.append({"subject": SUBJECT, "seq": n, "id": f"e{n}", "prev": prev, "hash": digest,
                     "payload": base64.b64encode(payload).decode(), "key": signer.key_id,
                     "sig": signer.sign_append(SUBJECT, digest)})  # fmt: skip
        prev = digest
    return rows


def lines(rows: list[dict[str, object]]) -> list[bytes]:
    return [json.dumps(row, separators=(",", ":")).encode() for row in rows]


def test_the_carried_key_line_is_used_without_requiring_signatures() -> None:
    signer = Signer.generate("gateway")
    carried = carried_keys(lines(export(signer)))
    assert carried is not None
    assert set(carried.keys) == {signer.key_id}
    assert carried.require_signatures is False
    assert carried_keys(lines(export(signer))[1:]) is None  # no key line: the chain only


def test_a_rehash_not_resigned_is_refused_against_thecarried_keys() -> None:
    rows = export(Signer.generate("gateway"))
    second = rows[2]
    body = base64.b64decode(str(second["payload"])).replace(b'"u"', b'"x"')
    second["payload"] = base64.b64encode(body).decode()
    second["hash"] = link(str(second["prev"]), body)
    assert read_bundle(lines(rows)).ok  # the chain alone is fooled
    bundle = read_bundle(lines(rows), keys=carried_keys(lines(rows)))
    assert bundle.fault is not None
    assert bundle.fault.event_id == "e2"
    assert "does not verify" in bundle.fault.reason


def test_pinned_keys_refuse_a_bundle_signed_by_a_key_they_do_not_hold() -> None:
    pinned = KeySet.of([Signer.generate("gateway")], require_signatures=True)
    foreign = lines(export(Signer.generate("gateway")))
    bundle = read_bundle(foreign, keys=pinned)
    assert bundle.fault is not None
    assert bundle.fault.event_id == "e1"
    assert "not in the pinned key set" in bundle.fault.reason
