// Drives the fuselens extension in a real VS Code (code-server in headless Chromium) the way a user
// would, and writes what the page showed to --results as JSON for tests/test_vscode.py to assert on.
//   --mode library:  a transformers Llama: the quick fix of a cluster in the library's code (Ctrl+.
//                    on the model's line), the model saved, the analysis after it, then the quick
//                    fix of a second cluster there, with nothing saved
//   --mode checkout: the file in a git repository: a syntax error saved, then `git checkout` of the
//                    file from outside the editor; then a validation whose whole-model check ends
//                    in an error, and what the user is told
// Each step that ends is listed in `steps`; the first that fails is in `errors` with its reason,
// and the session stops there (what the page showed then is in failure.png beside code-server's log).

import { execFileSync } from "child_process";
import fs from "fs";
import path from "path";
import {
  answerTrust, appears, editorLines, goToLine, lens, openFile, parseArgs, problemRows, resultsView, statusItem,
  toasts, withCodeServer,
} from "../../editors/code-server/driver.mjs";

const args = parseArgs(process.argv.slice(2), ["mode", "cache", "chromium", "vsix", "python", "dir", "model", "results"]);
const model = args.model;
const workspace = path.dirname(model);
const results = { steps: [], errors: {} };
const log = (...a) => console.log(`[vscode ${args.mode}]`, ...a);

function save() {
  fs.writeFileSync(args.results, JSON.stringify(results, null, 1));
}

/** Run one step; a failure is recorded and ends the session (the page is in an unknown state). */
async function step(name, fn) {
  log("step", name);
  try {
    await fn();
    results.steps.push(name);
  } catch (error) {
    results.errors[name] = String(error?.stack ?? error);
    throw error;
  } finally {
    save();
  }
}

const read = (file) => (fs.existsSync(file) ? fs.readFileSync(file, "utf8") : "");
const patchesIn = (text) => text.split("# ---- library patch: ").length - 1;

/** Wait until `predicate()` (run here, in Node) holds, checking every 100 ms. */
async function until(ms, what, predicate) {
  const end = Date.now() + ms;
  while (Date.now() < end) {
    if (await predicate()) {
      return;
    }
    await new Promise((r) => setTimeout(r, 100));
  }
  throw new Error(`timed out after ${ms / 1000} s waiting for ${what}`);
}

/** The fuselens status bar item's text ("fuselens: 3 clusters"), without its icon. */
async function status(page) {
  const item = statusItem(page, /^\s*fuselens/);
  return (await item.innerText()).replace(/\s+/g, " ").trim();
}

/** The number N of "fuselens: N clusters" once the status says it (after `excluding`, if given). */
async function clustersShown(page, ms, excluding) {
  let n;
  await until(ms, `the status bar to give a number of clusters${excluding === undefined ? "" : ` other than ${excluding}`}`, async () => {
    const m = /^fuselens: (\d+) clusters?$/.exec(await status(page));
    n = m ? Number(m[1]) : undefined;
    return n !== undefined && n !== excluding;
  });
  return n;
}

/** The rows of the Problems panel, open, with each diagnostic's related information folded (the
 * list draws only the rows in view): the file's row with its count ("llama.py 4"), then one row per
 * diagnostic. Diagnostics published meanwhile unfold the tree again: then it is folded again. */
async function problems(page) {
  if (!(await page.locator(".markers-panel").isVisible())) {
    await page.keyboard.press("Control+Shift+M");
    await page.locator(".markers-panel").waitFor({ timeout: 10_000 });
  }
  let rows = [];
  await until(30_000, "the Problems panel folded to one row per diagnostic", async () => {
    await page.locator(".panel").getByRole("button", { name: "Collapse All" }).click();
    const file = problemRows(page).first();
    if (!(await appears(file, 2_000))) {
      rows = []; // no problems
      return true;
    }
    await file.locator(".monaco-tl-twistie").click(); // the file's diagnostics, their own rows folded
    await problemRows(page).nth(1).waitFor({ timeout: 10_000 });
    rows = (await problemRows(page).allInnerTexts()).map((t) => t.replace(/\s+/g, " ").trim());
    const count = Number(/ (\d+)$/.exec(rows[0])?.[1]);
    return rows.length === 1 + count;
  });
  await page.keyboard.press("Control+1"); // the focus back in the editor, where the user types
  return rows;
}

