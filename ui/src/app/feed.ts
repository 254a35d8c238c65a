// Frames arrive one socket message at a time; the screen folds them once per animation frame,
// so a fast turn costs one render per frame, not one per event. Shared by the live session and
// the in-browser benchmark, so the benchmark measures what a user gets.
import type { EventFrame } from "../model/frames";

export interface Batcher {
  push(frames: readonly EventFrame[]): void;
  cancel(): void;
}

export function frameBatcher(apply: (batch: EventFrame[]) => void): Batcher {
  let pending: EventFrame[] = [];
  let scheduled = 0;
  const flush = () => {
    scheduled = 0;
    const batch = pending;
    pending = [];
    apply(batch);
  };
  return {
    push(frames) {
      pending.push(...frames);
      if (!scheduled) scheduled = requestAnimationFrame(flush);
    },
    cancel() {
      if (scheduled) cancelAnimationFrame(scheduled);
      scheduled = 0;
      pending = [];
    },
  };
}
