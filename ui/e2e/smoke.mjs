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
  await page.goto(url);
  await page.getByLabel(/Development token/).fill(token);
  await page.getByRole("button", { name: "Sign in" }).click();
  await page.getByRole("button", { name: "New session" }).click();
  await page.getByTestId("connection").getByText("connected").waitFor({ timeout: 15000 });
  await page.getByLabel("Message").fill("What is 6 times 7?");
  await page.getByRole("button", { name: "Send" }).click();
  await page.locator("[data-turn]").first().waitFor({ timeout: 15000 });
  await page
    .getByTestId("turn-status")
    .filter({ hasText: /done|failed|cancelled|refused/ })
    .first()
    .waitFor({ timeout: 60000 });
  await page.screenshot({ path: `${out}/workspace.png` });
  await page.getByRole("tab", { name: "Trace tree" }).click();
  await page.screenshot({ path: `${out}/trace-tree.png` });
  console.log("turn status:", await page.getByTestId("turn-status").first().textContent());
} catch (error) {
  await page.screenshot({ path: `${out}/failure.png` });
  console.error(String(error));
  problems.push(String(error));
} finally {
  await browser.close();
}
for (const p of problems) console.error(p);
process.exit(problems.length ? 1 : 0);
