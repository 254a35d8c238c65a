"""Structured log lines: one JSON object per line on stderr, never a secret in them."""

import json
import logging
import sys
from datetime import UTC, datetime
from typing import Any

from fleet_mesh.settings import LogLevel

_RESERVED = set(vars(logging.makeLogRecord({})))


class JsonFormatter(logging.Formatter):
    def __init__(self, service: str, replica: str) -> None:
        super().__init__()
        self._static = {"service": service, "replica": replica}

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(),
            "level": record.levelname.lower(),
            **self._static,
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for key, value in vars(record).items():
            if key not in _RESERVED and not key.startswith("_"):
                line[key] = value
        if record.exc_info:
            line["exc"] = self.formatException(record.exc_info)
        return json.dumps(line, default=str)


def configure(service: str, replica: str, level: LogLevel = "INFO") -> logging.Logger:
    """Called once, by the runtime, with the level `MeshSettings` has already checked."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter(service, replica))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    logging.getLogger("nats").setLevel("WARNING")
    return logging.getLogger(f"fleet.{service}")
