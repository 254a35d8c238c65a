import { describe, expect, it } from "vitest";
import { Api, ApiError, type Uploader } from "./http";

/** The ApiError a call fails with (a call that succeeds fails the test). */
function failed(call: Promise<unknown>): Promise<ApiError> {
  return call.then(
    () => {
      throw new Error("expected the call to fail");
    },
    (e: unknown) => {
      if (!(e instanceof ApiError)) throw e;
      return e;
    },
  );
}

function answering(status: number, body: unknown): typeof fetch {
  return async () =>
    new Response(typeof body === "string" ? body : JSON.stringify(body), { status });
}

describe("Api", () => {
  it("keeps the gateway's code, message and validation problems", async () => {
    const api = new Api(
      "t",
      answering(422, {
        code: "invalid_request",
        message: "model: must not be empty",
        details: { problems: [{ field: "model", problem: "must not be empty", value: "" }] },
      }),
    );
    const error = await failed(api.createProfile({ name: "x", model: "" }));
    expect([error.status, error.code, error.message]).toEqual([
      422,
      "invalid_request",
      "model: must not be empty",
    ]);
    expect(error.details.problems).toEqual([
      { field: "model", problem: "must not be empty", value: "" },
    ]);
  });

  it("says plainly when the gateway has no such route yet", async () => {
    const api = new Api("t", answering(404, { code: "route_not_found", message: "GET /x" }));
    const error = await failed(api.volumeTree("vol", ""));
    expect(error.code).toBe("route_not_found");
    expect(error.message).toMatch(/no such route yet/);
  });

  it("names an unreachable gateway and a body that is not JSON", async () => {
    const down = new Api("t", async () => {
      throw new TypeError("Failed to fetch");
    });
    expect((await failed(down.audit("s"))).code).toBe("gateway_unreachable");
    const html = new Api("t", answering(502, "<html>bad gateway</html>"));
    const error = await failed(html.audit("s"));
    expect([error.code, error.message]).toEqual(["http_502", "<html>bad gateway</html>"]);
  });

  it("sends the export verbatim to import, as JSON lines", async () => {
    let sent: RequestInit | undefined;
    const api = new Api("tok", async (_url, init) => {
      sent = init;
      return new Response(JSON.stringify({ session_id: "n", events: 2 }), { status: 201 });
    });
    const done = await api.importSession('{"a":1}\n{"b":2}\n');
    expect(done.session_id).toBe("n");
    expect(sent?.body).toBe('{"a":1}\n{"b":2}\n');
    const headers = (sent?.headers ?? {}) as Record<string, string>;
    expect(headers["content-type"]).toBe("application/x-ndjson");
  });

  it("uploads a document as multipart, reports progress and keeps a refusal's code", async () => {
    const seen: number[] = [];
    const ok: Uploader = async (url, token, body, onProgress) => {
      expect(url).toBe("/api/v1/sessions/s1/documents");
      expect(token).toBe("tok");
      expect((body.get("file") as File).name).toBe("notes.txt");
      onProgress(5, 10);
      onProgress(10, 10);
      return { status: 201, text: JSON.stringify({ alias: "notes", size: 10, chars: 10, seq: 4 }) };
    };
    const file = new File(["0123456789"], "notes.txt", { type: "text/plain" });
    const api = new Api("tok");
    const done = await api.uploadDocument("s1", file, (l) => seen.push(l), ok);
    expect(done.alias).toBe("notes");
    expect(seen).toEqual([5, 10]);
    const refused: Uploader = async () => ({
      status: 415,
      text: JSON.stringify({ code: "unsupported_document", message: "notes.bin is not text" }),
    });
    const error = await failed(api.uploadDocument("s1", file, () => {}, refused));
    expect([error.status, error.code]).toEqual([415, "unsupported_document"]);
    const broken: Uploader = async () => {
      throw new Error("reset");
    };
    expect((await failed(api.uploadDocument("s1", file, () => {}, broken))).code).toBe(
      "upload_failed",
    );
  });
});
