import { useNavigate } from "@tanstack/react-router";
import { useState } from "react";
import { Api } from "../api/http";
import { useAuth } from "./auth";
import { ErrorText } from "./ErrorText";

export function Login() {
  const { signIn } = useAuth();
  const navigate = useNavigate();
  const [token, setToken] = useState("");
  const [error, setError] = useState<unknown>(null);
  const [busy, setBusy] = useState(false);
  return (
    <main className="mx-auto mt-24 max-w-lg p-6">
      <h1 className="mb-4 text-2xl font-semibold">fleet-rlm</h1>
      <form
        className="flex flex-col gap-3"
        onSubmit={async (e) => {
          e.preventDefault();
          setBusy(true);
          setError(null);
          try {
            await new Api(token.trim()).me();
            signIn(token.trim());
            await navigate({ to: "/workspace" });
          } catch (err) {
            setError(err);
          } finally {
            setBusy(false);
          }
        }}
      >
        <label htmlFor="token" className="text-slate-200">
          Development token (printed by <code>./scripts/run</code>)
        </label>
        <input
          id="token"
          type="password"
          autoComplete="off"
          className="rounded border border-slate-600 bg-slate-900 p-2"
          value={token}
          onChange={(e) => setToken(e.target.value)}
        />
        <button
          type="submit"
          disabled={!token.trim() || busy}
          className="rounded bg-sky-700 px-3 py-2 font-medium text-white disabled:bg-slate-700"
        >
          Sign in
        </button>
        <ErrorText error={error} />
      </form>
    </main>
  );
}
