"""OIDC tokens against a JWKS served on loopback by the test: issuer, audience, expiry,
rotation (an unknown kid refetches), and a flood of made-up kids that must not become a flood
of fetches against the issuer."""

import json
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import jwt
import pytest
from cryptography.hazmat.primitives.asymmetric import rsa
from cryptography.hazmat.primitives.asymmetric.rsa import RSAPrivateKey

from fleet_gateway.auth import Authenticator, Principal
from fleet_gateway.config import GatewaySettings
from fleet_gateway.errors import ApiError

ISSUER = "https://login.example.test/tenant-x"
AUDIENCE = "fleet-api"


@dataclass
class Issuer:
    url: str
    keys: dict[str, RSAPrivateKey] = field(default_factory=dict)
    hits: int = 0

    def add_key(self, kid: str) -> None:
        self.keys[kid] = rsa.generate_private_key(public_exponent=65537, key_size=2048)

    def jwks(self) -> dict[str, Any]:
        published = []
        for kid, key in self.keys.items():
            jwk = json.loads(jwt.algorithms.RSAAlgorithm.to_jwk(key.public_key()))
            published.append({**jwk, "kid": kid, "use": "sig", "alg": "RS256"})
        return {"keys": published}

    def token(self, kid: str, key: RSAPrivateKey | None = None, **over: Any) -> str:
        now = int(time.time())
        claims = {
            "iss": ISSUER,
            "aud": AUDIENCE,
            "sub": "user-1",
            "tid": "contoso",
            "iat": now,
            "exp": now + 300,
            **over,
        }
        signer = key or self.keys[kid]
        return jwt.encode(claims, signer, algorithm="RS256", headers={"kid": kid})


@pytest.fixture
def issuer() -> Iterator[Issuer]:
    state = Issuer(url="")

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            state.hits += 1
            body = json.dumps(state.jwks()).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *_: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    state.url = f"http://127.0.0.1:{server.server_address[1]}/keys"
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.01})
    thread.start()
    yield state
    server.shutdown()
    server.server_close()
    thread.join()


def _auth(issuer: Issuer, tmp_path: Path, refetch_min_s: float = 0.0) -> Authenticator:
    return Authenticator(
        GatewaySettings(
            oidc_issuer=ISSUER,
            oidc_audience=AUDIENCE,
            oidc_jwks_url=issuer.url,
            jwks_refetch_min_s=refetch_min_s,
        )
    )


async def test_an_oidc_token_gives_the_tenant_and_user_of_its_claims(
    issuer: Issuer, tmp_path: Path
) -> None:
    issuer.add_key("k1")
    auth = _auth(issuer, tmp_path)
    principal = await auth.authenticate(issuer.token("k1", fleet_admin=True))
    assert principal == Principal(tenant="contoso", user="user-1", admin=True)
    await auth.authenticate(issuer.token("k1"))
    assert issuer.hits == 1  # the keys are cached


async def test_a_rotated_key_is_found_by_refetching_the_jwks(
    issuer: Issuer, tmp_path: Path
) -> None:
    issuer.add_key("k1")
    auth = _auth(issuer, tmp_path)
    await auth.authenticate(issuer.token("k1"))
    issuer.add_key("k2")  # the issuer rotates: k2 signs from now on
    del issuer.keys["k1"]
    assert (await auth.authenticate(issuer.token("k2"))).tenant == "contoso"
    assert issuer.hits == 2


@pytest.mark.parametrize(
    ("over", "says"),
    [
        ({"iss": "https://evil.example"}, "issuer"),
        ({"aud": "someone-else"}, "audience"),
        ({"exp": int(time.time()) - 5}, "expired"),
    ],
)
async def test_an_oidc_token_for_another_issuer_audience_or_time_is_refused(
    issuer: Issuer, tmp_path: Path, over: dict[str, Any], says: str
) -> None:
    issuer.add_key("k1")
    with pytest.raises(ApiError) as caught:
        await _auth(issuer, tmp_path).authenticate(issuer.token("k1", **over))
    assert caught.value.status == 401
    assert says in caught.value.message.lower()


async def test_a_token_signed_by_a_key_the_issuer_does_not_publish_is_refused(
    issuer: Issuer, tmp_path: Path
) -> None:
    issuer.add_key("k1")
    stranger = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    auth = _auth(issuer, tmp_path)
    with pytest.raises(ApiError) as unknown:
        await auth.authenticate(issuer.token("k9", key=stranger))
    assert "does not publish" in unknown.value.message
    with pytest.raises(ApiError) as forged:  # a published kid, the wrong key behind it
        await auth.authenticate(issuer.token("k1", key=stranger))
    assert "signature" in forged.value.message.lower()


async def test_a_flood_of_unknown_kids_fetches_the_jwks_at_most_once_per_interval(
    issuer: Issuer, tmp_path: Path
) -> None:
    issuer.add_key("k1")
    stranger = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    auth = _auth(issuer, tmp_path, refetch_min_s=3600)
    await auth.authenticate(issuer.token("k1"))
    for i in range(50):
        with pytest.raises(ApiError):
            await auth.authenticate(issuer.token(f"made-up-{i}", key=stranger))
    assert issuer.hits == 1


async def test_an_unreachable_issuer_answers_503_naming_the_jwks_url(tmp_path: Path) -> None:
    dead = Issuer(url="http://127.0.0.1:9/keys")
    dead.add_key("k1")
    with pytest.raises(ApiError) as caught:
        await _auth(dead, tmp_path).authenticate(dead.token("k1"))
    assert caught.value.status == 503
    assert caught.value.code == "auth_unavailable"
    assert dead.url in caught.value.message
