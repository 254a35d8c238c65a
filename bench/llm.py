"""The embedded model server on this machine: time to first token, prompt and generation
tokens/s, and prefix reuse across RLM-like iterations, on vs off, side by side.

An RLM iteration resends the whole growing transcript; llama-cpp-python keeps the previous
request's KV state and evaluates only the tokens after the longest common prefix. "on" sends the
iterations back to back (what one run on one server does); "off" sends an unrelated request
between iterations, which replaces the cached state (what interleaved runs would do). The
evaluated-token counts are the server's own (`llama_perf_context_print` in its log).

    python bench/llm.py [--quick]

Figures are printed with the goals beside them, never asserted.
"""

import argparse
import asyncio
import json
import os
import re
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from fleet_cli.localllm import server
from fleet_cli.localllm.install import ensure_installed
from fleet_cli.localllm.paths import Cache, default_cache
from fleet_cli.supervisor import Supervisor
from fleet_mesh.natsserver import free_port

PROMPT_EVAL = re.compile(r"prompt eval time =\s*([\d.]+) ms /\s*(\d+) tokens")
EVAL = re.compile(r"\beval time =\s*([\d.]+) ms /\s*(\d+) runs")
PREFIX = re.compile(r"Llama\.generate: (\d+) prefix-match hit, remaining (\d+) prompt tokens")

TASK = (
    "You are an RLM: you write Python to inspect a large document held in the variable `doc` "
    "and call SUBMIT(answer) when done. The document is a service log; find the three most "
    "frequent error codes and the first timestamp of each. Rules: print small summaries, never "
    "the whole document; keep each cell short; explain your reasoning in one line first.\n"
)
LISTING = "".join(
    f"2026-11-30T10:{i % 60:02d}:{(i * 7) % 60:02d}Z worker-{i % 5} E{100 + i % 13} "
    f"request {i} failed after {i * 3 % 997} ms\n"
    for i in range(15)
)


@dataclass
class Served:
    config: server.ServerConfig
    key: str
    log: Path
    read_at: int = 0

    def new_timings(self) -> "Timings":
        """The server's own counts for the last request since the previous call."""
        text = self.log.read_text(errors="replace")
        fresh, self.read_at = text[self.read_at :], len(text)
        found = Timings()
        if prompt := PROMPT_EVAL.findall(fresh):
            found.prompt_ms, found.evaluated = float(prompt[-1][0]), int(prompt[-1][1])
        if gen := EVAL.findall(fresh):
            found.gen_ms, found.generated = float(gen[-1][0]), int(gen[-1][1])
        if prefix := PREFIX.findall(fresh):
            found.prompt_tokens = int(prefix[-1][0]) + int(prefix[-1][1])
        else:
            found.prompt_tokens = found.evaluated
        return found


@dataclass
class Timings:
    prompt_tokens: int = 0  # the whole prompt: reused prefix + evaluated
    evaluated: int = 0
    prompt_ms: float = 0.0
    generated: int = 0
    gen_ms: float = 0.0


