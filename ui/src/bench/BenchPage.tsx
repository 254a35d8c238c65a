// The in-browser benchmark (bench/ui.py drives it through ui/e2e/bench.mjs): the workspace's
// own panels fed synthetic frames through the same per-frame batching the live socket uses,
// measured by the browser's frame clock. Loaded only at /bench (its own chunk), no sign-in:
// it talks to no gateway.
import { useMemo, useRef, useState } from "react";
import { flushSync } from "react-dom";
import { bigSession, oneTurn } from "../../bench/shared";
import { BudgetBar, ExecutionPanel } from "../app/ExecutionPanel";
import { frameBatcher } from "../app/feed";
import { TimeTravel } from "../app/TimeTravel";
import { TraceTree } from "../app/TraceTree";
import { Transcript } from "../app/Transcript";
import { useTimeline } from "../app/useTimeline";
import { fold, viewAt } from "../model/fold";
import type { EventFrame } from "../model/frames";
import { emptyView, type ViewModel } from "../model/view";

interface LiveResult {
  frames_ms: number[];
  wall_ms: number;
  events: number;
}

const nextPaint = () =>
  new Promise<void>((resolve) => requestAnimationFrame(() => setTimeout(resolve, 0)));

/** Feed `frames` as a socket would: paced (`gapMs` between deliveries, each delivering what
 * is due) or in a burst (one event per task). Resolves when all were delivered. */
function deliver(frames: EventFrame[], push: (f: EventFrame[]) => void, totalMs: number) {
  return new Promise<void>((resolve) => {
    const start = performance.now();
    let sent = 0;
    const channel = new MessageChannel();
    const tick = () => {
      const due =
        totalMs > 0
          ? Math.min(
              frames.length,
              Math.ceil(((performance.now() - start) / totalMs) * frames.length),
            )
          : sent + 1;
      if (due > sent) {
        push(frames.slice(sent, due));
        sent = due;
      }
      if (sent >= frames.length) resolve();
      else if (totalMs > 0) setTimeout(tick, 1);
      else channel.port2.postMessage(null);
    };
    channel.port1.onmessage = tick;
    tick();
  });
}

export function BenchPage() {
  const [view, setView] = useState<ViewModel>(emptyView);
  const [frames, setFrames] = useState<EventFrame[]>([]);
  const [at, setAt] = useState<number | null>(null);
  const [tab, setTab] = useState<"execution" | "tree">("execution");
  const [mounted, setMounted] = useState(true);
  const timeline = useTimeline(frames);
  const current = useRef(timeline);
  current.current = timeline;
  const shown = useMemo(() => (at == null ? view : timeline.at(at)), [at, view, timeline]);

  const api = useRef({
    /** A turn of `events` events streamed over `overMs` (0: a burst); `render` false is the
     * baseline: the same delivery and fold with no React render. */
    async live(events: number, overMs: number, render: boolean, panel: "execution" | "tree") {
      const turn = oneTurn(events).frames;
      flushSync(() => {
        setMounted(render);
        setTab(panel);
        setAt(null);
        setView(emptyView());
        setFrames([]);
      });
      await nextPaint();
      let model = emptyView();
      const batches = frameBatcher((batch) => {
        if (render) {
          setView((v) => fold(v, batch));
          setFrames((all) => all.concat(batch));
        } else model = fold(model, batch);
      });
      const stamps: number[] = [];
      let running = true;
      const loop = (t: number) => {
        stamps.push(t);
        if (running) requestAnimationFrame(loop);
      };
      requestAnimationFrame(loop);
      const start = performance.now();
      await deliver(turn, (f) => batches.push(f), overMs);
      await nextPaint(); // the last batch folded and painted
      await nextPaint();
      running = false;
      const wall = performance.now() - start;
      const got = render ? turn.length : model.events;
      const frames_ms = stamps.slice(1).map((t, i) => t - (stamps[i] ?? t));
      return { frames_ms, wall_ms: wall, events: got } satisfies LiveResult;
    },
    /** Time travel over a session of `events` events: for each step, the slider's change to
     * the painted frame (`render`), or the fold alone (the baseline). */
    async travel(events: number, steps: number[], render: boolean, settle = true) {
      const log = bigSession(events).frames;
      flushSync(() => {
        setMounted(true);
        setTab("execution");
        setAt(null);
        setFrames(log);
        setView(fold(emptyView(), log));
      });
      await nextPaint();
      // a reader scrubs after the page settled: the checkpoints are made in idle time
      while (settle && render && !current.current.warm)
        await new Promise<void>((resolve) => requestIdleCallback(() => resolve()));
      const out: number[] = [];
      const commits: number[] = [];
      for (const step of steps) {
        const seq = log[Math.min(log.length - 1, Math.max(0, step))]?.seq ?? 1;
        const t0 = performance.now();
        if (render) {
          flushSync(() => setAt(seq));
          commits.push(performance.now() - t0);
          await nextPaint();
        } else viewAt(log, seq);
        out.push(performance.now() - t0);
        if (render) {
          flushSync(() => setAt(null));
          await nextPaint();
        }
      }
      return { samples_ms: out, commit_ms: commits, events: log.length };
    },
  });
  (window as unknown as { fleetBench: unknown }).fleetBench = api.current;

  if (!mounted) return <p data-testid="bench-baseline">baseline: fold only, no render</p>;
  return (
    <div className="flex h-screen">
      <section className="flex min-w-0 flex-1 flex-col">
        <TimeTravel frames={frames} at={at} onChange={setAt} />
        <div className="flex-1 overflow-auto">
          <Transcript view={shown} />
        </div>
      </section>
      <aside className="flex w-[36rem] flex-col border-l border-slate-700">
        <BudgetBar view={shown} />
        <div className="flex-1 overflow-auto">
          {tab === "execution" ? <ExecutionPanel view={shown} /> : <TraceTree view={shown} />}
        </div>
      </aside>
    </div>
  );
}
