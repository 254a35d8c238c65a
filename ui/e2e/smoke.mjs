// Browser smoke against a running mesh (./scripts/run): sign in with the development token,
// start a session, send a message, and write screenshots. Debian's chromium, driven by
// playwright-core (no browser download). Usage: node e2e/smoke.mjs <url> <token> <out dir>
import { mkdirSync } from "node:fs";
import { chromium } from "playwright-core";

const [url, token, out = "e2e-out"] = process.argv.slice(2);
if (!url || !token) {
  console.error("usage: node e2e/smoke.mjs <gateway url> <development token> [out dir]");
  process.exit(2);
}
mkdirSync(out, { recursive: true });
const browser = await chromium.launch({
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
});
const page = await browser.newPage({ viewport: { width: 1440, height: 900 } });
const problems = [];
page.on("pageerror", (e) => problems.push(`page error: ${e.message}`));
page.on("console", (m) => m.type() === "error" && problems.push(`console: ${m.text()}`));
try {
  // Every execution socket goes through here, so the test can drop one mid-turn.
  const sockets = [];
  await page.routeWebSocket(/\/api\/v1\/ws\/execution/, (ws) => {
    ws.connectToServer();
    sockets.push(ws);
  });
  await page.goto(url);
  await page.getByLabel(/Development token/).fill(token);
  await page.getByRole("button", { name: "Sign in" }).click();
  await page.getByRole("button", { name: "New session" }).click();
  await page.getByTestId("connection").getByText("connected").waitFor({ timeout: 15000 });
  await page.getByLabel("Message").fill("What is 6 times 7?");
  await page.getByRole("button", { name: "Send" }).click();
  await page.locator("[data-cell]").first().waitFor({ timeout: 30000 });
  await page.screenshot({ path: `${out}/1-cells-streaming.png` });
  // Drop the connection mid-turn: the client must resume from its last sequence.
  await sockets.at(-1).close({ code: 4000, reason: "dropped by the test" });
  await page.getByText(/resumed after sequence \d+/).waitFor({ timeout: 15000 });
  await page
    .getByTestId("turn-status")
    .filter({ hasText: /done|failed|cancelled|refused/ })
    .first()
    .waitFor({ timeout: 60000 });
  await page.screenshot({ path: `${out}/2-turn-done-after-resume.png` });
  const keys = await page
    .locator("[data-cell]")
    .evaluateAll((els) => els.map((e) => e.dataset.cell));
  if (new Set(keys).size !== keys.length) problems.push(`a cell shown twice: ${keys}`);
  if (keys.length < 3) problems.push(`expected the turn's cells, saw ${keys.length}`);
  const status = await page.getByTestId("turn-status").first().textContent();
  const answer = await page.locator("[data-turn] p").first().textContent();
  console.log(`turn ${status}, answer ${answer}, ${keys.length} cells, ${sockets.length} sockets`);
  if (status !== "done" || answer?.trim() !== "42") problems.push(`turn ${status}: ${answer}`);
  await page.getByRole("tab", { name: "Trace tree" }).click();
  await page.getByRole("tree").focus();
  await page.keyboard.press("ArrowDown");
  await page.keyboard.press("ArrowLeft"); // collapse the run
  await page.screenshot({ path: `${out}/3-trace-tree-run-collapsed.png` });
  await page.keyboard.press("ArrowRight");
  await page.screenshot({ path: `${out}/4-trace-tree.png` });
  // Time travel: back to the first event, the panels show the session as it was.
  const slider = page.getByLabel("Time travel");
  await slider.focus();
  await page.keyboard.press("Home");
  await page.getByText(/#1\//).waitFor({ timeout: 5000 });
  await page.getByRole("tab", { name: "Execution" }).click();
  const early = await page.locator("[data-cell]").count();
  if (early !== 0) problems.push(`time travel to event 1 still shows ${early} cells`);
  await page.screenshot({ path: `${out}/5-time-travel-first-event.png` });
} catch (error) {
  await page.screenshot({ path: `${out}/failure.png` });
  console.error(String(error));
  problems.push(String(error));
} finally {
  await browser.close();
}
for (const p of problems) console.error(p);
process.exit(problems.length ? 1 : 0);
