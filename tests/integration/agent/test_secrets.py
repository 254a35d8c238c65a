"""The secrets store on a real server: sealed at rest, opened only by the services' key, under
the name it was written for; profiles hold references; FLEET_LLM_* seed the default profile."""

import logging
import os
from pathlib import Path
from typing import Any

import pytest
from nacl.public import PrivateKey, SealedBox
from nats.js import JetStreamContext
from nats.js.errors import NotFoundError

from fleet_events import new_id, streams
from fleet_events.llm import ROLES, LlmProfile, Prices, profile_key
from fleet_mesh.bootstrap import bootstrap
from fleet_mesh.connection import connect
from fleet_mesh.natsserver import NatsServer
from fleet_mesh.runtime_config import (
    DEFAULT_KEY_REF,
    LlmConfig,
    ProfileConflict,
    SeedRefused,
)
from fleet_mesh.secrets import (
    KeyFileError,
    SecretNotFound,
    SecretRefused,
    SecretsReader,
    SecretsWriter,
    ensure_keypair,
    load_private_key,
    load_public_key,
    secret_key,
)

PLANTED = "sk-planted-" + "7f3a9c" * 6


async def raw_stream_bytes(js: JetStreamContext, stream: str) -> list[bytes]:
    """Every stored message of a stream (a KV bucket's history included), subject and body."""
    info = await js.stream_info(stream)
    found = []
    for seq in range(max(1, info.state.first_seq), info.state.last_seq + 1):
        try:
            msg = await js.get_msg(stream, seq)
        except NotFoundError:  # a deleted or purged sequence
            continue
        found.append((msg.subject or "").encode() + b" " + (msg.data or b""))
        found.extend(f"{k}={v}".encode() for k, v in (msg.headers or {}).items())
    return found


@pytest.fixture
def keys(tmp_path: Path) -> tuple[PrivateKey, Path, Path]:
    files = ensure_keypair(tmp_path / "secrets")
    return load_private_key(files.private), files.private, files.public


async def test_the_writer_seals_and_only_the_services_key_opens(
    js: JetStreamContext, keys: tuple[PrivateKey, Path, Path]
) -> None:
    private, _, public_file = keys
    tenant = f"t-{new_id()[:10]}"
    writer = await SecretsWriter.open(js, load_public_key(public_file))
    await writer.put("openai", PLANTED, tenant=tenant)

    reader = await SecretsReader.open_reader(js, private)
    assert await reader.get("openai", tenant=tenant) == PLANTED
    assert await writer.exists("openai", tenant=tenant)
    # the gateway's side has no way to read back: no method, and the public key cannot open
    assert not hasattr(writer, "get")
    kv = await js.key_value(streams.SECRETS.bucket)
    stored = (await kv.get(secret_key("openai", tenant))).value
    assert stored is not None
    public_only: Any = SealedBox(load_public_key(public_file))
    with pytest.raises(TypeError):
        public_only.decrypt(stored)
    stored_raw = await raw_stream_bytes(js, "KV_fleet-secrets")
    assert all(PLANTED.encode() not in raw for raw in stored_raw)
    # another key pair cannot open it
    stranger = SecretsReader(kv, PrivateKey.generate())
    with pytest.raises(SecretRefused, match="does not open with the services' key"):
        await stranger.get("openai", tenant=tenant)


async def test_a_sealed_value_copied_to_another_name_is_refused(
    js: JetStreamContext, keys: tuple[PrivateKey, Path, Path]
) -> None:
    """Attack: anyone who can write the bucket (the gateway) copies tenant A's ciphertext under
    tenant B's name, so B's profile would call B's server with A's key."""
    private, _, public_file = keys
    victim, attacker = f"a-{new_id()[:10]}", f"b-{new_id()[:10]}"
    writer = await SecretsWriter.open(js, load_public_key(public_file))
    await writer.put("openai", PLANTED, tenant=victim)
    kv = await js.key_value(streams.SECRETS.bucket)
    sealed = (await kv.get(secret_key("openai", victim))).value
    assert sealed is not None
    await kv.put(secret_key("openai", attacker), sealed)
    await kv.put(secret_key("other", victim), sealed)

    reader = await SecretsReader.open_reader(js, private)
    with pytest.raises(SecretRefused, match="sealed under another name") as caught:
        await reader.get("openai", tenant=attacker)
    assert PLANTED not in str(caught.value)
    with pytest.raises(SecretRefused, match="sealed under another name"):
        await reader.get("other", tenant=victim)
    assert await reader.get("openai", tenant=victim) == PLANTED


async def test_scopes_never_cross(
    js: JetStreamContext, keys: tuple[PrivateKey, Path, Path]
) -> None:
    private, _, public_file = keys
    name = f"s-{new_id()[:10]}"
    writer = await SecretsWriter.open(js, load_public_key(public_file))
    await writer.put(name, PLANTED)  # global
    reader = await SecretsReader.open_reader(js, private)
    with pytest.raises(SecretNotFound, match=f"secret '{name}' is not stored in tenant acme"):
        await reader.get(name, tenant="acme")
    assert await reader.get(name) == PLANTED


