"""Gateway tokens: what is accepted, and every forgery and confusion that must not be.

Each refusal is checked for its status and code, and for naming what was wrong."""

import base64
import hashlib
import hmac
import json
import os
import time
from pathlib import Path

import jwt
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from fleet_gateway.auth import Authenticator, Principal
from fleet_gateway.config import GatewaySettings
from fleet_gateway.errors import ApiError
from fleet_mesh.tokens import (
    GATEWAY_AUDIENCE,
    GATEWAY_ISSUER,
    SECRET_FILE,
    dev_token,
    issue_token,
    signing_secret,
)


def _auth(tmp_path: Path, **settings: object) -> Authenticator:
    return Authenticator(GatewaySettings(data_dir=tmp_path, **settings))  # type: ignore[arg-type]


def _claims(**over: object) -> dict[str, object]:
    now = int(time.time())
    claims: dict[str, object] = {
        "iss": GATEWAY_ISSUER,
        "aud": GATEWAY_AUDIENCE,
        "sub": "alice",
        "tid": "acme",
        "iat": now,
        "exp": now + 60,
    }
    claims.update(over)
    return {k: v for k, v in claims.items() if v is not None}


def _part(value: dict[str, object]) -> str:
    return base64.urlsafe_b64encode(json.dumps(value).encode()).decode().rstrip("=")


async def _refused(auth: Authenticator, token: str) -> ApiError:
    with pytest.raises(ApiError) as caught:
        await auth.authenticate(token)
    assert caught.value.status == 401
    assert caught.value.headers.get("WWW-Authenticate") == "Bearer"
    return caught.value


async def test_the_dev_token_names_tenant_dev_as_admin(tmp_path: Path) -> None:
    principal = await _auth(tmp_path).authenticate(dev_token(tmp_path))
    assert principal == Principal(tenant="dev", user="dev", admin=True)


async def test_a_gateway_token_carries_its_tenant_user_and_no_admin_by_default(
    tmp_path: Path,
) -> None:
    token = issue_token(signing_secret(tmp_path), tenant="acme", user="bob")
    assert await _auth(tmp_path).authenticate(token) == Principal(tenant="acme", user="bob")


def test_the_secret_is_created_once_private_and_reused(tmp_path: Path) -> None:
    first = signing_secret(tmp_path)
    assert signing_secret(tmp_path) == first
    assert len(first) == 64
    assert os.stat(tmp_path / SECRET_FILE).st_mode & 0o777 == 0o600


def test_a_truncated_secret_file_is_refused_not_used(tmp_path: Path) -> None:
    (tmp_path / SECRET_FILE).write_text("abc\n")
    with pytest.raises(RuntimeError, match="holds no usable secret"):
        signing_secret(tmp_path)


async def test_a_token_signed_with_another_secret_is_refused(tmp_path: Path) -> None:
    other = issue_token(b"x" * 64, tenant="acme", user="mallory")
    error = await _refused(_auth(tmp_path), other)
    assert error.code == "invalid_token"
    assert "Signature verification failed" in error.message


async def test_alg_none_is_refused(tmp_path: Path) -> None:
    unsigned = f"{_part({'alg': 'none', 'typ': 'JWT'})}.{_part(_claims(fleet_admin=True))}."
    error = await _refused(_auth(tmp_path), unsigned)
    assert "'none' are not accepted" in error.message


async def test_an_rs256_token_is_refused_when_no_issuer_is_configured(tmp_path: Path) -> None:
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    token = jwt.encode(_claims(), key, algorithm="RS256")
    error = await _refused(_auth(tmp_path), token)
    assert "'RS256' are not accepted" in error.message


async def test_hs256_signed_with_the_issuers_public_key_is_refused(tmp_path: Path) -> None:
    """The algorithm-confusion forgery: the attacker signs HS256 with a public key it knows.
    Only the gateway's own secret is ever an HMAC key."""
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    public = key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    signing_input = f"{_part({'alg': 'HS256', 'typ': 'JWT'})}.{_part(_claims(fleet_admin=True))}"
    mac = hmac.new(public, signing_input.encode(), hashlib.sha256).digest()
    forged = f"{signing_input}.{base64.urlsafe_b64encode(mac).decode().rstrip('=')}"
    error = await _refused(_auth(tmp_path, oidc_issuer="https://issuer.example"), forged)
    assert error.code == "invalid_token"


@pytest.mark.parametrize(
    ("over", "says"),
    [
        ({"exp": -10}, "expired"),
        ({"iss": "someone-else"}, "issuer"),
        ({"aud": "another-app"}, "audience"),
        ({"exp": None}, "exp"),
        ({"tid": None}, "no tenant"),
        ({"tid": "acme.>"}, "tenant"),
        ({"tid": "a" * 65}, "tenant"),
        ({"tid": 7}, "no tenant"),
        ({"sub": ""}, "no user"),
    ],
)
async def test_a_token_missing_or_misusing_a_claim_is_refused_naming_it(
    tmp_path: Path, over: dict[str, object], says: str
) -> None:
    if over.get("exp") == -10:  # relative to now, computed when the test runs
        over = {"exp": int(time.time()) - 10}
    token = jwt.encode(_claims(**over), signing_secret(tmp_path), algorithm="HS256")
    error = await _refused(_auth(tmp_path), token)
    assert says in error.message.lower()


async def test_a_tenant_that_would_widen_a_subject_never_becomes_a_principal(
    tmp_path: Path,
) -> None:
    """A wildcard tenant in a validly signed token (a mis-issued one) would read every
    tenant's subjects; it is refused before any route sees it."""
    for tenant in ("*", ">", "a.b", "a b", ""):
        token = jwt.encode(_claims(tid=tenant), signing_secret(tmp_path), algorithm="HS256")
        await _refused(_auth(tmp_path), token)


async def test_garbage_and_oversized_tokens_are_refused_with_a_clear_message(
    tmp_path: Path,
) -> None:
    error = await _refused(_auth(tmp_path), "not-a-jwt")
    assert "not a JWT" in error.message
    error = await _refused(_auth(tmp_path), "a" * 9000)
    assert "over 8192 characters" in error.message


async def test_a_gateway_without_data_dir_or_issuer_accepts_nothing() -> None:
    auth = Authenticator(GatewaySettings())
    token = issue_token(b"y" * 64, tenant="acme", user="bob")
    with pytest.raises(ApiError) as caught:
        await auth.authenticate(token)
    assert caught.value.code == "auth_not_configured"
    assert "FLEET_GATEWAY_DATA_DIR" in caught.value.message
