// Time travel with checkpoints: the view after every `every` frames is kept (the fold shares
// every entity a batch did not touch, so a checkpoint costs what changed since the one
// before), and a step folds from the nearest checkpoint at or before it. Equal to `viewAt` at
// every sequence (tested); a jump costs at most `every` frames of fold once the checkpoints up
// to it exist, and they are made on first need. The live feed only appends frames, so a
// timeline over a longer feed keeps the checkpoints of the shorter one.
import { fold } from "./fold";
import type { EventFrame } from "./frames";
import { emptyView, type ViewModel } from "./view";

export class Timeline {
  private constructor(
    readonly frames: readonly EventFrame[],
    private readonly every: number,
    private readonly marks: ViewModel[],
  ) {}

  static of(frames: readonly EventFrame[], every = 500): Timeline {
    return new Timeline(frames, every, []);
  }

  /** This timeline's checkpoints over `frames` when they extend its own, else a fresh one. */
  extend(frames: readonly EventFrame[]): Timeline {
    if (frames === this.frames) return this;
    const n = this.frames.length;
    const extendsMine = frames.length >= n && (n === 0 || frames[n - 1] === this.frames[n - 1]);
    return new Timeline(frames, this.every, extendsMine ? this.marks : []);
  }

  /** How many frames are at or below `seq` (frames are in stream order). */
  private count(seq: number): number {
    let lo = 0;
    let hi = this.frames.length;
    while (lo < hi) {
      const mid = (lo + hi) >> 1;
      if ((this.frames[mid]?.seq ?? 0) <= seq) lo = mid + 1;
      else hi = mid;
    }
    return lo;
  }

  private mark(k: number): ViewModel {
    // marks[i] = the view after the first (i + 1) * every frames
    while (this.marks.length < k) {
      const i = this.marks.length;
      const from = this.marks[i - 1] ?? emptyView();
      this.marks.push(fold(from, this.frames.slice(i * this.every, (i + 1) * this.every)));
    }
    return k === 0 ? emptyView() : (this.marks[k - 1] as ViewModel);
  }

  /** Every checkpoint the frames so far call for is made. */
  get warm(): boolean {
    return this.marks.length >= Math.floor(this.frames.length / this.every);
  }

  /** Makes the next missing checkpoint, if any: true while more are missing. Run in idle time,
   * so the first jump far into a long log finds its checkpoints made. */
  warmStep(): boolean {
    const want = Math.floor(this.frames.length / this.every);
    if (this.marks.length < want) this.mark(this.marks.length + 1);
    return this.marks.length < want;
  }

  at(seq: number): ViewModel {
    const n = this.count(seq);
    const k = Math.floor(n / this.every);
    return fold(this.mark(k), this.frames.slice(k * this.every, n));
  }
}
