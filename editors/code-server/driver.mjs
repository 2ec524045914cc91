// VS Code (code-server) in headless Chromium, driven the way a user drives it: what the extension's
// end-to-end tests (tests/vscode/test_script.mjs) and the README's screenshots
// (editors/screenshots/vscode.mjs) share. install.sh beside this file installs code-server and
// playwright-core into the cache folder, and packages the extension.

import { execFileSync, spawn } from "child_process";
import fs from "fs";
import { createRequire } from "module";
import net from "net";
import path from "path";

/** The settings of every profile: a quiet, readable workbench; Workspace Trust on and asked at
 * start, so that a session trusts (or declines) as a user does; and no auto save, as in VS Code on
 * the desktop (in a browser it saves each edit after a second, which would hide an editor that
 * the user of the desktop's must save). */
const BASE_SETTINGS = {
  "files.autoSave": "off",
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
};

/** `--key value` pairs of the command line, as an object. */
export function parseArgs(argv, required) {
  const args = Object.fromEntries(
    argv.reduce((pairs, a, i, all) => (a.startsWith("--") ? [...pairs, [a.slice(2), all[i + 1]]] : pairs), []),
  );
  const missing = required.filter((key) => !args[key]);
  if (missing.length) {
    console.error(`missing ${missing.map((key) => `--${key}`).join(" ")}`);
    process.exit(2);
  }
  return args;
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

/** Send `signal` to the process group `pgid`; false when no process of it is left. */
function signalGroup(pgid, signal) {
  try {
    process.kill(-pgid, signal);
    return true;
  } catch {
    return false;
  }
}

/**
 * Stop code-server and what it started (its extension host, which stops the language server, which
 * stops its worker): the process group it leads gets SIGTERM; whatever of it is left after `ms`,
 * SIGKILL. (SIGTERM to code-server alone can leave its extension host running, reparented.)
 */
async function stopGroup(child, ms) {
  const end = Date.now() + ms;
  signalGroup(child.pid, "SIGTERM");
  while (Date.now() < end && signalGroup(child.pid, 0)) {
    await new Promise((r) => setTimeout(r, 100));
  }
  signalGroup(child.pid, "SIGKILL");
}

/**
 * A code-server profile of its own in `dir` (user settings: BASE_SETTINGS, `settings`, and
 * fuselens.server.python = `python`; the extension `vsix` installed) on the folder `workspace`, and
 * a Chromium page on it. `run(page)` drives it; its result is returned. Everything is stopped when
 * it returns; a failure leaves the page as it was in `failureShot` (default dir/failure.png).
 */
export async function withCodeServer({ cache, chromium, vsix, python, dir, workspace, settings = {}, failureShot, log = () => {} }, run) {
  const { chromium: browserType } = createRequire(path.join(cache, "package.json"))("playwright-core");
  const codeServerBin = path.join(cache, "node_modules", ".bin", "code-server");
  const userDir = path.join(dir, "user", "User");
  fs.mkdirSync(userDir, { recursive: true });
  fs.writeFileSync(
    path.join(userDir, "settings.json"),
    JSON.stringify({ "fuselens.server.python": python, ...BASE_SETTINGS, ...settings }, null, 2),
  );

  // code-server keeps its own config under XDG folders: keep them in the session's folder.
  const env = { ...process.env, XDG_CONFIG_HOME: path.join(dir, "config"), XDG_DATA_HOME: path.join(dir, "data") };
  const profile = ["--user-data-dir", path.join(dir, "user"), "--extensions-dir", path.join(dir, "extensions")];
  execFileSync(codeServerBin, [...profile, "--install-extension", vsix], { env, stdio: "ignore" });

  const port = await freePort();
  const codeServer = spawn(codeServerBin, [
    "--auth", "none", "--bind-addr", `127.0.0.1:${port}`, ...profile,
    "--disable-telemetry", "--disable-update-check", "--disable-getting-started-override",
  ], { stdio: ["ignore", "pipe", "pipe"], env, detached: true }); // (a process group of its own, to stop whole)
  // Stopped by a signal (a test's time limit, Ctrl+C), this process takes code-server's group with it.
  const onSignal = (signal) => {
    signalGroup(codeServer.pid, "SIGKILL");
    process.exit(signal === "SIGINT" ? 130 : 143);
  };
  process.once("SIGTERM", onSignal);
  process.once("SIGINT", onSignal);
  const serverLog = path.join(dir, "code-server.log");
  const logStream = fs.createWriteStream(serverLog);
  codeServer.stdout.pipe(logStream);
  codeServer.stderr.pipe(logStream);

  let browser;
  let page;
  try {
    await waitForHttp(`http://127.0.0.1:${port}/healthz`, 60_000);
    browser = await browserType.launchPersistentContext(path.join(dir, "chromium"), {
      executablePath: chromium,
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
    log("workbench loaded");
    return await run(page);
  } catch (error) {
    if (page) {
      const shot = failureShot ?? path.join(dir, "failure.png");
      await page.screenshot({ path: shot }).catch(() => undefined);
      error.message += `\n(the page as it was: ${shot}; code-server's log: ${serverLog})`;
    }
    throw error;
  } finally {
    await browser?.close();
    await stopGroup(codeServer, 15_000);
    process.off("SIGTERM", onSignal);
    process.off("SIGINT", onSignal);
  }
}

/** Whether `locator` shows within `timeout` ms. */
export const appears = (locator, timeout) => locator.waitFor({ timeout }).then(() => true, () => false);

/** The status bar item whose text matches `pattern`. */
export const statusItem = (page, pattern) => page.locator(".statusbar-item").filter({ hasText: pattern }).first();
/** The code lens whose title holds `title`. */
export const lens = (page, title) => page.locator(".codelens-decoration a").filter({ hasText: title }).first();
/** The notifications showing (the toasts in the corner). */
export const toasts = (page) => page.locator(".notifications-toasts .notification-toast:visible");
/** The rows of the Problems panel (files, their markers and the markers' related information). */
export const problemRows = (page) => page.locator(".markers-panel .monaco-list-row");
/** The text the active editor shows (its visible lines). */
export const editorLines = (page) => page.locator(".editor-group-container .monaco-editor .view-lines").first();

/** Answer the Workspace Trust prompt at start: trust the authors, or not. */
export async function answerTrust(page, trust, log = () => {}) {
  const button = page.getByRole("button", { name: trust ? /Yes, I trust the authors/i : /No, I don.t trust the authors/i });
  if (await appears(button, 30_000)) {
    await button.click();
    log(trust ? "trusted the workspace" : "declined to trust the workspace");
  } else {
    log("no trust prompt");
  }
}

/** Open `file` of the workspace from the Explorer and wait for its editor. */
export async function openFile(page, file, log = () => {}) {
  // A double click in the Explorer opens it pinned (not as a preview another editor replaces).
  const row = page.locator(".explorer-folders-view .monaco-list-row").filter({ hasText: path.basename(file) }).first();
  await row.waitFor({ timeout: 60_000 });
  await row.dblclick();
  await page.locator(".tab.active").filter({ hasText: path.basename(file) }).waitFor({ timeout: 60_000 });
  await page.locator(".monaco-editor .view-lines").first().waitFor({ timeout: 60_000 });
  log("opened", path.basename(file));
}

/** Run `title` from the Command Palette (its label as the palette lists it). */
export async function runCommand(page, title) {
  await page.keyboard.press("Control+Shift+P");
  await page.locator(".quick-input-widget input").waitFor({ timeout: 10_000 });
  await page.keyboard.type(title, { delay: 10 });
  await page.locator(".quick-input-list .monaco-list-row").filter({ hasText: title }).first().waitFor({ timeout: 10_000 });
  await page.keyboard.press("Enter");
}

/** Put the cursor on `line` (1-based) of the active editor, with Go to Line. */
export async function goToLine(page, line) {
  await page.keyboard.press("Control+G");
  await page.locator(".quick-input-widget input").waitFor({ timeout: 10_000 });
  await page.keyboard.type(String(line), { delay: 20 });
  await page.keyboard.press("Enter");
  await page.locator(".quick-input-widget").waitFor({ state: "hidden", timeout: 10_000 });
}

export async function clearNotifications(page) {
  await runCommand(page, "Notifications: Clear All Notifications");
  await toasts(page).first().waitFor({ state: "hidden", timeout: 10_000 }).catch(() => undefined);
}

export async function closeTab(page, title) {
  const tab = page.locator(".tab").filter({ hasText: title }).first();
  await tab.hover();
  await tab.locator(".codicon-close").click();
  await tab.waitFor({ state: "detached", timeout: 10_000 });
}

/** The results view's page (a webview: an iframe in an iframe). */
export const resultsView = (page) => page.frameLocator("iframe.webview.ready").frameLocator("iframe#active-frame");
