// Drives code-server with headless Chromium and saves screenshots of the fuselens extension at
// work. Run through vscode.sh, which installs code-server and packages the extension first; the
// driving itself (profile, code-server, Chromium, the workbench's parts) is
// editors/code-server/driver.mjs, which the end-to-end tests share.
//
//   node vscode.mjs --cache DIR --work DIR --python PY --chromium BIN --vsix FILE --model FILE --out DIR
//                   [--scenes "problems hover ..."]
//
// Sessions, each a fresh code-server profile on a fresh copy of the model:
//   trusted:   problems, hover, kernel, no-gpu-prompt, status, results, syntax-error (in this order:
//              each scene starts where the one before left the window)
//   untrusted: untrusted
//   gpu:       results-gpu (the results view of a run measured on a GPU: see seed_gpu_history.py)
//   profile:   profile (the Profile lens's results view), profile-hover (a line's measured time)
// A scene not asked for is still walked through when a later one needs it, but not saved.

import { execFileSync } from "child_process";
import fs from "fs";
import path from "path";
import {
  answerTrust, appears, clearNotifications, closeTab, goToLine, lens, openFile, parseArgs, resultsView, runCommand, statusItem,
  toasts, withCodeServer,
} from "../code-server/driver.mjs";

const args = parseArgs(process.argv.slice(2), ["cache", "work", "python", "chromium", "vsix", "model", "out"]);
const log = (...a) => console.log("[screenshot]", ...a);

/** What each scene saves, and the session it belongs to. */
const SCENES = {
  problems: { file: "vscode.png", session: "trusted" },
  hover: { file: "vscode-hover.png", session: "trusted" },
  kernel: { file: "vscode-kernel.png", session: "trusted" },
  "no-gpu-prompt": { file: "vscode-no-gpu-prompt.png", session: "trusted" },
  status: { file: "vscode-status.png", session: "trusted" },
  results: { file: "vscode-results.png", session: "trusted" },
  "syntax-error": { file: "vscode-syntax-error.png", session: "trusted" },
  untrusted: { file: "vscode-untrusted.png", session: "untrusted" },
  "results-gpu": { file: "vscode-results-gpu.png", session: "gpu" },
  profile: { file: "vscode-profile.png", session: "profile" },
  "profile-hover": { file: "vscode-profile-hover.png", session: "profile" },
};
const HERE = path.dirname(new URL(import.meta.url).pathname);
// By default the pictures of docs/images; `status` is one of this folder's (with hover and results).
const FOLDER_ONLY = new Set(["status"]);
const wanted = new Set(
  args.scenes ? args.scenes.split(/\s+/).filter(Boolean) : Object.keys(SCENES).filter((name) => !FOLDER_ONLY.has(name)),
);
for (const name of wanted) {
  if (!SCENES[name]) {
    console.error(`unknown scene ${name}; the scenes are: ${Object.keys(SCENES).join(" ")}`);
    process.exit(2);
  }
}

/** A fresh profile on a workspace holding a copy of the model; `run(page, model)` walks its scenes. */
async function session(name, run) {
  const dir = path.join(args.work, name);
  const workspace = path.join(dir, "models");
  fs.mkdirSync(workspace, { recursive: true });
  const model = path.join(workspace, path.basename(args.model));
  fs.copyFileSync(args.model, model);
  const failureShot = path.join(args.work, "..", `fuselens-screenshot-${name}-failure.png`);
  await withCodeServer(
    { ...args, dir, workspace, failureShot, log: (...a) => log(name, ...a) },
    (page) => run(page, model),
  );
}

/** Save the page (or only `clip` of it) as `scene`'s picture, if that scene was asked for. */
async function save(page, scene, clip) {
  if (!wanted.has(scene)) {
    return;
  }
  const file = path.join(args.out, SCENES[scene].file);
  await page.screenshot({ path: file, clip });
  log("saved", file);
}

/** The status bar's left end, with the Problems panel above it. */
const STATUS_CLIP = { x: 0, y: 900 - 316, width: 900, height: 316 };

