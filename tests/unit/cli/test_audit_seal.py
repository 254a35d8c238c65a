"""An export's seal (fleet_events.seal) closes the gaps the hostile-tenant test found in
`fleet audit verify --keys` (issue 27, "audit closes its gaps"): a truncated export, one that
splices two sessions, one missing a blob line. Each export here is the gateway's shape (key
line, signed events, blob lines, seal), built from the same pieces the gateway uses; each
attack passed verify before the seal and the one-session, every-blob rule moved into
`fleet_mesh.bundle`, the rule the import applies too."""

import base64
import hashlib
import json
from pathlib import Path

from typer.testing import CliRunner

from fleet_events.signing import KeySet, Signer
from fleet_mesh.bundle import Sealer, blob_line, read_bundle

from .test_audit_verify import app, said, signed_export, write

DOC = b"the attached document"
DOC_SHA = hashlib.sha256(DOC).hexdigest()


def pinned(tmp_path: Path, *signers: Signer) -> Path:
    keyset = tmp_path / "keyset.json"
    keyset.write_text(json.dumps(KeySet.of(list(signers), require_signatures=True).to_json()))
    return keyset


def verify(path: Path, keys: Path | None) -> tuple[int, str]:
    argv = ["audit", "verify", str(path), *(["--keys", str(keys)] if keys else [])]
    result = CliRunner().invoke(app, argv)
    return result.exit_code, said(result)


def with_blob(signer: Signer) -> list[dict[str, object]]:
    """An export whose last event names a blob, its blob line, and the seal over both."""
    rows = signed_export(signer, sealed=False)
    sealer = Sealer("fleet.session.acme.s1.>", signer)
    for row in rows[1:]:
        sealer.event(str(row["subject"]), int(str(row["seq"])), str(row["hash"]))
    rows.append(json.loads(blob_line("o", DOC_SHA, DOC)))
    sealer.blob(DOC_SHA)
    rows.append(json.loads(sealer.line()))
    return rows


def test_a_whole_sealed_export_verifies(tmp_path: Path) -> None:
    gateway = Signer.generate("gateway")
    code, text = verify(
        write(tmp_path / "ok.ndjson", with_blob(gateway)), pinned(tmp_path, gateway)
    )
    assert code == 0, text
    assert "verified: 3 events and 1 blobs, signatures, chains and the seal" in text


def test_a_truncated_export_is_refused_with_keys(tmp_path: Path) -> None:
    gateway = Signer.generate("gateway")
    keys = pinned(tmp_path, gateway)
    rows = signed_export(gateway, n=4)
    cut = write(tmp_path / "cut.ndjson", rows[:-2])  # the last event and the seal cut off
    code, text = verify(cut, keys)
    assert code == 1, text
    assert "ends without its seal: it was cut short (truncated)" in text
    # the seal kept but an event dropped before it: the subject ends short of its seal's head
    dropped = write(tmp_path / "dropped.ndjson", [*rows[:-2], rows[-1]])
    code, text = verify(dropped, keys)
    assert code == 1, text
    assert "ends at seq 3, its seal at seq 4" in text


def test_a_splice_of_two_sessions_is_refused_even_by_the_chain_only_check(tmp_path: Path) -> None:
    gateway = Signer.generate("gateway")
    # one stream: the second session's events come later in it (stream-wide sequences)
    first = signed_export(gateway, session="s1")
    second = signed_export(gateway, session="s2", first_seq=10)
    spliced = write(tmp_path / "spliced.ndjson", [*first[:-1], *second[1:-1], first[-1]])
    for keys in (None, pinned(tmp_path, gateway)):
        code, text = verify(spliced, keys)
        assert code == 1, text
        assert "belongs to another session than fleet.session.acme.s1" in text


def test_an_export_missing_its_blob_line_is_refused(tmp_path: Path) -> None:
    gateway = Signer.generate("gateway")
    rows = with_blob(gateway)
    without = write(tmp_path / "noblob.ndjson", [r for r in rows if r.get("kind") != "blob"])
    code, text = verify(without, pinned(tmp_path, gateway))
    assert code == 1, text
    assert f"the seal names blob {DOC_SHA[:16]}…, which the export does not carry" in text


def test_a_seal_rewritten_by_another_key_is_refused(tmp_path: Path) -> None:
    gateway, mallory = Signer.generate("gateway"), Signer.generate("gateway")
    rows = signed_export(gateway, n=4)
    forged = Sealer("fleet.session.acme.s1.>", mallory)
    for row in rows[1:-3]:  # a seal over a shorter history, to pass off a truncation
        forged.event(str(row["subject"]), int(str(row["seq"])), str(row["hash"]))
    path = write(tmp_path / "forged.ndjson", [*rows[:-3], json.loads(forged.line())])
    code, text = verify(path, pinned(tmp_path, gateway))
    assert code == 1, text
    assert f"the export's seal: signed by key {mallory.key_id}, which is not in the pinned" in text


def test_lines_after_the_seal_are_refused() -> None:
    gateway = Signer.generate("gateway")
    rows = signed_export(gateway)
    extra = json.dumps(rows[1]).encode()
    bundle = read_bundle([*(json.dumps(r).encode() for r in rows), extra])
    assert bundle.fault is not None
    assert "comes after the export's seal" in bundle.fault.reason


def test_a_blob_the_seal_does_not_name_is_refused() -> None:
    gateway = Signer.generate("gateway")
    rows = signed_export(gateway)
    smuggled = json.loads(blob_line("o", DOC_SHA, DOC))
    lines = [json.dumps(r).encode() for r in [*rows[:-1], smuggled, rows[-1]]]
    bundle = read_bundle(lines, keys=KeySet.of([gateway], require_signatures=True))
    assert bundle.fault is not None
    assert f"carries blob {DOC_SHA[:16]}…, which its seal does not name" in bundle.fault.reason
    assert base64.b64decode(str(smuggled["data"])) == DOC


def test_replay_verifies_first_and_runs_no_cell_of_an_export_that_fails(tmp_path: Path) -> None:
    """`fleet replay` used to run an export's cells without checking it: a spliced export is
    now refused before any sandbox starts (the refusal names the fault verify names)."""
    gateway = Signer.generate("gateway")
    first = signed_export(gateway, session="s1")
    second = signed_export(gateway, session="s2", first_seq=10)
    spliced = write(tmp_path / "spliced.ndjson", [*first[:-1], *second[1:-1], first[-1]])
    result = CliRunner().invoke(app, ["replay", str(spliced)])
    assert result.exit_code == 2, said(result)
    assert "does not verify, so nothing was replayed" in said(result)
    assert "belongs to another session than fleet.session.acme.s1" in said(result)
    sealed_only = write(tmp_path / "cut.ndjson", first[:-1])  # the seal cut off
    with_keys = CliRunner().invoke(
        app, ["replay", str(sealed_only), "--keys", str(pinned(tmp_path, gateway))]
    )
    assert with_keys.exit_code == 2, said(with_keys)
    assert "ends without its seal" in said(with_keys)
