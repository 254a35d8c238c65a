// One pure fold from the session's event frames to what the screens show. The live view folds
// every frame as it arrives; the time-travel view folds the same frames up to a chosen
// sequence. Both call `fold`, so what the slider shows is what the live screen showed then.
export type TurnStatus =
  | "requested"
  | "running"
  | "parked"
  | "completed"
  | "failed"
  | "cancelled"
  | "refused";

export interface Turn {
  id: string;
  message: string;
  mode: string;
  status: TurnStatus;
  answer: string;
  /** Streamed answer text not yet superseded by `turn.completed` (never part of time travel). */
  streaming: string;
  /** The call that streamed `streaming` was stored: the next answer delta starts afresh (a
   * turn whose first module's answer is superseded by a later call's shows only the latest). */
  streamSealed: boolean;
  error: string;
  /** Set when a lower module answered after the first failed: who answered, who failed, why. */
  fallback: string;
  /** A model call waits for the embedded model to come up: what it does, how long it needs
   * (a `model_waiting` delta; live only, ended by the next call sent or the turn's end). */
  waiting: string;
  seq: number;
  rootRun: string | null;
}

export type RunStatus = "running" | "completed" | "failed" | "cancelled";

export interface Cell {
  key: string;
  run: string;
  iteration: number | null;
  code: string;
  stdout: string;
  error: string;
  durationMs: number;
  final: unknown;
  seq: number;
}

export interface LlmCall {
  key: string;
  run: string;
  role: string;
  model: string;
  promptTokens: number;
  completionTokens: number;
  cost: number;
  latencyMs: number;
  error: string;
  cached: boolean;
  /** The prompt as sent, one entry a message; null when the record keeps it in the object
   * store (a prompt over the inline limit): the trace export has it whole. */
  prompt: { role: string; content: string }[] | null;
  /** The reply's text; null when offloaded like the prompt. */
  reply: string | null;
  /** The budget grant it was made under: ends the in-flight call its announcement named. */
  grant: string;
  seq: number;
}

/** A granted call announced (`llm_call_started` delta) whose `run.llm_called` is not in yet. */
export interface InFlightCall {
  grant: string;
  role: string;
  model: string;
}

export interface ToolCall {
  callId: string;
  run: string;
  tool: string;
  args: unknown;
  result: unknown;
  error: string;
  done: boolean;
  seq: number;
}

export interface Iteration {
  index: number;
  /** The sequence of its first event (its plan, a cell or a call): where it sits in time. */
  seq: number;
  reasoning: string;
  code: string;
  tool: string;
  cells: string[];
  llmCalls: string[];
}

export interface RunNode {
  id: string;
  parent: string | null;
  turn: string | null;
  tree: string;
  kind: string;
  depth: number;
  task: string;
  status: RunStatus;
  answer: string;
  error: string;
  iterations: Iteration[];
  /** Cells and LLM calls that name no iteration hang off the run itself. */
  cells: string[];
  llmCalls: string[];
  children: string[];
  maxLlmCalls: number;
  liveStdout: string;
  /** Calls sent and not yet answered (live only: time travel never shows one). */
  inFlight: InFlightCall[];
  seq: number;
}

export interface Budget {
  tree: string;
  maxLlmCalls: number;
  maxDepth: number;
  maxTokens: number | null;
  maxCost: number | null;
  callsUsed: number;
  tokensUsed: number;
  costUsed: number;
}

export interface PendingInput {
  requestId: string;
  turn: string | null;
  question: string;
  options: string[];
}

export interface ViewModel {
  /** The last sequence folded: a frame at or below it is a duplicate and changes nothing. */
  seq: number;
  events: number;
  session: { id: string | null; title: string; deleted: boolean };
  turns: Turn[];
  runs: Record<string, RunNode>;
  runOrder: string[];
  cells: Record<string, Cell>;
  cellOrder: string[];
  llmCalls: Record<string, LlmCall>;
  llmOrder: string[];
  tools: Record<string, ToolCall>;
  budgets: Record<string, Budget>;
  pendingInput: PendingInput | null;
  notices: { seq: number; kind: string; text: string }[];
  /** Calls announced for runs whose `run.started` has not been folded yet: deltas go over core
   * NATS and can outrun the log, so a run's first call is often announced before its run is
   * known. Moved into the run's `inFlight` when it starts; live only, never in the log. */
  early: Record<string, InFlightCall[]>;
}

/** Runs whose early announcements are held at most (the oldest are dropped past it). */
export const EARLY_RUNS = 32;

export function emptyView(): ViewModel {
  return {
    seq: 0,
    events: 0,
    session: { id: null, title: "", deleted: false },
    turns: [],
    runs: {},
    runOrder: [],
    cells: {},
    cellOrder: [],
    llmCalls: {},
    llmOrder: [],
    tools: {},
    budgets: {},
    pendingInput: null,
    notices: [],
    early: {},
  };
}
