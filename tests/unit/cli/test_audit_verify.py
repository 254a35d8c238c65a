"""`fleet audit verify` with no server: signed lines built here (the store's own export line
and signature statement), the pinned key set from a file, blob lines checked by digest, and the
verify path importing nothing it does not need (what made a 10,000-event verify slow)."""

import base64
import hashlib
import json
import subprocess
import sys
from pathlib import Path

from typer.testing import CliRunner

from fleet_cli.commands import COMMANDS, GROUPS, wanted
from fleet_cli.localllm.up import AUTO
from fleet_cli.main import cli, up_command
from fleet_events import Actor, Envelope, utc_now
from fleet_events.chain import GENESIS, link
from fleet_events.codec import Codec
from fleet_events.session import TurnRequested
from fleet_events.signing import KeySet, Signer
from fleet_mesh.bundle import Sealer

app = cli()
SUBJECT = "fleet.session.acme.s1.log"


def said(result: object) -> str:
    return " ".join(str(getattr(result, "output", "")).split())


def signed_export(
    signer: Signer, n: int = 3, *, session: str = "s1", sealed: bool = True, first_seq: int = 1
) -> list[dict[str, object]]:
    """An export as the gateway writes one: the key line, the signed events, the seal."""
    subject = f"fleet.session.acme.{session}.log"
    rows: list[dict[str, object]] = [KeySet.of([signer]).to_json()]
    sealer = Sealer(f"fleet.session.acme.{session}.>", signer)
    prev = GENESIS
    for i in range(n):
        payload = Codec().encode_inline(Envelope(
            id=f"e{i}", tenant="acme", session=session, actor=Actor(service="gateway", replica="g"),
            ts=utc_now(), data=TurnRequested(message=f"message {i}"),
        ))  # fmt: skip
        digest = link(prev, payload)
        rows.append({
            "subject": subject, "seq": first_seq + i, "id": f"e{i}", "prev": prev, "hash": digest,
            "payload": base64.b64encode(payload).decode(), "key": signer.key_id,
            "sig": signer.sign_append(subject, digest),
        })  # fmt: skip
        sealer.event(subject, first_seq + i, digest)
        prev = digest
    if sealed:
        rows.append(json.loads(sealer.line()))
    return rows


def write(path: Path, rows: list[dict[str, object]]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def test_pinned_keys_pass_a_signed_export_and_name_a_foreign_signer(tmp_path: Path) -> None:
    agent = Signer.generate("agent")
    keyset = tmp_path / "keyset.json"
    keyset.write_text(json.dumps(KeySet.of([agent], require_signatures=True).to_json()))
    export = write(tmp_path / "ok.ndjson", signed_export(agent))
    ok = CliRunner().invoke(app, ["audit", "verify", str(export), "--keys", str(keyset)])
    assert ok.exit_code == 0, said(ok)
    assert "verified: 3 events, signatures, chains and the seal against the pinned keys" in said(ok)
    assert "the export names keys of agent" in said(ok)

    mallory = Signer.generate("agent")  # the same owner's name, another key
    forged = write(tmp_path / "forged.ndjson", signed_export(mallory))
    chain_only = CliRunner().invoke(app, ["audit", "verify", str(forged)])
    assert chain_only.exit_code == 0  # the chain alone is fooled, and says it checked no key
    assert "chains and the seal's count only (pass --keys to check signatures)" in said(chain_only)
    caught = CliRunner().invoke(app, ["audit", "verify", str(forged), "--keys", str(keyset)])
    assert caught.exit_code == 1
    assert f"event e0 (seq 1 on {SUBJECT})" in said(caught)
    assert f"signed by key {mallory.key_id}, which is not in the pinned key set" in said(caught)


def test_a_key_set_that_is_not_one_is_refused_naming_the_file(tmp_path: Path) -> None:
    export = write(tmp_path / "ok.ndjson", signed_export(Signer.generate("agent")))
    bad = tmp_path / "keys.json"
    bad.write_text("[1, 2]")
    result = CliRunner().invoke(app, ["audit", "verify", str(export), "--keys", str(bad)])
    assert result.exit_code == 2
    assert f"--keys {bad}: not a key set" in said(result)


def test_a_blob_line_whose_bytes_do_not_match_its_digest_is_named(tmp_path: Path) -> None:
    rows = signed_export(Signer.generate("agent"), sealed=False)
    data = b"the document"
    blob = {"kind": "blob", "object": "o", "sha256": hashlib.sha256(data).hexdigest(),
            "size": len(data), "data": base64.b64encode(data).decode()}  # fmt: skip
    good = tmp_path / "good.ndjson"
    good.write_text("".join(json.dumps(r) + "\n" for r in rows) + json.dumps(blob) + "\n")
    assert CliRunner().invoke(app, ["audit", "verify", str(good)]).exit_code == 0
    blob["data"] = base64.b64encode(b"another document").decode()
    bad = tmp_path / "bad.ndjson"
    bad.write_text("".join(json.dumps(r) + "\n" for r in rows) + json.dumps(blob) + "\n")
    result = CliRunner().invoke(app, ["audit", "verify", str(bad)])
    assert result.exit_code == 1
    assert "blob line 5 does not match its sha256" in said(result)


def test_only_the_named_command_module_is_imported() -> None:
    assert wanted(["audit", "verify", "x.ndjson"]) == ["audit"]
    assert wanted(["run", "--json", "hi"]) == ["run"]
    assert wanted(["--help"]) == [*COMMANDS, *GROUPS]
    assert wanted(["nonsense"]) == [*COMMANDS, *GROUPS]  # typer then names the typo


def test_the_verify_command_never_imports_the_client_nats_or_the_gateway(tmp_path: Path) -> None:
    export = write(tmp_path / "ok.ndjson", signed_export(Signer.generate("agent")))
    probe = (
        "import sys\n"
        f"sys.argv = ['fleet', 'audit', 'verify', {str(export)!r}]\n"
        "from fleet_cli.main import main\n"
        "try:\n    main()\nexcept SystemExit as exc:\n    code = exc.code\n"
        "heavy = ('nats', 'httpx', 'websockets', 'fleet_gateway', 'fleet_cli.client', 'dspy',"
        " 'fleet_mesh.store', 'aiohttp', 'fastapi')\n"
        "print(code, sorted(m for m in heavy if m in sys.modules))\n"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert done.stdout.split("\n")[-2] == "0 []", done.stdout + done.stderr


def test_up_s_default_llm_mode_is_the_local_model_modules_auto() -> None:
    default = up_command.__defaults__
    assert default is not None
    assert AUTO in default


def test_a_checkpoint_file_that_is_not_one_is_refused_naming_the_line(tmp_path: Path) -> None:
    agent = Signer.generate("agent")
    keyset = tmp_path / "keyset.json"
    keyset.write_text(json.dumps(KeySet.of([agent]).to_json()))
    export = write(tmp_path / "ok.ndjson", signed_export(agent))
    bad = tmp_path / "cp.jsonl"
    bad.write_text('\n{"kind": "fleet-keyset"}\n')
    argv = ["audit", "verify", str(export), "--keys", str(keyset), "--checkpoints", str(bad)]
    result = CliRunner().invoke(app, argv)
    assert result.exit_code == 2
    assert f"--checkpoints {bad}: line 2 is not a checkpoint" in said(result)
    bad.write_text("\n")
    assert "holds no checkpoint" in said(CliRunner().invoke(app, argv))