async function trustedScenes(page, model) {
  await answerTrust(page, true, log);
  await openFile(page, model, log);

  // What a user sees once the analysis is in: status bar, code lens, inlay hints, squiggles.
  await statusItem(page, /fuselens: \d+ clusters?/).waitFor({ timeout: 240_000 });
  log("status bar:", (await statusItem(page, /fuselens: \d+ clusters?/).innerText()).trim());
  await lens(page, "fusable cluster").waitFor({ timeout: 60_000 });
  await page.locator(".view-lines").filter({ hasText: "⚡" }).first().waitFor({ timeout: 60_000 });
  await page.keyboard.press("Control+Shift+M"); // the Problems panel, with the cluster diagnostics
  await page.locator(".markers-panel .monaco-list-row").filter({ hasText: "fusable" }).first().waitFor({ timeout: 30_000 });
  await page.waitForTimeout(1500);
  await save(page, "problems");

  // The compact hover on a cluster's line: the cluster, its cost and the link that opens its kernel,
  // then its ops. Over the squiggle VS Code puts the diagnostic's own hover above the extension's;
  // the pointer rests in the indentation of the cluster's first line, before the diagnostic's range.
  await page.keyboard.press("Control+Shift+M"); // close the panel: the hover is tall
  const first = page.locator(".editor-group-container .view-line").filter({ hasText: "x = x * 2.0" }).first();
  const box = await first.boundingBox();
  await page.mouse.move(box.x + 30, box.y + box.height / 2);
  await page.mouse.move(box.x + 18, box.y + box.height / 2, { steps: 5 });
  const hover = page.locator(".monaco-hover").filter({ hasText: "elementwise" }).first();
  if (!(await appears(hover, 10_000))) {
    await page.mouse.click(box.x + 18, box.y + box.height / 2); // the keyboard way: Ctrl+K Ctrl+I at the cursor
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
  // (It opens at the cluster's entry point, `def cluster0(x):`, under the generated Triton code.)
  await page.locator(".editor-group-container .view-lines").filter({ hasText: "def cluster" }).first().waitFor({ timeout: 30_000 });
  await page.waitForTimeout(1000);
  await save(page, "kernel");
  await closeTab(page, "_kernels.py");
  await page.locator(".tab.active").filter({ hasText: path.basename(model) }).waitFor({ timeout: 10_000 });

  // "Validate all" on a machine without CUDA: the server asks, once, whether to use the interpreter,
  // in a dialog that stays until it is answered.
  await lens(page, "Validate all").click();
  const prompt = page.locator(".monaco-dialog-box").filter({ hasText: "No CUDA GPU" }).first();
  if (!(await appears(prompt, 60_000))) {
    throw new Error("no question about validating without a GPU (is there a CUDA GPU here?)");
  }
  await page.waitForTimeout(800);
  await save(page, "no-gpu-prompt");
  await prompt.getByRole("button", { name: /Check numerics in the Triton interpreter/ }).click();

  // While it runs, the status bar item gives its progress, on the document it is for; the Problems
  // panel above it lists the clusters being checked.
  await page.keyboard.press("Control+B"); // the side bar away: the results view needs the width
  await page.keyboard.press("Control+Shift+M");
  const progress = statusItem(page, /fuselens: validating .* [1-9]\d*%/);
  await progress.waitFor({ timeout: 120_000 });
  log("status bar:", (await progress.innerText()).trim());
  await save(page, "status", STATUS_CLIP);
  await page.keyboard.press("Control+Shift+M");

  // The results view opens beside the editor when the validation ends: its table and chart.
  await page.locator(".tab").filter({ hasText: "fuselens results" }).first().waitFor({ timeout: 300_000 });
  const view = resultsView(page);
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
  await goToLine(page, 30);
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
  await answerTrust(page, false, log);
  await openFile(page, model, log);
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
  await answerTrust(page, true, log);
  await openFile(page, seeded, log);
  await page.keyboard.press("Control+B"); // the side bar away: the results view needs the width
  await runCommand(page, "fuselens: Show validation results");
  await page.locator(".tab").filter({ hasText: "fuselens results" }).first().waitFor({ timeout: 120_000 });
  const view = resultsView(page);
  await view.locator("table.results").first().waitFor({ timeout: 60_000 });
  await view.locator(".chart .legendtext").first().waitFor({ timeout: 60_000 });
  await page.mouse.move(700, 300);
  await page.waitForTimeout(2500);
  await save(page, "results-gpu");
}

async function profileScenes(page, model) {
  // The Profile lens runs the forward under the profiler in the worker (here, on the CPU: each op's
  // CPU time); its results view opens beside the editor, and the hover gives the measured time.
  await answerTrust(page, true, log);
  await openFile(page, model, log);
  await lens(page, "Profile").waitFor({ timeout: 240_000 });
  await page.keyboard.press("Control+B"); // the side bar away: the results view needs the width
  await lens(page, "Profile").click();
  await page.locator(".tab").filter({ hasText: "fuselens results" }).first().waitFor({ timeout: 300_000 });
  const view = resultsView(page);
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
