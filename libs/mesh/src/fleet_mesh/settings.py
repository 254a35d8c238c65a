"""The settings every mesh process shares, read from the environment once, at start.

`NATS_URL`, `FLEET_REPLICA` and `FLEET_LOG_LEVEL` were read by whichever module needed them,
each with its own default and none validated: a typo in the log level surfaced as a traceback
from `logging`, and the comma-separated server list of `compose.yaml` reached nats-py as one
malformed URL. Here they are read in one place and a bad value stops the process with a
message naming the variable, the value and what it may be. A URL's credentials are never
echoed: they are a secret, and this message goes to the log.
"""

import os
import socket
import uuid
from pathlib import Path
from typing import Literal, TypeVar, get_args
from urllib.parse import urlsplit

from pydantic import Field, ValidationError, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from fleet_events.ids import ID_PATTERN

DEFAULT_URL = "nats://127.0.0.1:4222"
LogLevel = Literal["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"]
LOG_LEVELS: tuple[str, ...] = get_args(LogLevel)
URL_SCHEMES = ("nats", "tls", "ws", "wss")
S = TypeVar("S", bound=BaseSettings)


class BadSetting(ValueError):
    """A mesh setting in the environment that cannot be used; the message says how to fix it."""


def parse_servers(value: str) -> list[str]:
    """A URL or a comma-separated list of them, as the list nats-py takes (it reads a single
    string as one URL, commas and all). Raises ValueError without echoing the value."""
    # `host:port` with no scheme means nats://, as it does to nats-py
    servers = [
        part if "://" in part or not part else f"nats://{part}"
        for part in (raw.strip() for raw in value.split(","))
    ]
    for index, server in enumerate(servers):
        where = f"server {index + 1} of {len(servers)}"
        if not server:
            raise ValueError(f"{where} is empty: separate server URLs with single commas")
        try:
            parts = urlsplit(server)
            port = parts.port  # urllib raises here for a port that is not 0-65535
        except ValueError:
            raise ValueError(f"{where} has a port that is not a number from 1 to 65535") from None
        if port == 0:
            raise ValueError(f"{where} has port 0: give the server's port")
        if parts.scheme not in URL_SCHEMES or not parts.hostname:
            raise ValueError(
                f"{where} is not a NATS server URL (scheme {parts.scheme or 'missing'!r}); "
                f"use {' or '.join(s + '://host:port' for s in URL_SCHEMES[:2])}"
            )
    return servers


class MeshSettings(BaseSettings):
    # An empty variable (`FLEET_REPLICA=` in a compose file) means unset, as it always did.
    model_config = SettingsConfigDict(
        frozen=True, extra="ignore", populate_by_name=True, env_ignore_empty=True
    )

    nats_url: str = Field(default=DEFAULT_URL, validation_alias="NATS_URL")
    """One server URL or a comma-separated list of a cluster's (`nats://a:4222,nats://b:4222`)."""
    replica: str | None = Field(default=None, validation_alias="FLEET_REPLICA")
    """This process's stable name among its service's replicas; generated when unset."""
    log_level: LogLevel = Field(default="INFO", validation_alias="FLEET_LOG_LEVEL")
    credentials: Path | None = Field(default=None, validation_alias="FLEET_NATS_CREDENTIALS")
    """This process's NKey seed file (`<role>.nk`: fleet_mesh.credentials); None: connect
    without credentials (a server with no users)."""
    ca: Path | None = Field(default=None, validation_alias="FLEET_NATS_CA")
    """The CA certificate of the mesh's nodes (fleet_mesh.tls): TLS on, names checked."""

    @field_validator("nats_url")
    @classmethod
    def _servers(cls, value: str) -> str:
        return ",".join(parse_servers(value))

    @field_validator("replica")
    @classmethod
    def _replica(cls, value: str | None) -> str | None:
        if value is not None and ID_PATTERN.fullmatch(value) is None:
            raise ValueError(
                f"{value[:80]!r} is not a replica name: use 1-64 characters from A-Z, a-z, "
                "0-9, '_' and '-' (it becomes part of subjects and log lines)"
            )
        return value

    @field_validator("log_level", mode="before")
    @classmethod
    def _level(cls, value: object) -> object:
        if isinstance(value, str) and value.strip().upper() in LOG_LEVELS:
            return value.strip().upper()
        raise ValueError(
            f"{str(value)[:40]!r} is not a log level: use one of {', '.join(LOG_LEVELS)}"
        )

    @property
    def servers(self) -> list[str]:
        return parse_servers(self.nats_url)

    def replica_for(self, service: str) -> str:
        """`FLEET_REPLICA`, or a name unique to this process (host, pid, random suffix)."""
        if self.replica:
            return self.replica
        host = "".join(c if c.isalnum() or c in "_-" else "-" for c in socket.gethostname()[:24])
        return f"{host or service}-{os.getpid()}-{uuid.uuid4().hex[:6]}"


def read_settings(cls: type[S]) -> S:
    """Read a settings class from the environment; raise `BadSetting` naming every variable
    that is wrong (by its environment name), what is wrong with it and what it may be."""
    try:
        return cls()
    except ValidationError as exc:
        prefix = str(cls.model_config.get("env_prefix") or "")
        problems = []
        for error in exc.errors(include_url=False, include_input=False):
            first = str(error["loc"][0]) if error["loc"] else ""
            # a field read under its own name carries the class's prefix; an alias is the name
            variable = (prefix + first).upper() if first in cls.model_fields else first
            message = error["msg"].removeprefix("Value error, ")
            problems.append(f"{variable}: {message}")
        what = "mesh setting" if cls is MeshSettings else "setting"
        raise BadSetting(f"bad {what}: " + "; ".join(problems)) from None


def load_settings() -> MeshSettings:
    """Read the mesh settings once; raise `BadSetting` naming every variable that is wrong."""
    return read_settings(MeshSettings)