/** The tabs whose editor has changes not saved (the user would have to save them). */
async function dirtyTabs(page) {
  return (await page.locator(".tab.dirty .label-name").allInnerTexts()).map((t) => t.trim());
}

/** How many files have changes not saved, as the Explorer's badge in the activity bar counts them:
 * those of no tab too (a file an edit changed without opening it). */
async function unsavedFiles(page) {
  const badge = page.locator(".activitybar .action-item:has(a[aria-label^='Explorer']) .badge-content");
  return (await badge.isVisible()) ? Number((await badge.innerText()).trim()) : 0;
}

/** Apply the quick fix whose title holds `title` from the Ctrl+. menu at `line`, with the keyboard
 * as a user would; every entry the menu offered goes to results[key]. */
async function quickFix(page, line, title, key) {
  await goToLine(page, line);
  await page.keyboard.press("Control+.");
  const menu = page.locator(".action-widget");
  const rows = menu.locator(".monaco-list-row");
  await rows.first().waitFor({ timeout: 30_000 });
  results[key] = (await rows.allInnerTexts()).map((t) => t.replace(/\s+/g, " ").trim());
  const count = await rows.count();
  for (let i = 0; i < count; i++) {
    const focused = menu.locator(".monaco-list-row.focused").first();
    if (((await focused.getAttribute("aria-label")) ?? "").includes(title)) {
      await page.keyboard.press("Enter");
      await menu.waitFor({ state: "hidden", timeout: 10_000 });
      return;
    }
    await page.keyboard.press("ArrowDown");
  }
  throw new Error(`no quick fix "${title}" among ${JSON.stringify(results[key])}`);
}

/** The line (1-based) of the model file on disk that holds `code`. */
function lineOf(code) {
  const at = read(model).split("\n").findIndex((line) => line.includes(code));
  if (at < 0) {
    throw new Error(`no line of ${model} holds ${code}`);
  }
  return at + 1;
}

async function library(page) {
  const kernels = model.replace(/\.py$/, "_kernels.py");
  const MODEL = "model = LlamaForCausalLM(config)";

  await step("library diagnostics", async () => {
    results.clusters_before = await clustersShown(page, 300_000); // the first import of transformers
    results.problems_before = await problems(page);
  });

  await step("first library fix", async () => {
    await quickFix(page, lineOf(MODEL), "LlamaRMSNorm.forward (library code)", "action_titles");
    await until(30_000, "the edit in the model's editor", async () => (await editorLines(page).innerText()).includes("install()"));
    await until(30_000, "the first patch in the kernel module on disk", () => patchesIn(read(kernels)) === 1);
    results.first_module = read(kernels);
    await page.keyboard.press("Control+S"); // the model's editor, the one the user edits; no other is saved
    await until(30_000, "the model saved", async () => (await dirtyTabs(page)).length === 0 && read(model).includes("install()"));
    results.model_on_disk = read(model);
  });

  await step("analysis after saving", async () => {
    results.clusters_between = await clustersShown(page, 300_000, results.clusters_before);
    results.problems_between = await problems(page);
  });

  await step("second library fix", async () => {
    // The module exists now: the second patch must reach it on disk too, with nothing to save.
    await quickFix(page, lineOf(MODEL), "LlamaMLP.forward (library code)", "second_action_titles");
    await until(30_000, "the second patch in the kernel module on disk", () => patchesIn(read(kernels)) === 2);
    results.second_module = read(kernels);
    results.clusters_after = await clustersShown(page, 300_000, results.clusters_between);
    results.problems_after = await problems(page);
    results.dirty_after_second = await dirtyTabs(page);
    results.unsaved_after_second = await unsavedFiles(page);
    results.tabs = (await page.locator(".tab .label-name").allInnerTexts()).map((t) => t.trim());
    results.model_after_second = read(model);
  });
}

