// The results view: the palette command and a validation open a webview panel with the
// server's results view, and the page draws it (tables from the server's rows, the server's
// figure through the bundled plotly.js) under its CSP. The view is built by fuselens itself
// (contracts/results_view.py, run with $FUSELENS_PYTHON or the repository's .venv).

import * as assert from "assert";
import { spawnSync } from "child_process";
import * as fs from "fs";
import * as os from "os";
import * as path from "path";
import { clients, EXTENSION_ROOT, fakeContext, FakeState, FakeUri, freshState, loadExtension } from "./fakes";
import { renderPage, tableColumns, tableRows } from "./webview";

const REPO = path.resolve(EXTENSION_ROOT, "..", "..");
const PYTHON = process.env.FUSELENS_PYTHON || path.join(REPO, ".venv", "bin", "python");

// A validation on a GPU and one earlier run of the same file, as the server would send its view.
const MAKE_VIEW = `
import json, sys
from fuselens.contracts.history import ValidationRun
from fuselens.contracts.plain import to_plain
from fuselens.contracts.results_view import results_view
from fuselens.contracts.validation import ClusterCheck, ModelCheck, ModelValidation, Timing, ValidationReport

def report(fused):
    timing = Timing(eager_us=30.0, compiled_us=12.0, fused_us=fused, achieved_gbps=2900.0, pct_of_peak=97.0)
    check = ClusterCheck("c0", "cluster0", "verified", ops="mul → relu → add", max_abs=1e-6, atol=1e-5, rtol=1e-5, timing=timing)
    model = ModelValidation(sys.argv[1], [[4096, 1024]], ["float32"], [check], ModelCheck("matches", ["c0"]))
    return ValidationReport("/ws/model.py", "cuda", "NVIDIA H200", [model], versions={"torch": "2.13.0"})

earlier = ValidationRun("2025-01-30T09:00:00Z", "NVIDIA H200", report(14.0))
latest = ValidationRun("2025-01-31T12:03:04Z", "NVIDIA H200", report(10.0))
print(json.dumps(to_plain(results_view(latest, [earlier]))))
`;

// A profile of two models on a CPU: one too large to profile there, one profiled at smaller inputs.
const MAKE_PROFILE_VIEW = `
import json
from fuselens.contracts.plain import to_plain
from fuselens.contracts.profile import ClusterTime, LineTime, ModelProfile, Profile
from fuselens.contracts.profile_view import profile_view

huge = ModelProfile("Huge", 0.0, 0.0, 0.0, problem="its forward moves 8.0 GB even at (2, 8192)")
small = ModelProfile("Net", 100.0, 100.0, 0.0, inputs=[[2, 256, 1024]], cpu_budget_bytes=256 * 2**20,
                     lines=[LineTime("/ws/model.py", 3, "Net.forward", 100.0, 1.0, 2, ops=["mul"], clusters=["c0"])],
                     clusters=[ClusterTime("c0", 100.0, 1.0, 2, 40.0, 2.5, 1, 1)])
profile = Profile("cpu", "cpu", 10, 3, models=[huge, small])
analyzed = {"Huge": [[4, 8192]], "Net": [[4, 2048, 1024]]}
print(json.dumps(to_plain(profile_view("/ws/model.py", profile, analyzed_inputs=analyzed))))
`;

function serverView(modelName = "Net"): any {
  const done = spawnSync(PYTHON, ["-c", MAKE_VIEW, modelName], { encoding: "utf8" });
  assert.strictEqual(done.status, 0, done.stderr);
  return JSON.parse(done.stdout);
}

async function activate(state: FakeState) {
  clients.length = 0;
  const loaded = loadExtension(state);
  await loaded.extension.activate(fakeContext(fs.mkdtempSync(path.join(os.tmpdir(), "fuselens-ext-"))));
  return { ...loaded, client: clients[0] };
}

function pythonEditor(state: FakeState): string {
  const uri = FakeUri.file("/ws/model.py");
  state.activeEditor = { document: { uri, languageId: "python" } };
  return uri.toString();
}

