// The browser tests, against one real mesh (ui/e2e/run: `fleet up` with the chat runner and
// the FAKE scripted LM in e2e/scripted_lm.py), in Debian's headless chromium driven by
// playwright-core (no browser download). One page walks the scenarios in order; each writes a
// screenshot named after it to the output dir (a failed one `<name>-FAILED.png`), and the
// process exits 1 if any failed. Usage: node e2e/browser.mjs <url> <token> <out dir> <lm url>
import { mkdirSync, readFileSync, writeFileSync } from "node:fs";
import { chromium } from "playwright-core";

const [url, token, out = "e2e-out", lmUrl = ""] = process.argv.slice(2);
if (!url || !token) {
  console.error("usage: node e2e/browser.mjs <gateway url> <token> [out dir] [scripted LM url]");
  process.exit(2);
}
mkdirSync(out, { recursive: true });
// Up to three starts of 60 s each: one slow start on a loaded machine is not a UI failure,
// three are (the last error is thrown as it is).
async function launch(attempt = 1) {
  try {
    return await chromium.launch({ ...launchOptions, timeout: 60_000 });
  } catch (e) {
    if (attempt >= 3) throw e;
    console.error(`chromium did not start (attempt ${attempt} of 3): ${String(e).split("\n")[0]}`);
    return launch(attempt + 1);
  }
}
const launchOptions = {
  executablePath: process.env.CHROMIUM ?? "/usr/bin/chromium",
  args: [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
  ],
};
const browser = await launch();
const context = await browser.newContext({
  viewport: { width: 1440, height: 900 },
  acceptDownloads: true,
});
const page = await context.newPage();
const problems = [];
page.on("pageerror", (e) => problems.push(`page error: ${e.message}`));
page.on("console", (m) => {
  // a refused request (a 4xx the screen shows as an error) is logged by the browser too
  if (m.type() === "error" && !/Failed to load resource/.test(m.text()))
    problems.push(`console: ${m.text()}`);
});
// Every execution socket goes through here, so a test can drop one mid-turn.
// What the server sent is kept (the streaming test reads the delta frames), and forwarded.
const sockets = [];
const received = [];
await page.routeWebSocket(/\/api\/v1\/ws\/execution/, (ws) => {
  const server = ws.connectToServer();
  server.onMessage((message) => {
    try {
      received.push(JSON.parse(String(message)));
    } catch {
      // not JSON: the page's own check says so
    }
    ws.send(message);
  });
  sockets.push(ws);
});

const T = { turn: 90_000, ui: 15_000 };
const results = [];
let shot = 0;
function check(ok, message) {
  if (!ok) throw new Error(message);
}
async function scenario(name, fn) {
  shot += 1;
  const file = `${String(shot).padStart(2, "0")}-${name}`;
  const started = performance.now();
  try {
    await fn();
    await page.screenshot({ path: `${out}/${file}.png` });
    results.push({ name, ok: true, s: (performance.now() - started) / 1000, file: `${file}.png` });
  } catch (error) {
    await page.screenshot({ path: `${out}/${file}-FAILED.png` }).catch(() => {});
    results.push({
      name,
      ok: false,
      s: (performance.now() - started) / 1000,
      error: String(error),
    });
  }
}
const status = () => page.getByTestId("turn-status").last();
async function turnEnds(text = /done|failed|cancelled|refused/) {
  await page
    .getByTestId("turn-status")
    .filter({ hasText: text })
    .last()
    .waitFor({ timeout: T.turn });
}
async function newSession(mode, message) {
  await page.getByRole("link", { name: "Workspace", exact: true }).click();
  await page.getByRole("button", { name: "New session" }).click();
  await page.waitForURL(/\/workspace\/[^/]+$/);
  await page
    .getByTestId("connection")
    .getByText(/^connected/)
    .waitFor({ timeout: T.ui });
  await page.getByLabel("Execution mode").selectOption(mode);
  if (message) {
    await page.getByLabel("Message").fill(message);
    await page.getByRole("button", { name: "Send" }).click();
  }
  return page.url().split("/").pop().split("?")[0];
}
const cellKeys = () =>
  page.locator("[data-cell]").evaluateAll((els) => els.map((e) => e.dataset.cell));

