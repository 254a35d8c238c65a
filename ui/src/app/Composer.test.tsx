// @vitest-environment jsdom
import { act, cleanup, fireEvent, render, screen } from "@testing-library/react";
import { afterEach, describe, expect, it } from "vitest";
import { Composer, extrasOf, type MessageExtras } from "./Composer";

afterEach(cleanup);

describe("composer", () => {
  it("sends the uploaded document's alias, the context paths and the repository once", async () => {
    const sent: [string, string, MessageExtras][] = [];
    const progress: number[] = [];
    render(
      <Composer
        busy={false}
        onCancel={() => {}}
        onSend={(c, m, x) => sent.push([c, m, x])}
        upload={async (_file, onProgress) => {
          onProgress(50, 100);
          progress.push(50);
          return { alias: "notes", size: 100, chars: 100, seq: 3 };
        }}
      />,
    );
    const file = new File(["x".repeat(100)], "notes.txt", { type: "text/plain" });
    await act(async () => {
      fireEvent.change(screen.getByLabelText("Attach document"), { target: { files: [file] } });
    });
    expect(progress).toEqual([50]);
    expect(screen.getByTestId("uploaded").textContent).toMatch(
      /attached “notes” \(100 characters\)/,
    );
    fireEvent.change(screen.getByLabelText("Context paths"), {
      target: { value: "src/a.py\n, docs/b.md" },
    });
    fireEvent.change(screen.getByLabelText("Execution mode"), { target: { value: "rlm_only" } });
    fireEvent.change(screen.getByLabelText("Message"), { target: { value: "  read them  " } });
    fireEvent.click(screen.getByRole("button", { name: "Send" }));
    expect(sent).toEqual([
      [
        "read them",
        "rlm_only",
        { document_ids: ["notes"], context_paths: ["src/a.py", "docs/b.md"] },
      ],
    ]);
    // the document went with that message; the next one carries only the paths
    fireEvent.change(screen.getByLabelText("Message"), { target: { value: "again" } });
    fireEvent.keyDown(screen.getByLabelText("Message"), { key: "Enter", ctrlKey: true });
    expect(sent[1]?.[2]).toEqual({ context_paths: ["src/a.py", "docs/b.md"] });
  });

  it("shows a refused upload's code and sends nothing empty", async () => {
    const { ApiError } = await import("../api/http");
    const sent: unknown[] = [];
    render(
      <Composer
        busy
        onCancel={() => sent.push("cancel")}
        onSend={(...a) => sent.push(a)}
        upload={async () => {
          throw new ApiError(413, "payload_too_large", "notes.txt is 9 MiB, over 8 MiB");
        }}
      />,
    );
    await act(async () => {
      fireEvent.change(screen.getByLabelText("Attach document"), {
        target: { files: [new File(["x"], "notes.txt")] },
      });
    });
    expect(screen.getByRole("alert").textContent).toBe(
      "payload_too_large (HTTP 413): notes.txt is 9 MiB, over 8 MiB",
    );
    fireEvent.click(screen.getByRole("button", { name: "Send" }));
    fireEvent.click(screen.getByRole("button", { name: "Cancel turn" }));
    expect(sent).toEqual(["cancel"]);
    expect(extrasOf([], " ,\n", " ", "")).toEqual({});
  });
});
