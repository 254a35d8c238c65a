import { ApiError } from "../api/http";

interface Problem {
  field?: string;
  where?: string;
  problem?: string;
  value?: unknown;
}

/** The gateway's validation problems (`details.problems`), one per field. */
export function problemsOf(error: unknown): Problem[] {
  if (!(error instanceof ApiError)) return [];
  const list = error.details.problems;
  return Array.isArray(list) ? (list as Problem[]) : [];
}

/** A gateway error said plainly: its code, its message, what it was about. */
export function ErrorText({ error }: { error: unknown }) {
  if (!error) return null;
  const text =
    error instanceof ApiError
      ? `${error.code}${error.status ? ` (HTTP ${error.status})` : ""}: ${error.message}`
      : error instanceof Error
        ? error.message
        : String(error);
  const problems = problemsOf(error);
  return (
    <div role="alert" className="rounded border border-red-700 bg-red-950 p-2 text-red-200">
      <p>{text}</p>
      {problems.length > 1 ? (
        <ul className="mt-1 list-disc pl-5 text-sm">
          {problems.map((p, i) => (
            // biome-ignore lint/suspicious/noArrayIndexKey: problems have no id and never reorder
            <li key={i}>
              {p.field ?? p.where}: {p.problem}
              {p.value !== undefined ? ` (got ${JSON.stringify(p.value)})` : ""}
            </li>
          ))}
        </ul>
      ) : null}
    </div>
  );
}