async function checkout(page) {
  const name = path.basename(model);
  const git = (...a) => execFileSync("git", ["-C", workspace, "-c", "user.name=t", "-c", "user.email=t@example.com", ...a]);
  const syntaxError = (rows) => rows.some((row) => /syntax/i.test(row) && !row.startsWith("fusable"));

  await step("diagnostics", async () => {
    await statusItem(page, /fuselens: 3 clusters/).waitFor({ timeout: 300_000 });
    results.problems_before = await problems(page);
  });

  await step("syntax error saved", async () => {
    await goToLine(page, lineOf("        x = F.relu(x)"));
    await page.keyboard.press("End");
    await page.keyboard.press("Backspace"); // "x = F.relu(x"
    await until(10_000, "the editor marked unsaved", async () => (await dirtyTabs(page)).length > 0);
    results.dirty_before_saving = await dirtyTabs(page);
    results.unsaved_before_saving = await unsavedFiles(page);
    await page.keyboard.press("Control+S");
    await statusItem(page, /fuselens: syntax error/).waitFor({ timeout: 60_000 });
    await until(30_000, "the syntax error in the Problems panel", async () => syntaxError(await problems(page)));
    results.status_with_the_error = await status(page);
    results.problems_with_the_error = await problems(page);
    results.on_disk_with_the_error = read(model);
  });

  await step("checkout", async () => {
    // From outside the editor (a terminal, another tool): VS Code notices the file changed on disk
    // and reloads its editor, which has no unsaved changes.
    const start = process.hrtime.bigint();
    git("checkout", "--", name);
    // Checked in the page, at each frame: the status says 3 clusters and no syntax error is listed.
    await page.waitForFunction(() => {
      const texts = (selector) => [...document.querySelectorAll(selector)].map((e) => e.textContent ?? "");
      const rows = texts(".markers-panel .monaco-list-row");
      return texts(".statusbar-item").some((t) => /fuselens: 3 clusters/.test(t))
        && rows.some((t) => t.includes("fusable:"))
        && !rows.some((t) => /syntax/i.test(t) && !t.includes("fusable:"));
    }, undefined, { timeout: 60_000, polling: "raf" });
    results.checkout_seconds = Number(process.hrtime.bigint() - start) / 1e9;
    results.status_after_checkout = await status(page);
    results.problems_after_checkout = await problems(page);
    results.editor_after_checkout = (await editorLines(page).innerText()).replace(/\u00a0/g, " ");
  });

  await step("validation error", async () => {
    // The kernel module's name is taken by a file of the user's: the whole-model check cannot run.
    fs.writeFileSync(path.join(workspace, name.replace(/\.py$/, "_kernels.py")), "def mine():\n    pass\n");
    await page.keyboard.press("Control+J"); // the panel away: the lens and the notifications in view
    await lens(page, "Validate all").click();
    const question = page.locator(".monaco-dialog-box").filter({ hasText: "No CUDA GPU" }).first();
    if (await appears(question, 60_000)) { // (a machine with CUDA asks nothing)
      await question.getByRole("button", { name: /Check numerics in the Triton interpreter/ }).click();
    }
    const told = toasts(page).filter({ hasText: "as a whole" }).first();
    await told.waitFor({ timeout: 600_000 });
    results.notifications = (await toasts(page).allInnerTexts()).map((t) => t.replace(/\s+/g, " ").trim());
    await page.locator(".tab").filter({ hasText: "fuselens results" }).first().waitFor({ timeout: 60_000 });
    const view = resultsView(page);
    await view.locator("table.results").first().waitFor({ timeout: 60_000 });
    results.results_text = await view.locator("body").innerText();
  });
}

const scenes = { library, checkout };
if (!scenes[args.mode]) {
  console.error(`unknown mode ${args.mode}: ${Object.keys(scenes).join(", ")}`);
  process.exit(2);
}
save();
try {
  await withCodeServer({ ...args, workspace, log }, async (page) => {
    await step("open", async () => {
      await answerTrust(page, true, log);
      await openFile(page, model, log);
    });
    await scenes[args.mode](page);
  });
} catch (error) {
  console.error(String(error?.stack ?? error));
  process.exitCode = 1;
}
