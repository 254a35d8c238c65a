import { ApiError } from "../api/http";

/** A gateway error said plainly: its code, its message, what it was about. */
export function ErrorText({ error }: { error: unknown }) {
  if (!error) return null;
  const text =
    error instanceof ApiError
      ? `${error.code}${error.status ? ` (HTTP ${error.status})` : ""}: ${error.message}`
      : error instanceof Error
        ? error.message
        : String(error);
  return (
    <p role="alert" className="rounded border border-red-700 bg-red-950 p-2 text-red-200">
      {text}
    </p>
  );
}
