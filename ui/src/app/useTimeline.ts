// The session's time-travel source: one Timeline that keeps its checkpoints while live frames
// are appended (model/timeline.ts).
import { useMemo, useRef } from "react";
import type { EventFrame } from "../model/frames";
import { Timeline } from "../model/timeline";

export function useTimeline(frames: readonly EventFrame[]): Timeline {
  const last = useRef<Timeline>(Timeline.of([]));
  return useMemo(() => {
    last.current = last.current.extend(frames);
    return last.current;
  }, [frames]);
}
