"""What a sandbox sees of the host's filesystem: an allow-list, never a deny-list.

The attacks: top-level host directories not on the old hide list were listable and readable
from a sandbox; the workspace was mounted without nosuid/nodev; a workspace could fill the
host's inodes with no cap (now a quota per fork family: test_disk_quota.py).
"""

import os
import secrets
import shutil
import stat
import threading
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from fleet_sandbox_broker.providers.local import ETC, SHOW, LocalProvider, LocalSandbox

from .provider_kit import LIMITS, provider, run, settings, uid_block, value

UID_BASE = uid_block(360400)


def shown_on_this_host() -> set[str]:
    return {d.lstrip("/") for d in SHOW if os.path.lexists(d)}


@pytest.fixture
async def local(tmp_path: Path) -> AsyncIterator[LocalProvider]:
    async with provider(tmp_path, UID_BASE, max_inodes=300, inode_check_s=0.2) as made:
        yield made


@pytest.fixture
async def box(local: LocalProvider) -> AsyncIterator[LocalSandbox]:
    made = await local.create("mounts", LIMITS)
    yield made
    await made.destroy()


@pytest.fixture
def host_secret() -> Iterator[Path]:
    """A world-readable directory and file at the top of the host, on no list."""
    top = Path(f"/zz-secret-{secrets.token_hex(4)}")
    top.mkdir(mode=0o755)
    (top / "file").write_text("host secret")
    os.chmod(top / "file", 0o644)
    yield top
    shutil.rmtree(top)


async def test_only_allow_listed_entries_exist_at_the_top(
    box: LocalSandbox, local: LocalProvider, host_secret: Path
) -> None:
    root_top = local.settings.root.parts[1]  # the sandbox root is shown at its own path
    expected = shown_on_this_host() | {"etc", "proc", "dev", "tmp", root_top}
    top = value(await run(box, "import os\nsorted(os.listdir('/'))"))
    assert set(top) == expected
    etc = value(await run(box, "sorted(os.listdir('/etc'))"))
    assert set(etc) <= set(ETC)
    assert "shadow" not in etc
    dev = value(await run(box, "sorted(os.listdir('/dev'))"))
    assert set(dev) == {"null", "zero", "full", "random", "urandom", "fd", "stdin", "stdout",
                        "stderr"}  # fmt: skip
    probe = (
        "out = {}\n"
        f"for p in [{str(host_secret / 'file')!r}, '/work/main/pyproject.toml', '/root',"
        " '/etc/shadow', '/home', '/run', '/var']:\n"
        "    try:\n        open(p).read(); out[p] = 'read'\n"
        "    except OSError as e:\n        out[p] = type(e).__name__\n"
        "out"
    )
    seen = value(await run(box, probe))
    assert seen == {
        str(host_secret / "file"): "FileNotFoundError",
        "/work/main/pyproject.toml": "FileNotFoundError",
        "/root": "FileNotFoundError",
        "/etc/shadow": "FileNotFoundError",
        "/home": "FileNotFoundError",
        "/run": "FileNotFoundError",
        "/var": "FileNotFoundError",
    }


async def test_python_and_its_stdlib_work_inside(box: LocalSandbox) -> None:
    code = (
        "import json, decimal, hashlib, sqlite3, zlib, subprocess, tempfile, mimetypes\n"
        "with tempfile.NamedTemporaryFile(dir='.') as f:\n    f.write(b'x')\n"
        "(hashlib.sha256(b'a').hexdigest()[:8], subprocess.run(['echo', 'hi'],"
        " capture_output=True, text=True).stdout, mimetypes.guess_type('a.json')[0])"
    )
    assert value(await run(box, code)) == ["ca978112", "hi\n", "application/json"]


async def test_the_workspace_is_nosuid_and_nodev(box: LocalSandbox) -> None:
    """A root-owned setuid copy of `id` and a device node, put in the workspace by root."""
    setuid = box.workspace / "id"
    shutil.copy("/usr/bin/id", setuid)
    os.chmod(setuid, 0o4755)  # noqa: S103 - the point: a setuid-root binary
    os.mknod(box.workspace / "null", 0o666 | stat.S_IFCHR, os.makedev(1, 3))
    os.chmod(box.workspace / "null", 0o666)  # noqa: S103 - writable by anyone, but for nodev
    code = (
        "import subprocess\n"
        "euid = subprocess.run(['./id', '-u'], capture_output=True, text=True).stdout.strip()\n"
        "try:\n    open('null', 'w').write('x'); dev = 'opened'\n"
        "except OSError as e:\n    dev = type(e).__name__\n"
        "import os\nws = os.getcwd()\n"
        "opts = [l.split()[5] for l in open('/proc/self/mountinfo')"
        " if ws.startswith(l.split()[4] + '/')]\n"
        "(euid, dev, opts)"
    )
    euid, dev, opts = value(await run(box, code))
    assert euid == str(box.uid)
    assert dev == "PermissionError"
    assert opts
    assert all({"nosuid", "nodev"} <= set(o.split(",")) for o in opts)


async def test_brokers_starting_at_once_on_one_root_share_one_etc(tmp_path: Path) -> None:
    """Two replicas on one root start together (test_restart does): building the `/etc`
    copy in place raced (FileExistsError, a half-copied /etc for a sandbox starting then)."""
    errors: list[BaseException] = []

    def start_many() -> None:
        try:
            for _ in range(10):
                LocalProvider(settings(tmp_path, UID_BASE + 20))
        except BaseException as exc:  # reported below, with its type
            errors.append(exc)

    starters = [threading.Thread(target=start_many) for _ in range(2)]
    for starter in starters:
        starter.start()
    for starter in starters:
        starter.join()
    assert errors == []
    async with provider(tmp_path, UID_BASE + 20) as local:
        box = await local.create("etc", LIMITS)
        try:
            assert "passwd" in value(await run(box, "import os\nos.listdir('/etc')"))
        finally:
            await box.destroy()