def test_key_files(tmp_path: Path) -> None:
    files = ensure_keypair(tmp_path / "k")
    assert files.private.stat().st_mode & 0o777 == 0o600
    again = ensure_keypair(tmp_path / "k")
    assert load_private_key(again.private).public_key == load_public_key(files.public)
    os.chmod(files.private, 0o644)
    with pytest.raises(KeyFileError, match=r"readable by others \(mode 0o644\): chmod 600"):
        load_private_key(files.private)
    (tmp_path / "bad.pub").write_bytes(b"not base64!!")
    with pytest.raises(KeyFileError, match="is not base64 of a 32-byte key"):
        load_public_key(tmp_path / "bad.pub")


async def test_profiles_are_compare_and_set(js: JetStreamContext) -> None:
    tenant = f"t-{new_id()[:10]}"
    llm = await LlmConfig.open(js)
    first = LlmProfile(name="p", model="openai/a", secret="key-1")
    rev = await llm.put_profile(first, tenant=tenant, expect=0)
    with pytest.raises(ProfileConflict, match="changed since revision 0"):
        await llm.put_profile(first, tenant=tenant, expect=0)
    rotated = LlmProfile(name="p", model="openai/a", secret="key-2")
    new_rev = await llm.put_profile(rotated, tenant=tenant, expect=rev)
    with pytest.raises(ProfileConflict, match=f"changed since revision {rev}"):
        await llm.put_profile(first, tenant=tenant, expect=rev)  # a stale rotation loses
    stored = await llm.get_profile("p", tenant=tenant)
    assert stored is not None
    assert (stored.profile.secret, stored.revision, stored.tenant) == ("key-2", new_rev, tenant)
    await llm.set_role("delegate", "p", tenant=tenant)
    resolved = await llm.resolve("delegate", tenant=tenant)
    assert resolved.profile == rotated
    # a stored profile that is no longer valid (written around the API) is refused on read
    kv = await js.key_value(streams.CONFIG.bucket)
    await kv.put(profile_key("p", tenant), b'{"name": "p", "model": "openai/a", "api_key": "x"}')
    with pytest.raises(ValueError, match="'api_key' is refused"):
        await llm.get_profile("p", tenant=tenant)


async def test_env_seeds_the_default_profile_and_the_key_stays_sealed(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """On a server of its own (the global profile is seeded once per bucket)."""
    caplog.set_level(logging.DEBUG)
    server = NatsServer(store_dir=tmp_path / "store", log_path=tmp_path / "nats.log").start()
    files = ensure_keypair(tmp_path / "secrets")
    env = {
        "FLEET_LLM_MODEL": "openai/qwen-local",
        "FLEET_LLM_API_BASE": "http://127.0.0.1:9/v1",
        "FLEET_LLM_API_KEY": PLANTED,
        "FLEET_SECRETS_PUBLIC_KEY": str(files.public),
    }
    nc = await connect(server.url, name="seed-test")
    try:
        js = nc.jetstream()
        report = await bootstrap(js, env=env)
        assert "llm profile default" in report.seeded
        assert f"secret {DEFAULT_KEY_REF}" in report.seeded
        assert {f"llm role {role}" for role in ROLES} <= set(report.seeded)

        llm = await LlmConfig.open(js)
        for role in ROLES:
            stored = await llm.resolve(role, tenant="anyone")
            assert stored.profile == LlmProfile(
                name="default",
                model="openai/qwen-local",
                api_base="http://127.0.0.1:9/v1",
                secret=DEFAULT_KEY_REF,
                prices=Prices(),
            )
            assert stored.tenant is None
        reader = await SecretsReader.open_reader(js, load_private_key(files.private))
        assert await reader.get(DEFAULT_KEY_REF) == PLANTED

        # a second bootstrap with another env changes nothing
        again = await bootstrap(js, env={**env, "FLEET_LLM_MODEL": "openai/other"})
        assert not [s for s in again.seeded if s.startswith("llm")]
        assert (await llm.resolve("planner", tenant=None)).profile.model == "openai/qwen-local"

        # the key is nowhere in plain: config history, secrets bucket, any stream, the logs
        info = await js.streams_info()
        for stream in info:
            raws = await raw_stream_bytes(js, stream.config.name or "")
            assert all(PLANTED.encode() not in raw for raw in raws), stream.config.name
        assert PLANTED not in caplog.text
    finally:
        await nc.close()
        server.stop()


async def test_bad_seed_environments_are_refused_clearly(js: JetStreamContext) -> None:
    with pytest.raises(SeedRefused, match="FLEET_LLM_API_KEY is set but the bootstrap has no"):
        await bootstrap(js, env={"FLEET_LLM_MODEL": "openai/x", "FLEET_LLM_API_KEY": PLANTED})
    with pytest.raises(SeedRefused, match="without FLEET_LLM_MODEL") as caught:
        await bootstrap(js, env={"FLEET_LLM_API_KEY": PLANTED})
    assert PLANTED not in str(caught.value)
    with pytest.raises(SeedRefused, match="must not carry credentials") as caught:
        await bootstrap(
            js,
            env={"FLEET_LLM_MODEL": "openai/x", "FLEET_LLM_API_BASE": f"http://u:{PLANTED}@h/v1"},
        )
    assert PLANTED not in str(caught.value)
