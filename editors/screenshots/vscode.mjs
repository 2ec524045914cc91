// Drives code-server with headless Chromium and saves screenshots of the fuselens extension at
// work. Run through vscode.sh, which installs code-server and packages the extension first.
//
//   node vscode.mjs --cache DIR --work DIR --python PY --chromium BIN --vsix FILE --model FILE --out DIR
//                   [--scenes "problems hover ..."]
//
// Two sessions, each a fresh code-server profile on a fresh copy of the model:
//   trusted:   problems, hover, kernel, no-gpu-prompt, results, syntax-error (in this order: each
//              scene starts where the one before left the window)
//   untrusted: untrusted
//   gpu:       results-gpu (the results view of a run measured on a GPU: see seed_gpu_history.py)
//   profile:   profile (the Profile lens's results view), profile-hover (a line's measured time)
// A scene not asked for is still walked through when a later one needs it, but not saved.

import { execFileSync, spawn } from "child_process";
import fs from "fs";
import { createRequire } from "module";
import net from "net";
import path from "path";

const args = Object.fromEntries(
  process.argv.slice(2).reduce((pairs, a, i, all) => (a.startsWith("--") ? [...pairs, [a.slice(2), all[i + 1]]] : pairs), []),
);
for (const key of ["cache", "work", "python", "chromium", "vsix", "model", "out"]) {
  if (!args[key]) {
    console.error(`missing --${key}`);
    process.exit(2);
  }
}
const { chromium } = createRequire(path.join(args.cache, "package.json"))("playwright-core");
const log = (...a) => console.log("[screenshot]", ...a);
const codeServerBin = path.join(args.cache, "node_modules", ".bin", "code-server");

/** What each scene saves, and the session it belongs to. */
const SCENES = {
  problems: { file: "vscode.png", session: "trusted" },
  hover: { file: "vscode-hover.png", session: "trusted" },
  kernel: { file: "vscode-kernel.png", session: "trusted" },
  "no-gpu-prompt": { file: "vscode-no-gpu-prompt.png", session: "trusted" },
  results: { file: "vscode-results.png", session: "trusted" },
  "syntax-error": { file: "vscode-syntax-error.png", session: "trusted" },
  untrusted: { file: "vscode-untrusted.png", session: "untrusted" },
  "results-gpu": { file: "vscode-results-gpu.png", session: "gpu" },
  profile: { file: "vscode-profile.png", session: "profile" },
  "profile-hover": { file: "vscode-profile-hover.png", session: "profile" },
};
const HERE = path.dirname(new URL(import.meta.url).pathname);
const wanted = new Set(args.scenes ? args.scenes.split(/\s+/).filter(Boolean) : Object.keys(SCENES));
for (const name of wanted) {
  if (!SCENES[name]) {
    console.error(`unknown scene ${name}; the scenes are: ${Object.keys(SCENES).join(" ")}`);
    process.exit(2);
  }
}

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

const appears = (locator, timeout) => locator.waitFor({ timeout }).then(() => true, () => false);

/**
 * A code-server profile of its own (user settings, the extension installed) on a workspace holding
 * a copy of the model, and a Chromium page on it; `run(page, ...)` walks the session's scenes.
 * Everything is stopped when it returns.
 */
