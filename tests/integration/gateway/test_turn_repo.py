"""A turn that names a git repository (`repo_url` / `repo_ref`), on the WebSocket `message`
frame and on `POST /api/v1/sessions/{id}/turns`, against a real nats-server and uvicorn: a
hostile URL or ref is refused naming the value and the rule (a password never echoed) and
stores nothing; a good one is stored in `TurnRequested` as sent. The POST route takes
`document_ids` (loaded ones only) and `context_paths` as the frame does."""

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from nats.js import JetStreamContext

from fleet_events import new_id, streams
from fleet_events.session import TurnRequested, session_filter
from fleet_mesh.natsserver import NatsServer
from fleet_mesh.store import open_store

from .ws_kit import Gateway, frames_until, serve

GOOD = "https://140.82.112.3/acme/widgets.git"
"""A public address, as a literal: the turn's host is resolved and judged before it is stored
(issue 27), and these tests make no DNS lookup."""
HOSTILE: list[tuple[dict[str, str], str, str]] = [
    ({"repo_url": "--upload-pack=touch /tmp/pwned"}, "invalid_repo_url", "starts with '-'"),
    ({"repo_url": "ext::sh -c id"}, "invalid_repo_url", "whitespace"),
    ({"repo_url": "ext::sh"}, "invalid_repo_url", "transport:: forms are refused"),
    ({"repo_url": "https://bob:hunter2@example.invalid/r.git"}, "invalid_repo_url", "password"),
    ({"repo_url": "file:///etc"}, "invalid_repo_url", "local repositories are not allowed"),
    ({"repo_url": "/srv/repo"}, "invalid_repo_url", "not a URL with a scheme"),
    ({"repo_url": "http://example.invalid/r.git"}, "invalid_repo_url", "scheme 'http'"),
    ({"repo_url": GOOD, "repo_ref": "--upload-pack=x"}, "invalid_repo_ref", "starts with '-'"),
    ({"repo_url": GOOD, "repo_ref": "main..HEAD"}, "invalid_repo_ref", "contains '..'"),
    ({"repo_url": GOOD, "repo_ref": "a b"}, "invalid_repo_ref", "outside letters"),
    ({"repo_ref": "main"}, "repo_ref_requires_repo", "send repo_url too"),
    # the broker clones on the host network: internal hosts are refused before anything is
    # stored (the suite allows loopback for its fakes, not the rest)
    ({"repo_url": "https://169.254.169.254/r.git"}, "address_not_public", "a link-local address"),
    ({"repo_url": "git://10.0.0.7/r.git"}, "address_not_public", "a private address"),
    ({"repo_url": "https://no-such-host.invalid/r.git"}, "address_not_public", "does not resolve"),
]


@pytest.fixture
async def gateway(nats_server: NatsServer, js: JetStreamContext, tmp_path: Path) -> Any:
    async with serve(nats_server.url, tmp_path / "gw") as gw:
        yield gw


async def _requests(js: JetStreamContext, tenant: str, session: str) -> list[TurnRequested]:
    store = await open_store(js, streams.SESSIONS)
    found = []
    async for stored in store.replay(session_filter(tenant, session)):
        if isinstance(stored.envelope.data, TurnRequested):
            found.append(stored.envelope.data)
    return found


def _check_refusal(code: str, message: str, fields: dict[str, str], want: str, rule: str) -> None:
    assert code == want, (fields, code, message)
    assert rule in message, message
    assert "hunter2" not in message  # the password is never sent back
    value = fields.get("repo_ref", fields.get("repo_url", ""))
    if "hunter2" not in value:
        assert repr(value) in message  # the message names the value it refuses


async def test_the_message_frame_refuses_hostile_repos_and_stores_a_good_one(
    gateway: Gateway, js: JetStreamContext
) -> None:
    tenant, session = f"t{new_id()[:8]}", new_id()
    ws = await gateway.socket(tenant)
    for fields, want, rule in HOSTILE:
        await ws.send(json.dumps({"type": "message", "content": "hi", "session_id": session,
                                  **fields}))  # fmt: skip
        frame = json.loads(await asyncio.wait_for(ws.recv(), 10))
        assert frame["type"] == "error", frame
        _check_refusal(frame["code"], frame["message"], fields, want, rule)
    assert await _requests(js, tenant, session) == []  # nothing stored
    await ws.send(json.dumps({
        "type": "message", "content": "what changed?", "session_id": session,
        "repo_url": GOOD, "repo_ref": "v1.2", "context_paths": ["src/app.py"],
    }))  # fmt: skip
    await frames_until(ws, lambda got: any(f["type"] == "accepted" for f in got))
    await ws.close()
    (stored,) = await _requests(js, tenant, session)
    assert (stored.repo_url, stored.repo_ref, stored.context_paths) == (
        GOOD, "v1.2", ("src/app.py",)
    )  # fmt: skip


async def test_post_turns_takes_repo_documents_and_paths_and_refuses_hostile_repos(
    gateway: Gateway, js: JetStreamContext
) -> None:
    tenant = f"t{new_id()[:8]}"
    async with gateway.client(tenant) as client:
        made = await client.post("/api/v1/sessions", json={"title": "repo"})
        assert made.status_code == 201, made.text
        session = made.json()["session"]["id"]
        for fields, want, rule in HOSTILE:
            refused = await client.post(
                f"/api/v1/sessions/{session}/turns", json={"message": "hi", **fields}
            )
            assert refused.status_code == 422, refused.text
            body = refused.json()
            _check_refusal(body["code"], body["message"], fields, want, rule)
        bad_path = await client.post(
            f"/api/v1/sessions/{session}/turns", json={"message": "hi", "context_paths": ["../x"]}
        )
        assert (bad_path.status_code, bad_path.json()["code"]) == (422, "invalid_context_path")
        unloaded = await client.post(
            f"/api/v1/sessions/{session}/turns", json={"message": "hi", "document_ids": ["notes"]}
        )
        assert (unloaded.status_code, unloaded.json()["code"]) == (422, "document_not_found")
        assert await _requests(js, tenant, session) == []
        uploaded = await client.post(
            f"/api/v1/sessions/{session}/documents",
            files={"file": ("notes.txt", b"we ship on friday\n", "text/plain")},
        )
        assert uploaded.status_code == 201, uploaded.text
        asked = await client.post(f"/api/v1/sessions/{session}/turns", json={
            "message": "what changed?", "mode": "rlm_only", "repo_url": GOOD,
            "repo_ref": "0123abc", "document_ids": ["notes"], "context_paths": ["README.md"],
        })  # fmt: skip
        assert asked.status_code == 202, asked.text
    (stored,) = await _requests(js, tenant, session)
    assert stored == TurnRequested(
        message="what changed?", mode="rlm_only", repo_url=GOOD, repo_ref="0123abc",
        document_ids=("notes",), context_paths=("README.md",),
    )  # fmt: skip
