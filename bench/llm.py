"""The embedded model server on this machine: time to first token, prompt and generation
tokens/s, and prefix reuse across RLM iterations, on vs off, side by side.

An RLM iteration resends the whole growing transcript. The requests here are the agent's own:
dspy's RLM action step for the chat's RLM route (`RLM_TURN`), with the agent's sandbox
instructions and the facade's sub-agent rules, formatted by the chat adapter, sent with the
embedded profile's wire (`max_tokens`, a seed, the grammar of the adapter's fields), and an
`llm_query` call between iterations, as a cell that asks a sub-model makes one. That call
replaces the server's last KV state, so without help each iteration evaluates its whole prompt
again. "on" is the server as `fleet up` runs it, with its RAM prompt cache (state saved after
each reply, restored by longest common prefix); "off" is the same server without it. Both
replay one transcript (the "on" run's replies), so the prompts are the same token for token.
The evaluated-token counts are the server's own (`llama_perf_context_print` in its log); "new"
is the prompt's tokens past its common prefix with the previous iteration's prompt.

    python bench/llm.py [--quick]

Figures are printed with the goals beside them, never asserted.
"""

import argparse
import asyncio
import contextlib
import json
import os
import re
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import dspy
import httpx
from dspy.predict.rlm import SUB_AGENT_INSTRUCTIONS
from dspy.primitives.repl_types import REPLHistory

