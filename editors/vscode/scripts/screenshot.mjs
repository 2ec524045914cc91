// Drives code-server with headless Chromium and saves screenshots of the extension at work.
// Run through screenshot.sh, which installs code-server and the extension first.
//
//   node screenshot.mjs --cache DIR --work DIR --python PY --chromium BIN --model FILE --out DIR

import { spawn } from "child_process";
import fs from "fs";
import { createRequire } from "module";
import net from "net";
import path from "path";

const args = Object.fromEntries(
  process.argv.slice(2).reduce((pairs, a, i, all) => (a.startsWith("--") ? [...pairs, [a.slice(2), all[i + 1]]] : pairs), []),
);
for (const key of ["cache", "work", "python", "chromium", "model", "out"]) {
  if (!args[key]) {
    console.error(`missing --${key}`);
    process.exit(2);
  }
}
const { chromium } = createRequire(path.join(args.cache, "package.json"))("playwright-core");
const log = (...a) => console.log("[screenshot]", ...a);

// A workspace with a copy of the model, so nothing the session does touches the repository.
const workspace = path.join(args.work, "workspace");
fs.mkdirSync(workspace, { recursive: true });
const model = path.join(workspace, path.basename(args.model));
fs.copyFileSync(args.model, model);

// User settings: the server from the venv; a quiet, readable workbench; trust enabled, so the
// workspace is trusted by the user (the dialog below) rather than by switching trust off.
const userDir = path.join(args.work, "user", "User");
fs.mkdirSync(userDir, { recursive: true });
fs.writeFileSync(path.join(userDir, "settings.json"), JSON.stringify({
  "fuselens.server.python": args.python,
  "security.workspace.trust.enabled": true,
  "security.workspace.trust.startupPrompt": "always",
  "editor.inlayHints.enabled": "on",
  "editor.minimap.enabled": false,
  "editor.fontSize": 14,
  "workbench.colorTheme": "Default Dark Modern",
  "workbench.startupEditor": "none",
  "workbench.tips.enabled": false,
  "workbench.secondarySideBar.defaultVisibility": "hidden",
  "chat.commandCenter.enabled": false,
  "extensions.ignoreRecommendations": true,
  "telemetry.telemetryLevel": "off",
  "update.mode": "none",
  "git.enabled": false,
}, null, 2));

function freePort() {
  return new Promise((resolve) => {
    const server = net.createServer().listen(0, "127.0.0.1", () => {
      const { port } = server.address();
      server.close(() => resolve(port));
    });
  });
}

async function waitForHttp(url, ms) {
  const end = Date.now() + ms;
  while (Date.now() < end) {
    try {
      if ((await fetch(url)).ok) {
        return;
      }
    } catch {
      // not listening yet
    }
    await new Promise((r) => setTimeout(r, 500));
  }
  throw new Error(`${url} did not answer in ${ms / 1000} s`);
}

const port = await freePort();
const codeServer = spawn(path.join(args.cache, "node_modules", ".bin", "code-server"), [
  "--auth", "none", "--bind-addr", `127.0.0.1:${port}`,
  "--user-data-dir", path.join(args.work, "user"), "--extensions-dir", path.join(args.work, "extensions"),
  "--disable-telemetry", "--disable-update-check", "--disable-getting-started-override",
], { stdio: ["ignore", "pipe", "pipe"], env: process.env });
const serverLog = fs.createWriteStream(path.join(args.work, "code-server.log"));
codeServer.stdout.pipe(serverLog);
codeServer.stderr.pipe(serverLog);

let browser;
let page;
try {
  await waitForHttp(`http://127.0.0.1:${port}/healthz`, 60_000);
  browser = await chromium.launch({
    executablePath: args.chromium,
    headless: true,
    args: ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking"],
  });
  page = await browser.newPage({ viewport: { width: 1440, height: 900 } });
  await page.goto(`http://127.0.0.1:${port}/?folder=${encodeURIComponent(workspace)}`);
  await page.locator(".monaco-workbench").waitFor({ timeout: 120_000 });
  log("workbench loaded");

  // Trust the workspace the way a user does; the extension restarts the server with trust on.
  const trust = page.getByRole("button", { name: /Yes, I trust the authors/i });
  if (await trust.waitFor({ timeout: 30_000 }).then(() => true, () => false)) {
    await trust.click();
    log("trusted the workspace");
  } else {
    log("no trust prompt (already trusted?)");
  }

  // Open the model with Quick Open.
  await page.locator(".monaco-workbench").click({ position: { x: 700, y: 400 } }).catch(() => undefined);
  await page.keyboard.press("Control+P");
  await page.keyboard.type(path.basename(model), { delay: 20 });
  await page.waitForTimeout(1000);
  await page.keyboard.press("Enter");
  await page.locator(".monaco-editor .view-lines").first().waitFor({ timeout: 60_000 });
  log("opened", path.basename(model));

  // What a user sees once the analysis is in: status bar, code lens, inlay hints, squiggles.
  const statusItem = page.locator(".statusbar-item").filter({ hasText: /fuselens: \d+ clusters?/ });
  await statusItem.first().waitFor({ timeout: 240_000 });
  log("status bar:", (await statusItem.first().innerText()).trim());
  const lens = page.locator(".codelens-decoration").filter({ hasText: "fusable cluster" });
  await lens.first().waitFor({ timeout: 60_000 });
  log("code lens:", (await lens.first().innerText()).trim().replace(/\s+/g, " "));
  const hint = page.locator(".view-lines").filter({ hasText: "⚡" });
  await hint.first().waitFor({ timeout: 60_000 });
  log("inlay hints shown");

  await page.keyboard.press("Control+Shift+M"); // the Problems panel, with the cluster diagnostics
  const problems = page.locator(".markers-panel .monaco-list-row").filter({ hasText: "fusable" });
  await problems.first().waitFor({ timeout: 30_000 });
  log("problems:", await problems.count());
  await page.waitForTimeout(1500);
  await page.screenshot({ path: path.join(args.out, "vscode.png") });
  log("saved", path.join(args.out, "vscode.png"));

  // The hover on a cluster's line: cost, ops, and the generated kernel.
  await page.keyboard.press("Control+Shift+M"); // close the panel: the hover is tall
  // Without a Python grammar the line is a few plain spans; "relu" ends the one with " F.relu".
  const token = page.locator(".editor-group-container .view-line span span").filter({ hasText: "F.relu" }).first();
  const box = await token.boundingBox();
  await page.mouse.move(box.x + box.width - 30, box.y + box.height / 2);
  await page.mouse.move(box.x + box.width - 12, box.y + box.height / 2, { steps: 5 });
  const hover = page.locator(".monaco-hover").filter({ hasText: "elementwise" });
  if (!(await hover.first().waitFor({ timeout: 10_000 }).then(() => true, () => false))) {
    await token.click(); // the keyboard way: Ctrl+K Ctrl+I shows the hover at the cursor
    await page.keyboard.press("Control+K");
    await page.keyboard.press("Control+I");
  }
  await hover.first().waitFor({ timeout: 30_000 });
  await page.waitForTimeout(800);
  await page.screenshot({ path: path.join(args.out, "vscode-hover.png") });
  log("saved", path.join(args.out, "vscode-hover.png"));
} catch (error) {
  if (page) {
    const debug = path.join(args.work, "..", "fuselens-screenshot-failure.png");
    await page.screenshot({ path: debug }).catch(() => undefined);
    console.error(`[screenshot] failed; the page as it was: ${debug}; code-server log: ${path.join(args.work, "code-server.log")}`);
  }
  throw error;
} finally {
  await browser?.close();
  codeServer.kill();
}