async function session(name, run) {
  const dir = path.join(args.work, name);
  const workspace = path.join(dir, "models");
  fs.mkdirSync(workspace, { recursive: true });
  const model = path.join(workspace, path.basename(args.model));
  fs.copyFileSync(args.model, model);

  // User settings: the server from the venv; a quiet, readable workbench; Workspace Trust on and
  // asked at start, so that the session trusts (or declines) as a user does.
  const userDir = path.join(dir, "user", "User");
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

  // code-server keeps its own config under XDG folders: keep them in the session's folder.
  const env = { ...process.env, XDG_CONFIG_HOME: path.join(dir, "config"), XDG_DATA_HOME: path.join(dir, "data") };
  const profile = ["--user-data-dir", path.join(dir, "user"), "--extensions-dir", path.join(dir, "extensions")];
  execFileSync(codeServerBin, [...profile, "--install-extension", args.vsix], { env, stdio: "ignore" });

  const port = await freePort();
  const codeServer = spawn(codeServerBin, [
    "--auth", "none", "--bind-addr", `127.0.0.1:${port}`, ...profile,
    "--disable-telemetry", "--disable-update-check", "--disable-getting-started-override",
  ], { stdio: ["ignore", "pipe", "pipe"], env });
  const serverLog = fs.createWriteStream(path.join(dir, "code-server.log"));
  codeServer.stdout.pipe(serverLog);
  codeServer.stderr.pipe(serverLog);

  let browser;
  let page;
  try {
    await waitForHttp(`http://127.0.0.1:${port}/healthz`, 60_000);
    browser = await chromium.launchPersistentContext(path.join(dir, "chromium"), {
      executablePath: args.chromium,
      headless: true,
      viewport: { width: 1440, height: 900 },
      args: [
        "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync",
      ],
    });
    page = await browser.newPage();
    await page.goto(`http://127.0.0.1:${port}/?folder=${encodeURIComponent(workspace)}`);
    await page.locator(".monaco-workbench").waitFor({ timeout: 120_000 });
    log(name, "workbench loaded");
    await run(page, model);
  } catch (error) {
    if (page) {
      const debug = path.join(args.work, "..", `fuselens-screenshot-${name}-failure.png`);
      await page.screenshot({ path: debug }).catch(() => undefined);
      console.error(`[screenshot] ${name} failed; the page as it was: ${debug}; code-server log: ${path.join(dir, "code-server.log")}`);
    }
    throw error;
  } finally {
    await browser?.close();
    codeServer.kill();
  }
}

async function save(page, scene) {
  if (!wanted.has(scene)) {
    return;
  }
  const file = path.join(args.out, SCENES[scene].file);
  await page.screenshot({ path: file });
  log("saved", file);
}

async function answerTrust(page, trust) {
  const button = page.getByRole("button", { name: trust ? /Yes, I trust the authors/i : /No, I don.t trust the authors/i });
  if (await appears(button, 30_000)) {
    await button.click();
    log(trust ? "trusted the workspace" : "declined to trust the workspace");
  } else {
    log("no trust prompt");
  }
}

async function openFile(page, file) {
  // A double click in the Explorer opens it pinned (not as a preview another editor replaces).
  const row = page.locator(".explorer-folders-view .monaco-list-row").filter({ hasText: path.basename(file) }).first();
  await row.waitFor({ timeout: 60_000 });
  await row.dblclick();
  await page.locator(".tab.active").filter({ hasText: path.basename(file) }).waitFor({ timeout: 60_000 });
  await page.locator(".monaco-editor .view-lines").first().waitFor({ timeout: 60_000 });
  log("opened", path.basename(file));
}

async function clearNotifications(page) {
  await page.keyboard.press("Control+Shift+P");
  await page.keyboard.type("Notifications: Clear All Notifications", { delay: 10 });
  await page.locator(".quick-input-list .monaco-list-row").filter({ hasText: "Clear All Notifications" }).first()
    .waitFor({ timeout: 10_000 });
  await page.keyboard.press("Enter");
  await toasts(page).first().waitFor({ state: "hidden", timeout: 10_000 }).catch(() => undefined);
}

async function closeTab(page, title) {
  const tab = page.locator(".tab").filter({ hasText: title }).first();
  await tab.hover();
  await tab.locator(".codicon-close").click();
  await tab.waitFor({ state: "detached", timeout: 10_000 });
}

const statusItem = (page, pattern) => page.locator(".statusbar-item").filter({ hasText: pattern }).first();
const lens = (page, title) => page.locator(".codelens-decoration a").filter({ hasText: title }).first();
const toasts = (page) => page.locator(".notifications-toasts .notification-toast:visible");

