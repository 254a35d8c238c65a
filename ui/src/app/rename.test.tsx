// @vitest-environment jsdom
// Renaming a session on the Sessions screen shows the new title at once, even while the
// replica's read model has not folded the rename yet (a plain refetch would still answer the
// old title): the detail reads the rename back at the sequence the PATCH answered.
import { QueryClient, QueryClientProvider } from "@tanstack/react-query";
import { cleanup, fireEvent, render, screen } from "@testing-library/react";
import type { ReactNode } from "react";
import { afterEach, expect, it, vi } from "vitest";
import type { Api } from "../api/http";
import { Detail } from "./SessionsPage";

vi.mock("@tanstack/react-router", () => ({
  useNavigate: () => () => undefined,
  Link: ({ children }: { children: ReactNode }) => <a href="/">{children}</a>,
}));

afterEach(cleanup);

const RENAME_SEQ = 9;

/** A gateway whose read model lags: only a read at the rename's sequence sees the new title. */
function laggingApi(): { api: Api; reads: (number | undefined)[] } {
  const reads: (number | undefined)[] = [];
  const api = {
    session: async (id: string, minSeq?: number) => {
      reads.push(minSeq);
      return {
        id,
        title: minSeq !== undefined && minSeq >= RENAME_SEQ ? "Six times seven" : "",
        turn_count: 1,
        updated_at: "2026-12-01T12:00:00Z",
        last_seq: minSeq ?? 8,
      };
    },
    renameSession: async () => ({ seq: RENAME_SEQ }),
    audit: async () => ({
      session_id: "s1",
      ok: true,
      checked: 3,
      signatures: false,
      require_signatures: false,
      fault: null,
    }),
    turns: async () => ({ items: [], next_cursor: null }),
  } as unknown as Api;
  return { api, reads };
}

it("shows the new title after a rename, read back at the rename's sequence", async () => {
  const { api, reads } = laggingApi();
  const client = new QueryClient({ defaultOptions: { queries: { retry: false } } });
  render(
    <QueryClientProvider client={client}>
      <Detail api={api} id="s1" />
    </QueryClientProvider>,
  );
  await screen.findByRole("heading", { name: "s1" });
  fireEvent.change(screen.getByLabelText("Title", { exact: true }), {
    target: { value: "Six times seven" },
  });
  fireEvent.click(screen.getByRole("button", { name: "Rename" }));
  expect(await screen.findByRole("heading", { name: "Six times seven" })).toBeTruthy();
  expect(reads).toContain(RENAME_SEQ);
});
