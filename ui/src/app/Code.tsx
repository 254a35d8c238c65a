// A code cell's source: plain text at once, Shiki's colours once its chunk has loaded. Code not
// highlighted before is highlighted after the frame that shows it (an idle callback), so a
// turn streaming many new cells never spends its frame budget on colours.
import { useEffect, useState } from "react";

interface Highlighter {
  highlightPython: (code: string) => string;
  peekPython: (code: string) => string | undefined;
}
let loaded: Highlighter | null = null;
let loading: Promise<Highlighter> | null = null;

function load(): Promise<Highlighter> {
  loading ??= import("./highlight").then((m) => {
    loaded = m;
    return m;
  });
  return loading;
}

// One queue, drained in idle time while the idle period lasts, so highlighting many new cells
// never runs into the next frame (one cell's colours are a few milliseconds).
const queue = new Set<() => void>();
let draining = false;
function drain(deadline?: IdleDeadline) {
  // while the idle period lasts; one job only when called without one or past its timeout
  let done = 0;
  for (const job of queue) {
    if (done && (!deadline || deadline.didTimeout || deadline.timeRemaining() < 4)) break;
    queue.delete(job);
    job();
    done += 1;
  }
  draining = queue.size > 0;
  if (draining) schedule();
}
function schedule() {
  if (typeof requestIdleCallback === "function") requestIdleCallback(drain, { timeout: 1000 });
  else window.setTimeout(() => drain(), 16);
}
function idle(job: () => void): () => void {
  queue.add(job);
  if (!draining) {
    draining = true;
    schedule();
  }
  return () => queue.delete(job);
}

export function Code({ code }: { code: string }) {
  const [html, setHtml] = useState<string | null>(() => loaded?.peekPython(code) ?? null);
  useEffect(() => {
    const ready = loaded?.peekPython(code);
    if (ready !== undefined) {
      setHtml(ready);
      return;
    }
    let live = true;
    let cancel = () => {};
    load().then(
      (h) => {
        if (live) cancel = idle(() => setHtml(h.highlightPython(code)));
      },
      () => {}, // plain text stays: highlighting is a nicety, never a failure
    );
    return () => {
      live = false;
      cancel();
    };
  }, [code]);
  if (html == null)
    return <pre className="max-h-48 overflow-auto p-2 text-sm text-emerald-200">{code}</pre>;
  return (
    <div
      className="shiki-cell max-h-48 overflow-auto text-sm [&_pre]:p-2"
      data-highlighted="python"
      // biome-ignore lint/security/noDangerouslySetInnerHtml: Shiki's output escapes the source
      dangerouslySetInnerHTML={{ __html: html }}
    />
  );
}