async function trustedScenes(page, model) {
  await answerTrust(page, true);
  await openFile(page, model);

  // What a user sees once the analysis is in: status bar, code lens, inlay hints, squiggles.
  await statusItem(page, /fuselens: \d+ clusters?/).waitFor({ timeout: 240_000 });
  log("status bar:", (await statusItem(page, /fuselens: \d+ clusters?/).innerText()).trim());
  await lens(page, "fusable cluster").waitFor({ timeout: 60_000 });
  await page.locator(".view-lines").filter({ hasText: "⚡" }).first().waitFor({ timeout: 60_000 });
  await page.keyboard.press("Control+Shift+M"); // the Problems panel, with the cluster diagnostics
  await page.locator(".markers-panel .monaco-list-row").filter({ hasText: "fusable" }).first().waitFor({ timeout: 30_000 });
  await page.waitForTimeout(1500);
  await save(page, "problems");

  // The compact hover on a cluster's line: cost, ops, and the link that opens the kernel.
  await page.keyboard.press("Control+Shift+M"); // close the panel: the hover is tall
  // Without a Python grammar the line is a few plain spans; "relu" ends the one with " F.relu".
  const token = page.locator(".editor-group-container .view-line span span").filter({ hasText: "F.relu" }).first();
  const box = await token.boundingBox();
  await page.mouse.move(box.x + box.width - 30, box.y + box.height / 2);
  await page.mouse.move(box.x + box.width - 12, box.y + box.height / 2, { steps: 5 });
  const hover = page.locator(".monaco-hover").filter({ hasText: "elementwise" }).first();
  if (!(await appears(hover, 10_000))) {
    await token.click(); // the keyboard way: Ctrl+K Ctrl+I shows the hover at the cursor
    await page.keyboard.press("Control+K");
    await page.keyboard.press("Control+I");
  }
  await hover.waitFor({ timeout: 30_000 });
  await page.waitForTimeout(800);
  await save(page, "hover");
  await page.mouse.move(1300, 850);
  await page.keyboard.press("Escape");

  // "Show kernels": the server opens the generated module as a read-only view in its cache folder.
  await lens(page, "Show kernels").click();
  await page.locator(".tab").filter({ hasText: "_kernels.py" }).first().waitFor({ timeout: 60_000 });
  await page.locator(".editor-group-container .view-lines").filter({ hasText: "triton" }).first().waitFor({ timeout: 30_000 });
  await page.waitForTimeout(1000);
  await save(page, "kernel");
  await closeTab(page, "_kernels.py");
  await page.locator(".tab.active").filter({ hasText: path.basename(model) }).waitFor({ timeout: 10_000 });

  // "Validate all" on a machine without CUDA: the server asks, once, whether to use the interpreter.
  await lens(page, "Validate all").click();
  const prompt = toasts(page).filter({ hasText: "No CUDA GPU" }).first();
  if (!(await appears(prompt, 60_000))) {
    throw new Error("no prompt about validating without a GPU (is there a CUDA GPU here?)");
  }
  await page.waitForTimeout(800);
  await save(page, "no-gpu-prompt");
  await prompt.getByRole("button", { name: /Check numerics in the Triton interpreter/ }).click();
  await page.keyboard.press("Control+B"); // the side bar away: the results view needs the width

  // The results view opens beside the editor when the validation ends: its table and chart.
  await page.locator(".tab").filter({ hasText: "fuselens results" }).first().waitFor({ timeout: 300_000 });
  const view = page.frameLocator("iframe.webview.ready").frameLocator("iframe#active-frame");
  await view.locator("table.results").first().waitFor({ timeout: 60_000 });
  await view.locator(".chart .legendtext").first().waitFor({ timeout: 60_000 });
  await page.mouse.move(700, 300); // (no tooltip of a notification under the pointer)
  await page.waitForTimeout(2500); // let the validation's notification settle
  await save(page, "results");
  await page.keyboard.press("Control+B");

  // A syntax error: the status bar says so, and the diagnostic names the line.
  await clearNotifications(page);
  await closeTab(page, "fuselens results");
  await page.locator(".tab").filter({ hasText: path.basename(model) }).first().click();
  await page.keyboard.press("Control+G");
  await page.keyboard.type("30", { delay: 20 });
  await page.keyboard.press("Enter");
  await page.keyboard.press("End");
  await page.keyboard.type(")");
  await page.keyboard.press("Control+S");
  await statusItem(page, /syntax error/).waitFor({ timeout: 120_000 });
  await page.keyboard.press("Control+Shift+M");
  await page.locator(".markers-panel .monaco-list-row").first().waitFor({ timeout: 30_000 });
  await page.waitForTimeout(1500);
  await save(page, "syntax-error");
}

