// The session's time-travel source: one Timeline that keeps its checkpoints while live frames
// are appended (model/timeline.ts), and makes the missing ones in idle time, one per idle
// slice, so a first jump far into a long log does not fold it all.
import { useEffect, useMemo, useRef } from "react";
import type { EventFrame } from "../model/frames";
import { Timeline } from "../model/timeline";

const idle: (fn: () => void) => number =
  typeof requestIdleCallback === "function"
    ? (fn) => requestIdleCallback(fn, { timeout: 2000 })
    : (fn) => window.setTimeout(fn, 50);
const cancel: (id: number) => void =
  typeof cancelIdleCallback === "function" ? cancelIdleCallback : window.clearTimeout;

export function useTimeline(frames: readonly EventFrame[]): Timeline {
  const last = useRef<Timeline>(Timeline.of([]));
  const timeline = useMemo(() => {
    last.current = last.current.extend(frames);
    return last.current;
  }, [frames]);
  useEffect(() => {
    let id = 0;
    const step = () => {
      if (timeline.warmStep()) id = idle(step);
    };
    id = idle(step);
    return () => cancel(id);
  }, [timeline]);
  return timeline;
}