async def stream_chat(
    served: Served, messages: list[dict[str, str]], max_tokens: int
) -> tuple[float, float, str, dict[str, Any]]:
    """(time to first token, total time, text, usage) of one streamed completion."""
    body = {
        "model": server.MODEL_ALIAS,
        "messages": messages,
        "max_tokens": max_tokens,
        "temperature": 0,
        "seed": 1,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    headers = {"Authorization": f"Bearer {served.key}"}
    started = time.perf_counter()
    first: float | None = None
    text, usage = "", {}
    async with (
        httpx.AsyncClient(timeout=600) as client,
        client.stream(
            "POST", f"{served.config.api_base}/chat/completions", json=body, headers=headers
        ) as reply,
    ):
        reply.raise_for_status()
        async for line in reply.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if chunk.get("usage"):
                usage = chunk["usage"]
            for choice in chunk.get("choices", []):
                piece = (choice.get("delta") or {}).get("content") or ""
                if piece and first is None:
                    first = time.perf_counter() - started
                text += piece
    total = time.perf_counter() - started
    return (first if first is not None else total), total, text, usage


async def first_token(served: Served, runs: int) -> None:
    print("\n== first token and tokens/s (unique prompts, nothing cached)")
    for run in range(runs):
        nonce = uuid.uuid4().hex[:8]
        messages = [
            {"role": "system", "content": f"Session {nonce}. " + TASK},
            {"role": "user", "content": "Write a Python function that counts words in a file."},
        ]
        ttft, total, _, _ = await stream_chat(served, messages, 64)
        t = served.new_timings()
        prompt_tps = t.evaluated / t.prompt_ms * 1000 if t.prompt_ms else float("nan")
        gen_tps = t.generated / t.gen_ms * 1000 if t.gen_ms else float("nan")
        print(
            f"run {run + 1}: first token {ttft * 1000:7.0f} ms, total {total:5.1f} s; server: "
            f"prompt {t.evaluated} tok at {prompt_tps:5.1f} tok/s, "
            f"generation {t.generated} tok at {gen_tps:5.1f} tok/s"
        )


async def iterations(served: Served, count: int, reuse: bool) -> list[tuple[int, int, float]]:
    """RLM-like iterations; per iteration: (new prompt tokens, tokens the server evaluated,
    time to first token)."""
    nonce = uuid.uuid4().hex[:8]
    messages = [
        {"role": "system", "content": f"Run {nonce}. " + TASK},
        {"role": "user", "content": "The document starts:\n" + LISTING},
    ]
    rows: list[tuple[int, int, float]] = []
    previous_prompt = 0
    for index in range(count):
        if not reuse and index:
            other = [{"role": "user", "content": f"Unrelated {uuid.uuid4().hex}: say ok"}]
            await stream_chat(served, other, 2)
            served.new_timings()
        ttft, _, text, _ = await stream_chat(served, messages, 24)
        t = served.new_timings()
        rows.append((t.prompt_tokens - previous_prompt, t.evaluated, ttft))
        previous_prompt = t.prompt_tokens
        messages.append({"role": "assistant", "content": text})
        messages.append(
            {"role": "user", "content": f"Cell {index + 1} output: E{104 + index} seen 7 times."}
        )
    return rows


async def prefix_reuse(served: Served, count: int) -> None:
    print(f"\n== prefix reuse: {count} iterations of one growing transcript, on vs off")
    on = await iterations(served, count, reuse=True)
    off = await iterations(served, count, reuse=False)
    print("iter | new tok | on: evaluated  first-token | off: evaluated  first-token")
    for index, ((new, ev_on, t_on), (_, ev_off, t_off)) in enumerate(zip(on, off, strict=True)):
        print(
            f"{index + 1:4} | {new:7} | {ev_on:13} {t_on * 1000:9.0f} ms | "
            f"{ev_off:14} {t_off * 1000:9.0f} ms"
        )
    later_on = on[1:]
    if later_on:
        worst = max(ev / max(new, 1) for new, ev, _ in later_on)
        ratio = max(t for _, _, t in later_on) / on[0][2]
        off_ratio = max(t for _, _, t in off[1:]) / off[0][2]
        print(
            f"reuse on, iterations 2+: evaluated/new at most {worst:.2f}x (goal <= 1.10x); "
            f"first token at most {ratio:.2f}x the first iteration's (goal <= 0.30x); "
            f"reuse off: {off_ratio:.2f}x"
        )


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="fewer runs (the test tier)")
    args = parser.parse_args()
    started = time.monotonic()
    installed = ensure_installed(Cache(default_cache()), lambda line: print(f"install: {line}"))
    print(f"install: ready in {time.monotonic() - started:.1f}s (0 work when cached)")
    print(f"machine: {os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f}")
    scratch = Path(os.environ.get("TMPDIR", "/tmp")) / f"bench-llm-{uuid.uuid4().hex[:8]}"
    key = server.ensure_key(scratch)
    config = server.ServerConfig(model=installed.model, port=free_port(), python=installed.python)
    log = scratch / "llm.log"
    supervisor = Supervisor(grace_s=5)
    supervisor.launch(server.child_spec(config, key, log))
    try:
        loaded = time.monotonic()
        async with httpx.AsyncClient(timeout=2) as client:
            while True:
                try:
                    reply = await client.get(
                        f"{config.api_base}/models", headers={"Authorization": f"Bearer {key}"}
                    )
                    if reply.status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                if time.monotonic() - loaded > 180:
                    raise SystemExit(f"the server did not answer within 180s; see {log}")
                await asyncio.sleep(0.2)
        print(f"server: answering {time.monotonic() - loaded:.1f}s after start")
        served = Served(config, key, log)
        served.new_timings()
        await first_token(served, 2 if args.quick else 3)
        await prefix_reuse(served, 3 if args.quick else 5)
    finally:
        supervisor.stop()


if __name__ == "__main__":
    asyncio.run(main())