// WCAG AA: every element holding text, against the first opaque background behind it, at least
// 4.5:1 (3:1 for large text: 24 px, or 18.66 px bold). Returns what falls short.
const contrastProblems = () =>
  page.evaluate(() => {
    // any CSS colour (Tailwind 4 writes oklch) to [r, g, b, a] through a 1×1 canvas
    const ctx = document.createElement("canvas").getContext("2d", { willReadFrequently: true });
    const rgb = (c) => {
      ctx.clearRect(0, 0, 1, 1);
      ctx.fillStyle = "#000";
      ctx.fillStyle = c;
      ctx.fillRect(0, 0, 1, 1);
      const [r, g, b, a] = ctx.getImageData(0, 0, 1, 1).data;
      return [r, g, b, a / 255];
    };
    const lum = ([r, g, b]) => {
      const f = (v) => (v / 255 <= 0.03928 ? v / 255 / 12.92 : ((v / 255 + 0.055) / 1.055) ** 2.4);
      return 0.2126 * f(r) + 0.7152 * f(g) + 0.0722 * f(b);
    };
    const background = (el) => {
      for (let e = el; e; e = e.parentElement) {
        const c = rgb(getComputedStyle(e).backgroundColor);
        if (c[3] > 0.9) return c;
      }
      return rgb(getComputedStyle(document.body).backgroundColor || "#fff");
    };
    const bad = [];
    for (const el of document.querySelectorAll("body *")) {
      const text = [...el.childNodes].some((n) => n.nodeType === 3 && n.textContent.trim());
      const box = el.getBoundingClientRect();
      if (!text || box.width === 0 || el.closest("[aria-hidden=true]")) continue;
      const style = getComputedStyle(el);
      if (style.visibility === "hidden" || Number(style.opacity) === 0) continue;
      const [a, b] = [lum(rgb(style.color)), lum(background(el))];
      const ratio = (Math.max(a, b) + 0.05) / (Math.min(a, b) + 0.05);
      const size = Number.parseFloat(style.fontSize);
      const large = size >= 24 || (size >= 18.66 && Number(style.fontWeight) >= 700);
      if (ratio < (large ? 3 : 4.5))
        bad.push(`${ratio.toFixed(2)}:1 "${el.textContent.trim().slice(0, 40)}" (${style.color})`);
    }
    return bad;
  });

await page.goto(url);
await page.getByLabel(/Development token/).fill(token);
await page.getByRole("button", { name: "Sign in" }).click();
let first = "";

await scenario("cells-stream", async () => {
  first = await newSession("rlm_only", "What is 6 times 7?");
  await page.locator("[data-cell]").first().waitFor({ timeout: T.turn });
  check((await status().textContent()) === "running", "the turn should still be running");
});

await scenario("drop-and-resume-mid-turn", async () => {
  check(sockets.length > 0, "no execution socket was opened");
  await sockets.at(-1).close({ code: 4000, reason: "dropped by the test" });
  await page.getByText(/resumed after sequence \d+/).waitFor({ timeout: T.ui });
  await turnEnds();
  const keys = await cellKeys();
  check(new Set(keys).size === keys.length, `a cell shown twice: ${keys}`);
  check(keys.length >= 3, `expected the turn's cells, saw ${keys.length}`);
  const answer = (await page.locator("[data-turn] p").last().textContent())?.trim();
  check((await status().textContent()) === "done" && answer === "42", `turn answered ${answer}`);
  await page.locator("[data-highlighted=python]").first().waitFor({ timeout: T.ui });
});