from fleet_agent.chat.signatures import RLM_TURN
from fleet_agent.interpreter import EXECUTION_INSTRUCTIONS
from fleet_agent.llm_wire import chat_grammar, fields_in
from fleet_cli.localllm import server
from fleet_cli.localllm.install import Installed, ensure_installed
from fleet_cli.localllm.paths import Cache, default_cache
from fleet_cli.localllm.profile import LOCAL_SEED
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
STEP_TOKENS = 32  # enough for the first token and the reply's start; prompts are the subject
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
    served: Served,
    messages: list[dict[str, str]],
    max_tokens: int,
    grammar: str | None = None,
) -> tuple[float, float, str, dict[str, Any]]:
    """(time to first token, total time, text, usage) of one streamed completion."""
    body: dict[str, Any] = {
        "model": server.MODEL_ALIAS,
        "messages": messages,
        "max_tokens": max_tokens,
        "temperature": 0,
        "seed": LOCAL_SEED,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if grammar is not None:
        body["grammar"] = grammar
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


async def token_count(served: Served, text: str) -> int:
    headers = {"Authorization": f"Bearer {served.key}"}
    base = served.config.api_base.removesuffix("/v1")
    async with httpx.AsyncClient(timeout=60) as client:
        reply = await client.post(
            f"{base}/extras/tokenize/count", json={"input": text}, headers=headers
        )
    reply.raise_for_status()
    return int(reply.json()["count"])


class _AgentSandbox:
    """What the agent's interpreter factory tells dspy about its sandbox (`RecordingFactory`)."""

    execution_instructions = EXECUTION_INSTRUCTIONS


class RlmRequests:
    """The agent's RLM action-step requests for one task, as dspy's RLM builds them."""

    def __init__(self, iterations: int) -> None:
        self.iterations = iterations
        self.rlm = dspy.RLM(RLM_TURN, max_iters=iterations)
        self.signature = self.rlm._action_signature_for_current_factory(
            _AgentSandbox(), SUB_AGENT_INSTRUCTIONS
        )
        context = {"history": [], "core_memory": "persona: a careful analyst", "log": LISTING}
        self.variables = [v.format() for v in self.rlm._build_variables(task=TASK, context=context)]
        self.adapter = dspy.ChatAdapter(use_json_adapter_fallback=False)

    def messages(self, history: REPLHistory, index: int) -> list[dict[str, str]]:
        inputs = {
            "variables_info": self.variables,
            "repl_history": history,
            "iteration": f"{index + 1}/{self.iterations}",
        }
        formatted = self.adapter.format(self.signature, demos=[], inputs=inputs)
        return [{"role": m["role"], "content": m["content"]} for m in formatted]

    def step(self, text: str) -> tuple[str, str]:
        """(reasoning, code) of a reply; the raw text as code when it does not parse."""
        try:
            parsed = self.adapter.parse(self.signature, text)
        except Exception:  # a tiny model's reply: whatever it is, the transcript goes on
            return "", text
        return str(parsed.get("reasoning", "")), str(parsed.get("code", ""))


def _flat(messages: list[dict[str, str]]) -> str:
    return "\n".join(m["content"] for m in messages)


def _common_prefix(a: str, b: str) -> str:
    size = 0
    for left, right in zip(a, b, strict=False):
        if left != right:
            break
        size += 1
    return a[:size]


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


Row = tuple[int, int, float]  # (new prompt tokens, tokens the server evaluated, first token s)


async def iterations(
    served: Served, requests: RlmRequests, replay: list[str] | None
) -> tuple[list[Row], list[str]]:
    """One RLM run's action steps with an `llm_query` between them; `replay` gives the replies
    to put in the transcript (None: the model's own)."""
    history = REPLHistory(max_output_chars=2_000)
    rows: list[Row] = []
    replies: list[str] = []
    previous = ""
    for index in range(requests.iterations):
        messages = requests.messages(history, index)
        grammar = chat_grammar(fields_in(messages[-1]["content"]))
        ttft, _, text, usage = await stream_chat(served, messages, STEP_TOKENS, grammar)
        t = served.new_timings()
        prompt = int(usage.get("prompt_tokens") or t.prompt_tokens)
        shared = _common_prefix(_flat(messages), previous)
        shared_tokens = await token_count(served, shared) if shared else 0
        rows.append((max(prompt - shared_tokens, 0), t.evaluated, ttft))
        previous = _flat(messages)
        reply = replay[index] if replay is not None else text
        replies.append(reply)
        # the cell asks a sub-model, as llm_query does: a request of its own in between
        chunk = LISTING.splitlines()[index % 15]
        await stream_chat(served, [{"role": "user", "content": f"Summarise: {chunk}"}], 8)
        served.new_timings()
        reasoning, code = requests.step(reply)
        history = history.append(
            reasoning=reasoning, code=code, output=f"E{104 + index} seen {7 + index} times"
        )
    return rows, replies


async def prefix_reuse(installed: Installed, scratch: Path, count: int) -> None:
    print(f"\n== prefix reuse: {count} RLM iterations (the agent's action step), llm_query between")
    requests = RlmRequests(count)
    async with serving(installed, scratch / "on", server.PROMPT_CACHE_BYTES) as served:
        on, replies = await iterations(served, requests, None)
    async with serving(installed, scratch / "off", 0) as served:
        off, _ = await iterations(served, requests, replies)
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


@contextlib.asynccontextmanager
async def serving(installed: Installed, scratch: Path, cache_bytes: int) -> AsyncIterator[Served]:
    key = server.ensure_key(scratch)
    config = server.ServerConfig(
        model=installed.model, port=free_port(), python=installed.python,
        prompt_cache_bytes=cache_bytes,
    )  # fmt: skip
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
        print(f"server (prompt cache {cache_bytes >> 20} MiB): answering "
              f"{time.monotonic() - loaded:.1f}s after start")  # fmt: skip
        served = Served(config, key, log)
        served.new_timings()
        yield served
    finally:
        supervisor.stop()


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="fewer runs (the test tier)")
    args = parser.parse_args()
    started = time.monotonic()
    installed = ensure_installed(Cache(default_cache()), lambda line: print(f"install: {line}"))
    print(f"install: ready in {time.monotonic() - started:.1f}s (0 work when cached)")
    print(f"machine: {os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f}")
    scratch = Path(os.environ.get("TMPDIR", "/tmp")) / f"bench-llm-{uuid.uuid4().hex[:8]}"
    async with serving(installed, scratch / "speed", server.PROMPT_CACHE_BYTES) as served:
        await first_token(served, 2 if args.quick else 3)
    await prefix_reuse(installed, scratch, 3 if args.quick else 5)


if __name__ == "__main__":
    asyncio.run(main())