async function untrustedScenes(page, model) {
  await answerTrust(page, false);
  await openFile(page, model);
  // The server's one notification, in VS Code's words; nothing else of fuselens' stacks on it.
  await toasts(page).filter({ hasText: "waits until you trust this folder" }).first().waitFor({ timeout: 120_000 });
  await page.waitForTimeout(3000); // (a second notification would be here by now)
  const shown = await toasts(page).allInnerTexts();
  log("notifications:", JSON.stringify(shown));
  if (shown.length !== 1) {
    throw new Error(`expected one notification in the untrusted workspace, saw ${shown.length}`);
  }
  // The notification shows its first line; expanded, the whole explanation.
  const toast = toasts(page).first();
  await toast.hover();
  await toast.locator(".codicon-notifications-expand").click().catch(() => log("the notification did not expand"));
  await page.waitForTimeout(800);
  await save(page, "untrusted");
}

async function gpuScenes(page, model) {
  // This machine has no GPU: the run shown is the held-out suite's Llama case as measured on an
  // H200 (benchmarks/results/held_out_h200.json), written into the case file's history by the
  // server's own history code; the view is what "Show validation results" draws from it.
  const results = path.join(HERE, "..", "..", "benchmarks", "results", "held_out_h200.json");
  const seeded = execFileSync(args.python, [path.join(HERE, "seed_gpu_history.py"), path.dirname(model), "llama", results])
    .toString().trim();
  await answerTrust(page, true);
  await openFile(page, seeded);
  await page.keyboard.press("Control+B"); // the side bar away: the results view needs the width
  await page.keyboard.press("Control+Shift+P");
  await page.keyboard.type("fuselens: Show validation results", { delay: 10 });
  await page.locator(".quick-input-list .monaco-list-row").filter({ hasText: "Show validation results" }).first()
    .waitFor({ timeout: 10_000 });
  await page.keyboard.press("Enter");
  await page.locator(".tab").filter({ hasText: "fuselens results" }).first().waitFor({ timeout: 120_000 });
  const view = page.frameLocator("iframe.webview.ready").frameLocator("iframe#active-frame");
  await view.locator("table.results").first().waitFor({ timeout: 60_000 });
  await view.locator(".chart .legendtext").first().waitFor({ timeout: 60_000 });
  await page.mouse.move(700, 300);
  await page.waitForTimeout(2500);
  await save(page, "results-gpu");
}

async function profileScenes(page, model) {
  // The Profile lens runs the forward under the profiler in the worker (here, on the CPU: each op's
  // CPU time); its results view opens beside the editor, and the hover gives the measured time.
  await answerTrust(page, true);
  await openFile(page, model);
  await lens(page, "Profile").waitFor({ timeout: 240_000 });
  await page.keyboard.press("Control+B"); // the side bar away: the results view needs the width
  await lens(page, "Profile").click();
  await page.locator(".tab").filter({ hasText: "fuselens results" }).first().waitFor({ timeout: 300_000 });
  const view = page.frameLocator("iframe.webview.ready").frameLocator("iframe#active-frame");
  await view.locator("table.results").first().waitFor({ timeout: 60_000 });
  await view.locator(".chart .legendtext").first().waitFor({ timeout: 60_000 });
  await page.mouse.move(700, 300);
  await page.waitForTimeout(2500);
  await save(page, "profile");
  await clearNotifications(page);
  await closeTab(page, "fuselens results");
  await page.locator(".tab").filter({ hasText: path.basename(model) }).first().click();
  await lens(page, "per forward").waitFor({ timeout: 60_000 }); // the lens now says what the forward took
  const token = page.locator(".editor-group-container .view-line span span").filter({ hasText: "F.relu" }).first();
  const box = await token.boundingBox();
  await page.mouse.move(box.x + box.width - 30, box.y + box.height / 2);
  await page.mouse.move(box.x + box.width - 12, box.y + box.height / 2, { steps: 5 });
  const hover = page.locator(".monaco-hover").filter({ hasText: "measured" }).first();
  if (!(await appears(hover, 10_000))) {
    await token.click();
    await page.keyboard.press("Control+K");
    await page.keyboard.press("Control+I");
  }
  await hover.waitFor({ timeout: 30_000 });
  await page.waitForTimeout(800);
  await save(page, "profile-hover");
}

const sessions = { trusted: trustedScenes, untrusted: untrustedScenes, gpu: gpuScenes, profile: profileScenes };
for (const [name, run] of Object.entries(sessions)) {
  if ([...wanted].some((scene) => SCENES[scene].session === name)) {
    await session(name, run);
  }
}