await scenario("model-call-prompt-and-reply", async () => {
  const calls = page.getByRole("region", { name: "LLM calls" });
  await calls.getByRole("button", { name: "prompt and reply" }).first().click();
  const exchange = calls.getByTestId("call-exchange").first();
  await exchange.getByTestId("call-reply").waitFor({ timeout: T.ui });
  const text = (await exchange.textContent()) ?? "";
  check(text.includes("What is 6 times 7?"), "the prompt shown is not the call's own");
  check(/\[\[ ## \w+ ## \]\]/.test(text), "the reply shown is not the model's text");
});

await scenario("trace-tree-child-run", async () => {
  await page.getByRole("tab", { name: "Trace tree" }).click();
  const tree = page.getByRole("tree");
  await tree.focus();
  await page.keyboard.press("ArrowDown"); // the chat run
  await page.keyboard.press("ArrowLeft"); // collapse it
  check((await page.getByRole("treeitem").count()) === 2, "collapsing the run hid nothing");
  await page.keyboard.press("ArrowRight");
  const child = page.getByRole("treeitem").filter({ hasText: /depth 1/ });
  await child.click(); // open the child run (a click also folds it)
  await page.keyboard.press("ArrowRight"); // and unfold it: its iterations show
  await page
    .getByRole("treeitem")
    .filter({ hasText: /iteration 2/ })
    .waitFor({ timeout: T.ui });
  const detail = page.getByTestId("run-detail");
  await detail.getByText(/rlm run at depth 1/).waitFor({ timeout: T.ui });
  await detail.getByText("answer: 42").waitFor({ timeout: T.ui });
});

await scenario("time-travel-first-event", async () => {
  await page.getByLabel("Time travel").focus();
  await page.keyboard.press("Home");
  await page.getByText(/#1\//).waitFor({ timeout: T.ui });
  await page.getByRole("tab", { name: "Execution" }).click();
  const early = await page.locator("[data-cell]").count();
  check(early === 0, `time travel to event 1 still shows ${early} cells`);
  await page.getByRole("button", { name: "Back to live" }).click();
});

await scenario("cancel-a-turn", async () => {
  await newSession("rlm_only", "Please count slowly");
  await page
    .getByText(/tick \d+/)
    .first()
    .waitFor({ timeout: T.turn }); // stdout streams live
  await page.getByRole("button", { name: "Cancel turn" }).click();
  await turnEnds(/cancelled/);
});

await scenario("model-call-in-flight", async () => {
  await newSession("auto", "Think slowly: what is the capital of France?");
  // the call is granted and sent, its reply still streaming: shown in flight, not "0 used"
  const budget = page.getByRole("list", { name: "Budget" });
  await budget.getByText(/LLM calls \d+ used · 1 in flight/).waitFor({ timeout: T.turn });
  await page.getByRole("tab", { name: "Trace tree" }).click();
  await page
    .getByRole("treeitem")
    .filter({ hasText: /in flight/ })
    .waitFor({ timeout: T.ui });
});

await scenario("model-call-in-flight-ends", async () => {
  await turnEnds();
  const budget = page.getByRole("list", { name: "Budget" });
  const line = (await budget.textContent()) ?? "";
  check(!line.includes("in flight"), `the budget still says ${line}`);
  const flying = await page
    .getByRole("treeitem")
    .filter({ hasText: /in flight/ })
    .count();
  check(flying === 0, `${flying} calls still shown in flight after the turn ended`);
  await page.getByRole("tab", { name: "Execution" }).click();
});

await scenario("computable-question-not-computed", async () => {
  // a question code computes whose cells fail: an honest failure, no guess in its place
  await newSession("auto", "What is 7 / 0? Fall back if the code fails.");
  await turnEnds();
  const turn = page.locator("[data-turn]").last();
  check((await status().textContent()) === "failed", "the turn should have failed");
  const error = (await turn.getByRole("alert").textContent()) ?? "";
  check(/^not_computed: .*ZeroDivisionError.*no guess/.test(error), `the turn said ${error}`);
});

await scenario("fallback-named-beside-the-answer", async () => {
  await newSession("auto", "What will the weather be tomorrow? Answer even if the tools fail.");
  await turnEnds();
  const turn = page.locator("[data-turn]").last();
  const line = (await turn.getByTestId("turn-fallback").textContent()) ?? "";
  check(
    /^answered by chain of thought after ReAct \(the tools\) failed: /.test(line.trim()),
    `the fallback line reads ${JSON.stringify(line)}`,
  );
  const answer = (await turn.locator("p").last().textContent())?.trim();
  check(answer === "sunny, I think", `the fallback answered ${answer}`);
});

await scenario("answer-a-clarification", async () => {
  await newSession("auto", "Deploy the code to production");
  const asks = page.getByRole("region", { name: "The agent asks" });
  await asks.getByText("Which region?").waitFor({ timeout: T.turn });
  check(await asks.getByRole("button", { name: "eu" }).isVisible(), "the options are not shown");
  const before = received.length;
  await page.getByLabel("Your answer").fill("eu please");
  await page.getByRole("button", { name: "Answer" }).click();
  await turnEnds();
  const answer = (await page.locator("[data-turn] p").last().textContent())?.trim();
  check(answer === "deploying to eu", `the resumed turn answered ${answer}`);
  // the answer came as assistant_token deltas before the stored turn.completed
  const after = received.slice(before);
  const tokens = after.filter((f) => f.type === "delta" && f.kind === "assistant_token");
  const done = after.findIndex(
    (f) => f.type === "event" && f.event?.data?.type === "turn.completed",
  );
  check(tokens.length > 0, "no assistant_token delta reached the page");
  check(
    tokens.map((f) => f.text).join("") === "deploying to eu",
    "the deltas do not join to the answer",
  );
  check(after.indexOf(tokens[0]) < done, "the first delta came after turn.completed");
});

await scenario("upload-a-document", async () => {
  const text = "Quarterly notes: revenue up 4%.\n".repeat(2000);
  await page.getByLabel("Attach document").setInputFiles({
    name: "notes.txt",
    mimeType: "text/plain",
    buffer: Buffer.from(text),
  });
  await page
    .getByTestId("uploaded")
    .getByText(/attached “notes.*” \(\d+ characters\)/)
    .waitFor({ timeout: T.ui });
  // it goes with the next message (document_ids), listed until then
  await page
    .getByRole("list", { name: "Documents for the next message" })
    .getByText(/notes/)
    .waitFor({ timeout: T.ui });
});

await scenario("document-sent-with-a-turn", async () => {
  await newSession("auto", "hello");
  await turnEnds();
  await page.getByLabel("Attach document").setInputFiles({
    name: "minutes.txt",
    mimeType: "text/plain",
    buffer: Buffer.from("Minutes of Tuesday.\nthe launch code is ZEBRA-4417.\n"),
  });
  const pending = page.getByRole("list", { name: "Documents for the next message" });
  await pending.getByText(/minutes/).waitFor({ timeout: T.ui });
  await page.getByLabel("Message", { exact: true }).fill("What is the launch code?");
  await page.getByRole("button", { name: "Send" }).click();
  await page.waitForFunction(
    () => {
      const all = document.querySelectorAll("[data-testid=turn-status]");
      return all.length === 2 && /done|failed|cancelled|refused/.test(all[1].textContent);
    },
    null,
    { timeout: T.turn },
  );
  // the scripted LM answers with the code only when the document's text is in its prompt
  const answer = (await page.locator("[data-turn] p").last().textContent())?.trim();
  check(answer === "ZEBRA-4417, per the minutes", `the turn answered ${answer}`);
  check((await pending.count()) === 0, "the sent document is still listed for the next message");
});

await scenario("restore-and-scrub", async () => {
  await page.getByRole("link", { name: "Sessions", exact: true }).click();
  // search by an id prefix: that session alone is listed
  await page.getByLabel("Search by title or id").fill(first.slice(0, 10));
  const listed = page.getByRole("navigation", { name: "All sessions" }).getByRole("listitem");
  await listed
    .filter({ hasText: first.slice(0, 10) })
    .first()
    .waitFor({ timeout: T.ui });
  await page.waitForFunction(
    () => document.querySelectorAll('nav[aria-label="All sessions"] li').length === 1,
    null,
    { timeout: T.ui },
  );
  await page.getByRole("button", { name: new RegExp(first) }).click();
  await page
    .getByTestId("audit-badge")
    .getByText(/verified: \d+ events/)
    .waitFor({ timeout: T.ui });
  // renamed, then found by its title
  await page.getByLabel("Title", { exact: true }).fill("Six times seven");
  await page.getByRole("button", { name: "Rename" }).click();
  await page.getByRole("heading", { name: "Six times seven" }).waitFor({ timeout: T.ui });
  await page.getByLabel("Search by title or id").fill("times sev");
  await page
    .getByRole("navigation", { name: "All sessions" })
    .getByText("Six times seven")
    .waitFor({ timeout: T.ui });
  await page.getByLabel("State as of").selectOption({ index: 1 });
  await page.getByRole("button", { name: "Restore" }).click();
  await page.getByTestId("restored").waitFor({ timeout: T.ui });
  await page.getByRole("link", { name: "open it at that step" }).click();
  await page.getByText(/#\d+\/\d+ seq/).waitFor({ timeout: T.ui });
  const slider = page.getByLabel("Time travel");
  await slider.focus();
  await page.keyboard.press("Home");
  const at = [];
  for (let i = 0; i < 6; i++) {
    await page.keyboard.press("ArrowRight");
    at.push(await page.locator("[data-cell]").count());
  }
  check(at[0] === 0, `scrubbing from the start showed ${at[0]} cells at once`);
  check(
    at.every((n, i) => i === 0 || n >= (at[i - 1] ?? 0)),
    `cells went back while scrubbing on: ${at}`,
  );
  await page.keyboard.press("End"); // the last event is the live view: the restore itself
  await page.getByText("live · session.restored").waitFor({ timeout: T.ui });
});

await scenario("export-import-audit", async () => {
  await page.getByRole("link", { name: "Sessions", exact: true }).click();
  await page.getByRole("button", { name: /Six times seven/ }).click();
  const [download] = await Promise.all([
    page.waitForEvent("download"),
    page.getByRole("button", { name: "Export JSONL" }).click(),
  ]);
  const saved = `${out}/export.jsonl`;
  await download.saveAs(saved);
  const lines = readFileSync(saved, "utf8").trim().split("\n");
  check(lines.length > 10, `the export holds ${lines.length} lines`);
  // A tampered copy is refused, naming the event; nothing is imported.
  const row = JSON.parse(lines[1]);
  const payload = Buffer.from(row.payload, "base64");
  payload[Math.floor(payload.length / 2)] ^= 1;
  row.payload = payload.toString("base64");
  writeFileSync(
    `${out}/tampered.jsonl`,
    [lines[0], JSON.stringify(row), ...lines.slice(2)].join("\n"),
  );
  await page.getByLabel("Import JSONL…").setInputFiles(`${out}/tampered.jsonl`);
  await page.getByText(/export_invalid \(HTTP 422\): the export does not verify/).waitFor({
    timeout: T.ui,
  });
  await page.getByLabel("Import JSONL…").setInputFiles(saved);
  await page.getByText(/imported \d+ events as a new session/).waitFor({ timeout: T.ui });
  await page
    .getByTestId("audit-badge")
    .getByText(/verified/)
    .waitFor({ timeout: T.ui });
});

await scenario("settings-validation-and-daytona-test", async () => {
  await page.getByRole("link", { name: "Settings", exact: true }).click();
  const depth = page.locator("#setting-rlm_max_depth");
  await depth.waitFor({ timeout: T.ui });
  await depth.fill("deep");
  await page.getByRole("button", { name: "Save settings" }).click();
  const row = page.locator("[data-setting=rlm_max_depth]");
  await row
    .getByRole("alert")
    .getByText("rlm_max_depth (env RLM_MAX_DEPTH) must be a non-negative integer, got 'deep'")
    .waitFor({ timeout: T.ui });
  check((await depth.getAttribute("aria-invalid")) === "true", "the refused field is not marked");
  await page.screenshot({ path: `${out}/${String(shot).padStart(2, "0")}-settings-refused.png` });
  await depth.fill("4");
  await page.getByRole("button", { name: "Save settings" }).click();
  await page.getByText("settings saved").waitFor({ timeout: T.ui });
  await row.getByText(/from tenant \(default 3\)/).waitFor({ timeout: T.ui });
  await page.getByRole("button", { name: "Test Daytona" }).click();
  // no Daytona here: the probe fails and its guidance says so plainly (an admin is told what
  // to set, a tenant whom to ask)
  const probe = page.getByTestId("probe-daytona");
  await probe.getByText("daytona: failed").waitFor({ timeout: T.turn });
  await probe
    .getByText(
      /Daytona is not configured on this (sandbox broker: set DAYTONA_API_KEY|deployment: ask an admin to set it up)/,
    )
    .waitFor({ timeout: T.ui });
  await row.getByRole("button", { name: "Use the default" }).click();
  await row.getByText(/from default/).waitFor({ timeout: T.ui });
});

await scenario("settings-profile-used-by-a-turn", async () => {
  check(lmUrl, "the scripted LM's URL was not given");
  await page.getByRole("link", { name: "Settings", exact: true }).click();
  const form = page.getByRole("form", { name: "New LLM profile" });
  await form.getByLabel("Profile name").fill("alt");
  await form.getByLabel("Model").fill("openai/scripted-alt");
  await form.getByLabel("API base").fill(lmUrl);
  await form.getByLabel("API key").fill("local");
  await form.getByRole("button", { name: "Add profile" }).click();
  await page.locator("[data-profile=alt]").waitFor({ timeout: T.ui });
  await page.getByLabel("profile for planner", { exact: true }).selectOption("alt");
  await page.getByLabel("profile for delegate", { exact: true }).selectOption("alt");
  await page.getByRole("button", { name: "Save roles" }).click();
  await page.getByText("roles saved").waitFor({ timeout: T.ui });
  await page.locator("[data-profile=alt]").getByRole("button", { name: "Test" }).click();
  await page
    .getByTestId("probe-lm")
    .getByText(/lm: ok · openai\/scripted-alt/)
    .waitFor({
      timeout: T.turn,
    });
  await page.screenshot({ path: `${out}/${String(shot).padStart(2, "0")}-settings.png` });
  await newSession("rlm_only", "");
  // sent from the keyboard: Ctrl+Enter in the message box
  await page.getByLabel("Message").fill("What is 6 times 7?");
  await page.getByLabel("Message").press("Control+Enter");
  await turnEnds();
  const answer = (await page.locator("[data-turn] p").last().textContent())?.trim();
  check(answer === "42 via alt", `the turn answered ${answer}`);
  await page
    .getByRole("cell", { name: /scripted-alt/ })
    .first()
    .waitFor({ timeout: T.ui });
});

await scenario("usage-plot", async () => {
  await page.getByRole("tab", { name: "Usage" }).click();
  const plot = page.getByTestId("turn-plot");
  await plot.getByRole("img", { name: /tokens per turn: turn 1 \d+/ }).waitFor({ timeout: T.ui });
  await plot.getByRole("img", { name: /LM latency per turn/ }).waitFor({ timeout: T.ui });
  await plot.getByText(/Session: [1-9]\d* calls · [1-9]\d* tokens in/).waitFor({ timeout: T.ui });
  // cost per turn: a bar chart, the table's column and the session's total, in dollars
  await plot.getByRole("img", { name: /^cost per turn: turn 1 \$\d/ }).waitFor({ timeout: T.ui });
  await plot.getByRole("columnheader", { name: "cost" }).waitFor({ timeout: T.ui });
  const costs = await plot.locator("tbody tr td:nth-child(4)").allTextContents();
  check(costs.length > 0 && costs.every((c) => /^\$\d/.test(c)), `cost cells: ${costs}`);
  await plot.getByText(/ out · \$\d[\d.]* · LM /).waitFor({ timeout: T.ui });
});

await scenario("sandboxes-inspect", async () => {
  await page.getByRole("link", { name: "Sandboxes", exact: true }).click();
  const table = page.getByRole("region", { name: "Sandboxes" });
  const first = table.locator("tbody button").first();
  await first.waitFor({ timeout: T.ui }); // the turns above ran in sandboxes
  const id = (await first.textContent())?.trim();
  await first.click();
  const detail = page.getByRole("region", { name: "Sandbox detail" });
  await detail.getByText(`"sandbox": "${id}"`).waitFor({ timeout: T.ui });
  await detail.getByText(/"provider": "\w+"/).waitFor({ timeout: T.ui });
});

await scenario("sandboxes-archive-refused-then-delete", async () => {
  // the sandbox inspected above: the local provider cannot archive, and says so
  const detail = page.getByRole("region", { name: "Sandbox detail" });
  const id = (await detail.getByRole("heading").textContent())?.trim();
  await detail.getByRole("button", { name: "Archive" }).click();
  await detail
    .getByRole("alert")
    .getByText(
      /archive_refused \(HTTP 409\): sandbox \S+ runs on the local provider, which cannot archive it/,
    )
    .waitFor({ timeout: T.ui });
  await page.screenshot({ path: `${out}/${String(shot).padStart(2, "0")}-archive-refused.png` });
  page.once("dialog", (dialog) => dialog.accept());
  await detail.getByRole("button", { name: "Delete" }).click();
  await detail.getByText("deleted", { exact: true }).waitFor({ timeout: T.ui });
  // the list no longer shows it as live
  await page.waitForFunction(
    (gone) =>
      ![...document.querySelectorAll('section[aria-label="Sandboxes"] tbody tr')].some(
        (r) => r.textContent.includes(gone) && !/deleted|stopped/.test(r.textContent),
      ),
    id,
    { timeout: T.ui },
  );
});

await scenario("volumes-browse", async () => {
  await page.getByRole("link", { name: "Volumes", exact: true }).click();
  const volume = page.getByRole("region", { name: "Volume" });
  // the session sandboxes above mount the tenant's volume; its listing (or "empty") shows
  await volume
    .getByRole("button")
    .filter({ hasText: /📁|📄/ })
    .first()
    .or(volume.getByText("empty", { exact: true }))
    .or(volume.getByText(/No sandbox of yours mounts a volume/))
    .first()
    .waitFor({ timeout: T.ui });
  const alerts = await volume.getByRole("alert").allTextContents();
  check(alerts.length === 0, `the volume screen refused: ${alerts}`);
  // a volume the tenant does not have is the gateway's plain 404, naming it
  await volume.getByLabel("Volume").fill("nope");
  await volume
    .getByRole("alert")
    .getByText(/\(HTTP 404\): .*'nope'/)
    .waitFor({ timeout: T.ui });
  await page.screenshot({ path: `${out}/${String(shot).padStart(2, "0")}-volume-not-found.png` });
  const dirs = volume.getByRole("button").filter({ hasText: "📁" });
  if (await dirs.count()) await dirs.first().click();
  const files = volume.getByRole("button").filter({ hasText: "📄" });
  if (await files.count()) {
    await files.first().click();
    await page
      .getByRole("region", { name: "Preview" })
      .getByText(/bytes shown|A binary file/)
      .waitFor({ timeout: T.ui });
  }
});

await scenario("contrast-wcag-aa", async () => {
  const bad = [];
  for (const screen of ["Settings", "Sessions", "Sandboxes", "Volumes", "Workspace"]) {
    await page.getByRole("link", { name: screen, exact: true }).click();
    await page.waitForLoadState("networkidle");
    bad.push(...(await contrastProblems()).map((p) => `${screen}: ${p}`));
  }
  await page
    .getByRole("link", { name: /Six times seven/ })
    .last()
    .click(); // the import is newer
  await page.locator("[data-cell]").first().waitFor({ timeout: T.ui });
  bad.push(...(await contrastProblems()).map((p) => `session: ${p}`));
  check(bad.length === 0, `below WCAG AA: ${bad.slice(0, 8).join("; ")}`);
});

await browser.close();
for (const r of results)
  console.log(
    `${r.ok ? "ok  " : "FAIL"} ${r.name} (${r.s.toFixed(1)} s)${r.ok ? ` → ${r.file}` : `: ${r.error}`}`,
  );
for (const p of problems) console.error(p);
const failed = results.filter((r) => !r.ok).length;
console.log(
  `${results.length - failed} passed, ${failed} failed, ${problems.length} page problems`,
);
process.exit(failed || problems.length ? 1 : 0);
