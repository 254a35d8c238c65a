"""Gateway-signed tokens: the HS256 secret a gateway makes in its data dir on first start, and
the tokens signed with it (API sessions, the development token `fleet up` prints).

Both the gateway (which verifies them, `fleet_gateway.auth`) and the CLI (which mints the local
mesh's development token) use this module, so neither imports the other. Verification stays in
the gateway: this module only makes secrets and signs.
"""

import contextlib
import os
import secrets
import time
from pathlib import Path

import jwt

from fleet_events.ids import check_id

GATEWAY_ISSUER = "fleet-gateway"
GATEWAY_AUDIENCE = "fleet-rlm"
SECRET_FILE = "signing-secret"  # noqa: S105 - a file name, not a secret
DEV_TOKEN_TTL_S = 30 * 24 * 3600


def signing_secret(data_dir: Path) -> bytes:
    """The gateway's HS256 secret, created on first use (0600). Replicas sharing a data dir
    share it; a race to create it is settled by O_EXCL, the loser reading the winner's."""
    data_dir.mkdir(parents=True, exist_ok=True)
    path = data_dir / SECRET_FILE
    with contextlib.suppress(FileExistsError):
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as out:
            out.write(secrets.token_hex(32) + "\n")
    text = path.read_text().strip()
    if len(text) < 64:  # a crash between create and write leaves it short: say so, never use it
        raise RuntimeError(
            f"{path} holds no usable secret ({len(text)} characters, 64 expected): delete it "
            "and start again (every token signed with it becomes invalid)"
        )
    return text.encode()


def issue_token(
    secret: bytes, *, tenant: str, user: str, admin: bool = False, ttl_s: float = 3600
) -> str:
    """A gateway-signed token for `tenant` / `user`: what API tokens and the dev token are."""
    check_id("tenant", tenant)
    now = int(time.time())
    claims = {
        "iss": GATEWAY_ISSUER,
        "aud": GATEWAY_AUDIENCE,
        "sub": user,
        "tid": tenant,
        "fleet_admin": admin,
        "iat": now,
        "exp": now + int(ttl_s),
        "jti": secrets.token_hex(8),
    }
    return jwt.encode(claims, secret, algorithm="HS256")


def dev_token(
    data_dir: Path, *, tenant: str = "dev", user: str = "dev", ttl_s: float = DEV_TOKEN_TTL_S
) -> str:
    """The development token `fleet up` prints: an admin of tenant `dev`, valid 30 days."""
    return issue_token(signing_secret(data_dir), tenant=tenant, user=user, admin=True, ttl_s=ttl_s)
