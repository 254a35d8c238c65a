"""The model server as a child of `fleet up`: llama-cpp-python's OpenAI-compatible server on
loopback, enforcing a generated API key.

The key is read from a 0600 file in the data dir and handed to the server in its environment
(pydantic-settings reads `API_KEY`), never on its command line, which any local user can read
in /proc, and never in a log line. Sandboxes could not reach loopback anyway (their own network
namespace); the key keeps every other local process out too.
"""

import os
import secrets
import stat
from dataclasses import dataclass
from pathlib import Path

from fleet_cli.children import ChildSpec
from fleet_cli.localllm.errors import LocalLlmError

MODEL_ALIAS = "qwen2.5-coder-0.5b-instruct"
N_CTX = 8192  # the server's default (2048) is shorter than one RLM prompt
PROMPT_CACHE_BYTES = 1 << 30
"""The server's RAM cache of evaluated prompts (KV state after each reply, looked up by the
longest common token prefix). Without it only the last request's state is kept, so one
`llm_query` between two RLM iterations makes the next iteration evaluate its whole transcript
again; with it the iteration pays for its new tokens only (bench/llm.py measures both)."""
KEY_FILE = "api.key"


class KeyFileRefused(LocalLlmError):
    pass


def ensure_key(directory: Path) -> str:
    """The mesh's local-LLM key: made once (0600), refused if others may read it."""
    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    path = directory / KEY_FILE
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        mode = path.stat().st_mode
        if mode & (stat.S_IRWXG | stat.S_IRWXO):
            raise KeyFileRefused(
                f"the local LLM key {path} is readable by others (mode {oct(mode & 0o777)}): "
                f"chmod 600 {path}, or delete it and a new one is made"
            ) from None
        key = path.read_text().strip()
        if len(key) < 32:
            raise KeyFileRefused(f"the local LLM key {path} is too short: delete it") from None
        return key
    key = secrets.token_urlsafe(32)
    with os.fdopen(fd, "w") as out:
        out.write(key + "\n")
    return key


@dataclass(frozen=True)
class ServerConfig:
    model: Path
    port: int
    python: str
    host: str = "127.0.0.1"
    n_ctx: int = N_CTX
    threads: int = os.cpu_count() or 1
    prompt_cache_bytes: int = PROMPT_CACHE_BYTES

    @property
    def api_base(self) -> str:
        return f"http://{self.host}:{self.port}/v1"


def argv(config: ServerConfig) -> tuple[str, ...]:
    return (
        config.python, "-m", "llama_cpp.server",
        "--model", str(config.model),
        "--model_alias", MODEL_ALIAS,
        "--host", config.host,
        "--port", str(config.port),
        "--n_ctx", str(config.n_ctx),
        "--n_threads", str(config.threads),
        "--n_threads_batch", str(config.threads),
        # off: per-token logits for the whole prompt cost 2.1 GB RSS instead of 0.8 GB, and
        # nothing here asks for prompt logprobs
        "--logits_all", "False",
        *_cache_flags(config),
    )  # fmt: skip


def _cache_flags(config: ServerConfig) -> tuple[str, ...]:
    if config.prompt_cache_bytes <= 0:  # the server's default: only the last request's state
        return ()
    return (
        "--cache",
        "True",
        "--cache_type",
        "ram",
        "--cache_size",
        str(config.prompt_cache_bytes),
    )


def child_spec(config: ServerConfig, key: str, log_path: Path) -> ChildSpec:
    # Only what the server needs: not `fleet up`'s environment, which may hold other secrets.
    env = {
        name: os.environ[name] for name in ("PATH", "HOME", "LANG", "TMPDIR") if name in os.environ
    }
    env.update(API_KEY=key, PYTHONUNBUFFERED="1")
    return ChildSpec(name="llm", argv=argv(config), env=env, log_path=log_path)
