"""`python -m fleet_cli.localllm install`: the local LLM's install on its own, for CI caches
and for a machine that should be ready before its first `fleet up`. Prints each step and, at
the end, the model's path and how long it took."""

import argparse
import sys
from pathlib import Path

from fleet_cli.localllm.errors import LocalLlmError
from fleet_cli.localllm.install import ensure_installed
from fleet_cli.localllm.paths import Cache, default_cache


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m fleet_cli.localllm", description=__doc__)
    parser.add_argument("command", choices=["install"])
    parser.add_argument("--cache", default=None, help="default: $FLEET_LLM_CACHE or ~/.cache")
    args = parser.parse_args(argv)
    cache = Cache(default_cache() if args.cache is None else Path(args.cache))
    try:
        installed = ensure_installed(cache, lambda line: print(line, flush=True))
    except LocalLlmError as exc:
        print(f"local LLM install failed: {exc}", file=sys.stderr)
        return 2
    print(f"local LLM installed: {installed.model} ({installed.seconds:.0f}s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