describe("the results view", function () {
  this.timeout(60_000); // (plotly.js is 4.8 MB of JavaScript for jsdom to run)

  before(function () {
    if (!fs.existsSync(PYTHON)) {
      this.skip(); // no fuselens to build a view with
    }
  });

  it("opens from the palette with the server's table, chart and earlier runs", async () => {
    const state = freshState();
    const uri = pythonEditor(state);
    const { client } = await activate(state);
    const view = serverView();
    client.answer = (method, params: any) =>
      method === "workspace/executeCommand" && params.command === "fuselens.validationResults"
        ? { results_view: view, results_markdown: "" }
        : undefined;

    await state.commands.get("fuselens.palette.showResults")!();

    assert.deepStrictEqual(client.requests.at(-1)!.params, { command: "fuselens.validationResults", arguments: [uri] });
    assert.strictEqual(state.panels.length, 1);
    const panel = state.panels[0];
    assert.strictEqual(panel.viewType, "fuselens.results");
    assert.strictEqual(panel.title, "fuselens results: model.py");
    assert.ok(panel.options.enableScripts);
    assert.deepStrictEqual(
      panel.options.localResourceRoots!.map((u) => path.relative(EXTENSION_ROOT, u.fsPath)),
      ["media", path.join("node_modules", "plotly.js-dist-min")],
    );
    const html = panel.webview.html;
    assert.match(html, /default-src 'none'/);
    assert.doesNotMatch(html, /unsafe-eval|https?:\/\/(?!fake\.vscode-resource)/); // no eval, nothing from a CDN

    const page = await renderPage(html);
    assert.deepStrictEqual(
      page.scripts.map((f) => path.relative(EXTENSION_ROOT, f)),
      [path.join("node_modules", "plotly.js-dist-min", "plotly.min.js"), path.join("media", "results.js")],
    );
    const doc = page.document;
    assert.strictEqual(doc.querySelector("h2")!.textContent, "Net at 4096×1024 float32, on NVIDIA H200");
    const results = doc.querySelector("table.results")!;
    assert.deepStrictEqual(tableColumns(results), view.columns);
    assert.ok(tableColumns(results).includes("torch.compile (default) µs"));
    assert.deepStrictEqual(tableRows(results), view.models[0].rows); // the server's cells, as they are
    const history = doc.querySelector("table.history")!;
    assert.deepStrictEqual(tableRows(history), view.models[0].history.rows);
    assert.strictEqual(doc.querySelector("h3")!.textContent, "Earlier runs of this file");
    // plotly.js drew the server's figure: its bars, and a legend naming the compile mode.
    const chart = doc.querySelector(".chart")!;
    assert.ok(chart.querySelector("svg.main-svg"), "no chart drawn");
    const legend = Array.from(chart.querySelectorAll(".legendtext")).map((t) => t.textContent);
    assert.deepStrictEqual(legend, view.models[0].chart.data.map((t: { name: string }) => t.name));
    assert.ok(legend.includes("torch.compile (default)") && legend.includes("fused, 2025-01-30 09:00 UTC"));
    assert.ok(chart.querySelectorAll(".bars path").length >= 4, "bars for eager, torch.compile, fused, earlier");
    assert.deepStrictEqual(page.errors.filter((e) => !/getContext|canvas/.test(e)), []);
  });

  it("draws the chart in the editor theme's colours", async () => {
    const state = freshState();
    pythonEditor(state);
    const { client } = await activate(state);
    await client.clientOptions.middleware.executeCommand("fuselens.validateAll", [], async () => ({ results_view: serverView() }));
    // VS Code sets the theme's colours as CSS variables on the page's body.
    const theme = "--vscode-charts-blue: #123456; --vscode-charts-orange: #654321; --vscode-editor-foreground: #abcdef";
    const page = await renderPage(state.panels[0].webview.html.replace("<body>", `<body style="${theme}">`));
    const fills = Array.from(page.document.querySelectorAll(".chart .bars path")).map((p) => (p as any).style.fill);
    assert.strictEqual(fills[0], "rgb(18, 52, 86)"); // the first series (eager) in --vscode-charts-blue
    assert.ok(fills.includes("rgb(101, 67, 33)"), fills.join()); // the second in --vscode-charts-orange
    const title = page.document.querySelector(".chart .gtitle") as any;
    assert.strictEqual(title.style.fill, "rgb(171, 205, 239)"); // text in the editor's foreground
  });

  it("opens beside the editor, keeping the focus, when a validation from a code lens ends", async () => {
    const state = freshState();
    pythonEditor(state);
    const { client } = await activate(state);
    const mw = client.clientOptions.middleware;
    const view = serverView();
    const validation = { mode: "cuda", models: [], results_view: view };
    const result = await mw.executeCommand("fuselens.validateAll", ["file:///ws/model.py"], async () => validation);
    assert.strictEqual(result, validation, "the command's result goes on to the code lens unchanged");
    assert.strictEqual(state.panels.length, 1);
    assert.deepStrictEqual(state.panels[0].showOptions, { viewColumn: -2, preserveFocus: true });
    assert.match(state.panels[0].webview.html, /fuselens-results/);

    await mw.executeCommand("fuselens.validateKernel", ["file:///ws/model.py", "c0"], async () => validation);
    assert.strictEqual(state.panels.length, 1, "one panel, shown again");
    assert.deepStrictEqual(state.panels[0].reveals, [{ viewColumn: undefined, preserveFocus: true }]);

    await mw.executeCommand("fuselens.analyze", ["file:///ws/model.py"], async () => ({ scheduled: true }));
    assert.strictEqual(state.panels[0].reveals.length, 1, "other commands leave it alone");
  });

  it("shows a profile's inputs, and says why a model has no chart instead of drawing an empty one", async () => {
    const state = freshState();
    pythonEditor(state);
    const { client } = await activate(state);
    const done = spawnSync(PYTHON, ["-c", MAKE_PROFILE_VIEW], { encoding: "utf8" });
    assert.strictEqual(done.status, 0, done.stderr);
    const view = JSON.parse(done.stdout);
    // The Profile lens's command: its result goes to the results view as a validation's does.
    await client.clientOptions.middleware.executeCommand("fuselens.profile", ["file:///ws/model.py"], async () => ({ results_view: view }));
    const page = await renderPage(state.panels[0].webview.html);
    const [huge, net] = Array.from(page.document.querySelectorAll("section.model"));
    assert.strictEqual(huge.querySelector("h2")!.textContent, "Huge: where the time of a forward goes, on the CPU (each op's CPU time)");
    assert.strictEqual(huge.querySelector(".no-data")!.textContent, "No data: Huge was not profiled: its forward moves 8.0 GB even at (2, 8192)");
    assert.strictEqual(huge.querySelector(".chart"), null, "no empty chart");
    assert.strictEqual(huge.querySelector("table"), null, "no empty table");
    assert.ok(net.querySelector("h2")!.textContent!.startsWith(
      "Net at 2×256×1024 (smaller than the analyzed 4×2048×1024, to move at most 256 MB a forward): "));
    assert.ok(net.querySelector(".chart svg.main-svg"), "the profiled model's chart is drawn");
    assert.deepStrictEqual(page.errors.filter((e) => !/getContext|canvas/.test(e)), []);
  });

  it("says so when the file has no validation yet", async () => {
    const state = freshState();
    pythonEditor(state);
    const { client } = await activate(state);
    client.answer = () => ({ results_view: null, message: "no validation of model.py yet" });
    await state.commands.get("fuselens.palette.showResults")!();
    assert.strictEqual(state.panels.length, 0);
    assert.deepStrictEqual(state.messages.at(-1), {
      level: "info",
      text: "fuselens: no validation of model.py yet (fuselens: Validate all).",
    });
  });

  it("shows the server's text as text: a name cannot leave the page's data block", async () => {
    const state = freshState();
    pythonEditor(state);
    const { client } = await activate(state);
    const name = "</script><script>document.title='owned'</script><b>Net</b>";
    const view = serverView(name);
    await client.clientOptions.middleware.executeCommand("fuselens.validateAll", [], async () => ({ results_view: view }));
    const html = state.panels[0].webview.html;
    assert.ok(!html.includes("</script><script>document.title"), "the name ended the data block");
    const page = await renderPage(html);
    assert.strictEqual(page.document.title, "fuselens results");
    assert.ok(page.document.querySelector("h2")!.textContent!.startsWith(name));
    assert.strictEqual(page.document.querySelector("h2 b"), null);
  });
});
