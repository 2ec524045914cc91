// Activation, as far as it goes without a VS Code binary: the fakes in fakes.ts stand in
// for `vscode` and the LanguageClient, and record what the extension asked of them.

import * as assert from "assert";
import * as fs from "fs";
import * as os from "os";
import * as path from "path";
import { clients, clusterDiagnostic, fakeContext, FakeState, FakeUri, freshState, loadExtension } from "./fakes";

const ROOT = path.resolve(__dirname, "..", "..");
const REPO = path.resolve(ROOT, "..", "..");
const manifest = JSON.parse(fs.readFileSync(path.join(ROOT, "package.json"), "utf8"));

/** An interpreter with fuselens installed: $FUSELENS_PYTHON or the repository's .venv. */
const VENV_PYTHON = process.env.FUSELENS_PYTHON || path.join(REPO, ".venv", "bin", "python");

function pythonExtension(executable: string) {
  return {
    exports: {
      environments: {
        getActiveEnvironmentPath: () => ({ id: "x", path: executable }),
        resolveEnvironment: async (env: { path: string }) => ({ executable: { uri: FakeUri.file(env.path) } }),
      },
    },
  };
}

async function activate(state: FakeState) {
  clients.length = 0;
  const storage = fs.mkdtempSync(path.join(os.tmpdir(), "fuselens-ext-"));
  const loaded = loadExtension(state);
  const context = fakeContext(storage);
  const controller = await loaded.extension.activate(context);
  return { ...loaded, context, controller, storage };
}

describe("activation", () => {
  it("starts `fuselens serve --stdio` from PATH when nothing else is configured", async () => {
    const state = freshState();
    const { storage } = await activate(state);
    assert.strictEqual(clients.length, 1);
    const client = clients[0];
    assert.strictEqual(client.started, 1);
    assert.deepStrictEqual(client.serverOptions.command, "fuselens");
    assert.deepStrictEqual(client.serverOptions.args, ["serve", "--stdio"]);
    // Never the workspace: `python -m` would put it first on sys.path.
    assert.strictEqual(client.serverOptions.options.cwd, storage);
    assert.deepStrictEqual(client.clientOptions.documentSelector, [{ scheme: "file", language: "python" }]);
  });

  it("uses fuselens.server.path, then fuselens.server.python", async () => {
    let state = freshState();
    state.settings["fuselens.server.path"] = "/opt/fuselens/bin/fuselens";
    state.settings["fuselens.server.python"] = "/opt/py/bin/python";
    await activate(state);
    assert.strictEqual(clients[0].serverOptions.command, "/opt/fuselens/bin/fuselens");

    state = freshState();
    state.settings["fuselens.server.python"] = "/opt/py/bin/python";
    await activate(state);
    assert.strictEqual(clients[0].serverOptions.command, "/opt/py/bin/python");
    assert.deepStrictEqual(clients[0].serverOptions.args, ["-m", "fuselens.cli.main", "serve", "--stdio"]);
  });

  it("uses the Python extension's interpreter when fuselens is installed in it", async function () {
    if (!fs.existsSync(VENV_PYTHON)) {
      this.skip(); // no interpreter with fuselens to point at
    }
    const state = freshState();
    state.pythonExtension = pythonExtension(VENV_PYTHON);
    await activate(state);
    assert.strictEqual(clients[0].serverOptions.command, path.resolve(VENV_PYTHON));
    assert.deepStrictEqual(clients[0].serverOptions.args, ["-m", "fuselens.cli.main", "serve", "--stdio"]);
  });

  it("falls back to PATH when the selected interpreter has no fuselens, and says why", async () => {
    const state = freshState();
    state.pythonExtension = pythonExtension(process.execPath); // node: certainly not a Python with fuselens
    await activate(state);
    assert.strictEqual(clients[0].serverOptions.command, "fuselens");
    assert.ok(state.outputs[0].lines.some((l) => l.includes("has no fuselens installed")), state.outputs[0].lines.join("\n"));
  });

  it("does not run an interpreter from inside an untrusted workspace", async () => {
    const state = freshState();
    state.trusted = false;
    const folder = fs.mkdtempSync(path.join(os.tmpdir(), "fuselens-ws-"));
    state.workspaceFolders = [{ uri: FakeUri.file(folder) }];
    state.pythonExtension = pythonExtension(path.join(folder, ".venv", "bin", "python"));
    await activate(state);
    assert.strictEqual(clients[0].serverOptions.command, "fuselens");
    assert.ok(state.outputs[0].lines.some((l) => l.includes("untrusted workspace")));
  });

  it("passes Workspace Trust and the server's settings in initializationOptions", async () => {
    const state = freshState();
    state.trusted = false;
    Object.assign(state.settings, {
      "fuselens.server.path": "/opt/fuselens", // the extension's own: never sent to the server
      "fuselens.device": "a100",
      "fuselens.peakGbps": null,
      "fuselens.remoteRunner": "", // unset: the server would reject "" (no {file})
      "fuselens.models": { Net: { inputs: [[8, 16]] } },
      "fuselens.worker.python": "",
      "fuselens.worker.timeoutSeconds": 30,
    });
    await activate(state);
    const options = clients[0].clientOptions.initializationOptions;
    const init = typeof options === "function" ? options() : options;
    assert.deepStrictEqual(init, {
      workspaceTrusted: false,
      settings: { device: "a100", models: { Net: { inputs: [[8, 16]] } }, worker: { timeoutSeconds: 30 } },
    });
  });

  it("restarts with workspaceTrusted: true when the user grants trust", async () => {
    const state = freshState();
    state.trusted = false;
    await activate(state);
    const first = clients[0];
    state.trusted = true;
    await state.grantTrust.fire();
    assert.strictEqual(first.stopped, 1);
    assert.strictEqual(clients.length, 2);
    assert.strictEqual(clients[1].started, 1);
    assert.strictEqual(clients[1].clientOptions.initializationOptions().workspaceTrusted, true);
  });

  it("registers every palette command the manifest contributes, and no server command id", async () => {
    const state = freshState();
    await activate(state);
    const contributed = manifest.contributes.commands.map((c: { command: string }) => c.command).sort();
    assert.deepStrictEqual([...state.commands.keys()].sort(), contributed);
    for (const title of ["Analyze", "Validate kernel", "Validate all", "Show kernel", "Restart"]) {
      assert.ok(manifest.contributes.commands.some((c: { title: string }) => c.title.startsWith(title)), title);
    }
    // The language client registers the server's own ids (used by the code lenses).
    for (const serverId of ["fuselens.analyze", "fuselens.validateAll", "fuselens.validateKernel", "fuselens.showKernel"]) {
      assert.ok(!state.commands.has(serverId), serverId);
    }
  });

  it("forwards palette commands to the server's workspace commands", async () => {
    const state = freshState();
    const doc = { uri: FakeUri.file("/w/model.py"), languageId: "python" };
    state.activeEditor = { document: doc };
    await activate(state);
    await state.commands.get("fuselens.palette.validateAll")!();
    await state.commands.get("fuselens.palette.analyze")!();
    assert.deepStrictEqual(clients[0].requests, [
      { type: "workspace/executeCommand", params: { command: "fuselens.validateAll", arguments: ["file:///w/model.py"] } },
      { type: "workspace/executeCommand", params: { command: "fuselens.analyze", arguments: ["file:///w/model.py"] } },
    ]);
    await state.commands.get("fuselens.palette.restart")!();
    assert.strictEqual(clients.length, 2);
  });

  it("drives the status bar from diagnostics and work-done progress", async () => {
    const state = freshState();
    state.workspaceFolders = [{ uri: FakeUri.file("/w") }];
    const uri = FakeUri.file("/w/model.py");
    const doc = { uri, languageId: "python" };
    state.activeEditor = { document: doc };
    await activate(state);
    const [item] = state.statusItems;
    const mw = clients[0].clientOptions.middleware;
    assert.ok(item.visible);
    assert.strictEqual(item.text, "$(zap) fuselens");

    mw.didOpen(doc, () => undefined);
    assert.match(item.text, /analyzing/);

    const cluster = (id: string) => ({ source: "fuselens", code: "elementwise", message: "fusable", data: { cluster: id } });
    let passedOn: unknown[] = [];
    mw.handleDiagnostics(uri, [cluster("c0"), cluster("c1"), cluster("c2"), { source: "fuselens", code: "pattern:x", message: "p" }],
      (_u: unknown, d: unknown[]) => (passedOn = d));
    assert.strictEqual(item.text, "$(zap) fuselens: 3 clusters");
    assert.strictEqual(passedOn.length, 4, "diagnostics still reach VS Code");

    const progress: string[] = [];
    mw.handleWorkDoneProgress("t1", { kind: "begin", title: "fuselens: validating c0", percentage: 0 }, () => progress.push("begin"));
    assert.strictEqual(item.text, "$(sync~spin) fuselens: validating c0 0%");
    mw.handleWorkDoneProgress("t1", { kind: "report", message: "c0: interpreter", percentage: 50 }, () => progress.push("report"));
    assert.strictEqual(item.text, "$(sync~spin) fuselens: validating c0 50%");
    mw.handleWorkDoneProgress("t1", { kind: "end" }, () => progress.push("end"));
    assert.strictEqual(item.text, "$(zap) fuselens: 3 clusters");
    assert.deepStrictEqual(progress, ["end"], "the client's own progress display never begins: it hears of the end");

    mw.handleDiagnostics(uri, [{ source: "fuselens", code: "timeout", message: "analysis timed out: 60 s" }], () => undefined);
    assert.strictEqual(item.text, "$(error) fuselens: failed");

    const syntax = { source: "fuselens", code: "syntax", message: "invalid syntax (line 12)" };
    mw.handleDiagnostics(uri, [syntax], () => undefined);
    assert.strictEqual(item.text, "$(warning) fuselens: syntax error", "not '0 clusters': nothing was analyzed");
    assert.strictEqual(item.tooltip, "invalid syntax (line 12)");
  });

  it("shows a validation's progress once, on the document it is for, from the lens to its end", async () => {
    const state = freshState();
    const model = { uri: FakeUri.file("/w/model.py"), languageId: "python" };
    const other = { uri: FakeUri.file("/w/other.py"), languageId: "python" };
    state.activeEditor = { document: model };
    await activate(state);
    const [item] = state.statusItems;
    const mw = clients[0].clientOptions.middleware;
    const cluster = (id: string) => ({ source: "fuselens", code: "elementwise", message: "fusable", data: { cluster: id } });
    mw.handleDiagnostics(model.uri, [cluster("c0"), cluster("c1"), cluster("c2")], () => undefined);
    mw.handleDiagnostics(other.uri, [cluster("c0")], () => undefined);

    // The "Validate all" lens: the command runs through the middleware until the server answers.
    let answer: (value: unknown) => void = () => undefined;
    const validation = mw.executeCommand("fuselens.validateAll", [model.uri.toString(), "ExampleNet"], () =>
      new Promise((resolve) => (answer = resolve)));
    assert.strictEqual(item.text, "$(sync~spin) fuselens: validating…", "visible before the first progress");

    const passedOn: string[] = [];
    mw.handleWorkDoneProgress("t1", { kind: "begin", title: "fuselens: validating c0, c1, c2", percentage: 0 }, () => passedOn.push("begin"));
    mw.handleWorkDoneProgress("t1", { kind: "report", message: "ExampleNet: c1", percentage: 40 }, () => passedOn.push("report"));
    assert.strictEqual(item.text, "$(sync~spin) fuselens: validating c0, c1, c2 40%");

    state.activeEditor = { document: other }; // another file in front: its own state, not this validation
    await state.activeEditorChange.fire(undefined);
    assert.strictEqual(item.text, "$(zap) fuselens: 1 cluster");
    state.activeEditor = { document: model };
    await state.activeEditorChange.fire(undefined);
    assert.strictEqual(item.text, "$(sync~spin) fuselens: validating c0, c1, c2 40%");

    // The first run ends (no GPU); the validation waits for the user's answer, then runs again.
    mw.handleWorkDoneProgress("t1", { kind: "end" }, () => passedOn.push("end"));
    assert.strictEqual(item.text, "$(sync~spin) fuselens: validating…", "still visible while it waits");
    mw.handleWorkDoneProgress("t2", { kind: "begin", title: "fuselens: validating c0, c1, c2 in the interpreter", percentage: 0 }, () => passedOn.push("begin"));
    mw.handleWorkDoneProgress("t2", { kind: "report", message: "ExampleNet: c2", percentage: 75 }, () => passedOn.push("report"));
    assert.strictEqual(item.text, "$(sync~spin) fuselens: validating c0, c1, c2 in the interpreter 75%");
    mw.handleWorkDoneProgress("t2", { kind: "end" }, () => passedOn.push("end"));
    answer({ mode: "interpret", models: [] });
    await validation;
    assert.strictEqual(item.text, "$(zap) fuselens: 3 clusters");
    // Once: the client's own progress display (a second entry in the status bar) never begins.
    assert.deepStrictEqual(passedOn, ["end", "end"]);
  });

  it("asks the server's question in a dialog that stays until it is answered", async () => {
    const state = freshState();
    await activate(state);
    const ask = clients[0].requestHandlers.get("window/showMessageRequest");
    assert.ok(ask, "the extension answers the server's questions itself");
    const interpret = { title: "Check numerics in the Triton interpreter" };
    const params = { type: 3, message: "No CUDA GPU on this machine, ...", actions: [interpret, { title: "Always check in the interpreter" }] };

    state.answer = (_text, actions) => actions[0];
    assert.deepStrictEqual(await ask!(params), interpret);
    const asked = state.messages.at(-1)!;
    assert.strictEqual(asked.text, params.message);
    assert.deepStrictEqual(asked.options, { modal: true }, "a modal dialog: a notification hides itself after a while");
    assert.deepStrictEqual(asked.actions, params.actions);

    state.answer = () => undefined; // dismissed (Escape)
    assert.strictEqual(await ask!(params), null, "no answer is no");
  });

  it("validates the kernel at the cursor, or asks which, never every kernel", async () => {
    const state = freshState();
    const uri = FakeUri.file("/w/model.py");
    const at = (line: number) => ({ active: { line: line - 1, character: 8 } });
    state.activeEditor = { document: { uri, languageId: "python" }, selection: at(19) };
    // c1 and c2 share line 24 (one cluster's output feeds the next on that line).
    state.diagnostics.set(uri.toString(), [clusterDiagnostic("c0", 18, 20), clusterDiagnostic("c1", 23, 24), clusterDiagnostic("c2", 24, 26)]);
    await activate(state);
    const client = clients[0];
    const validateKernel = state.commands.get("fuselens.palette.validateKernel")!;

    await validateKernel();
    assert.deepStrictEqual(client.requests.at(-1)!.params, { command: "fuselens.validateKernel", arguments: [uri.toString(), "c0"] });
    assert.strictEqual(state.quickPicks.length, 0, "one cluster at the cursor: no question");

    state.activeEditor.selection = at(24);
    await validateKernel();
    assert.deepStrictEqual(state.quickPicks.at(-1), { labels: ["c1", "c2"], placeHolder: "Clusters at the cursor: validate the kernel of which?" });
    assert.deepStrictEqual(client.requests.at(-1)!.params, { command: "fuselens.validateKernel", arguments: [uri.toString(), "c1"] });

    state.activeEditor.selection = at(40);
    await validateKernel();
    assert.deepStrictEqual(state.quickPicks.at(-1)!.labels, ["c0", "c1", "c2"]);
    assert.ok(client.requests.every((r: any) => r.params.command === "fuselens.validateKernel"), "never fuselens.validateAll");
  });

  it("finds each palette command by its title alone, as VS Code's palette matches words", () => {
    // The palette lists every command whose label holds the typed words, each at the start of a word
    // of the label, in order (words between them skipped), and puts the recently used ones first:
    // typing one command's title must not also list another, which a recent use puts above it.
    const words = (text: string) => text.toLowerCase().replace(/…$/, "").split(/\s+/).filter(Boolean);
    const matches = (query: string, label: string) => {
      const target = words(label);
      let at = 0;
      return words(query).every((word) => {
        while (at < target.length && !target[at].startsWith(word)) {
          at++;
        }
        return at++ < target.length;
      });
    };
    const labels = manifest.contributes.commands.map((c: { category: string; title: string }) => `${c.category}: ${c.title}`);
    for (const typed of labels) {
      assert.deepStrictEqual(labels.filter((label: string) => matches(typed, label)), [typed], `typing "${typed}"`);
    }
  });

  it("does not mark a read-only file, such as a kernel view, as analyzing", async () => {
    const folder = fs.mkdtempSync(path.join(os.tmpdir(), "fuselens-view-"));
    const file = path.join(folder, "model_kernels.py");
    fs.writeFileSync(file, "x = 1\n");
    fs.chmodSync(file, 0o444); // as the server writes its views
    const state = freshState();
    state.workspaceFolders = [{ uri: FakeUri.file(folder) }];
    const doc = { uri: FakeUri.file(file), languageId: "python" };
    state.activeEditor = { document: doc };
    await activate(state);
    const [item] = state.statusItems;
    clients[0].clientOptions.middleware.didOpen(doc, () => undefined);
    assert.doesNotMatch(item.text, /analyzing/);
    fs.chmodSync(file, 0o644);
    clients[0].clientOptions.middleware.didOpen(doc, () => undefined);
    assert.match(item.text, /analyzing/, "a file the user can edit still is");
  });

  it("does not mark a file outside the workspace's folders, or an installed package's, as analyzing", async () => {
    // A library's source opened from a link in a diagnostic: the server does not analyze it.
    const folder = fs.mkdtempSync(path.join(os.tmpdir(), "fuselens-ws-"));
    const installed = path.join(folder, ".venv", "lib", "python3.11", "site-packages", "lib");
    fs.mkdirSync(installed, { recursive: true });
    const files = [path.join(os.tmpdir(), "modeling_llama.py"), path.join(installed, "modeling.py"), path.join(folder, "model.py")];
    const state = freshState();
    state.workspaceFolders = [{ uri: FakeUri.file(folder) }];
    await activate(state);
    const [item] = state.statusItems;
    const shown = files.map((file) => {
      const doc = { uri: FakeUri.file(file), languageId: "python" };
      state.activeEditor = { document: doc };
      clients[0].clientOptions.middleware.didOpen(doc, () => undefined);
      return item.text;
    });
    assert.deepStrictEqual(shown.map((text) => /analyzing/.test(text)), [false, false, true]);
  });

  it("answers workspace/configuration with the server's keys only", async () => {
    const state = freshState();
    Object.assign(state.settings, { "fuselens.server.python": "/x", "fuselens.severity": "warning", "fuselens.show": ["clusters"] });
    await activate(state);
    const mw = clients[0].clientOptions.middleware;
    const answer = mw.workspace.configuration({ items: [{ section: "fuselens" }] }, undefined, () => assert.fail("not forwarded"));
    assert.deepStrictEqual(answer, [{ severity: "warning", show: ["clusters"] }]);
  });

  it("sends changed settings to the server, and restarts for the ones that pick the process", async () => {
    const state = freshState();
    await activate(state);
    state.settings["fuselens.severity"] = "hint";
    await state.configChange.fire({ affectsConfiguration: (k: string) => k === "fuselens" || k === "fuselens.severity" });
    assert.deepStrictEqual(clients[0].notifications, [
      { type: "workspace/didChangeConfiguration", params: { settings: { fuselens: { severity: "hint" } } } },
    ]);
    await state.configChange.fire({ affectsConfiguration: (k: string) => k === "fuselens" || k === "fuselens.server.python" });
    assert.strictEqual(clients.length, 2);
  });
});

describe("manifest", () => {
  it("supports untrusted workspaces in limited mode and restricts the settings that pick executables", () => {
    const untrusted = manifest.capabilities.untrustedWorkspaces;
    assert.strictEqual(untrusted.supported, "limited");
    for (const key of ["fuselens.server.path", "fuselens.server.python", "fuselens.worker", "fuselens.remoteRunner", "fuselens.remoteProfiler"]) {
      assert.ok(untrusted.restrictedConfigurations.includes(key), key);
    }
  });

  it("contributes a setting for each server setting", () => {
    const properties = Object.keys(manifest.contributes.configuration.properties);
    for (const key of ["device", "peakGbps", "severity", "show", "inlayHints", "codeLens", "models", "worker", "remoteRunner", "remoteProfiler"]) {
      assert.ok(properties.includes(`fuselens.${key}`), key);
    }
  });

  it("activates on Python files and has no trust setting of its own", () => {
    assert.deepStrictEqual(manifest.activationEvents, ["onLanguage:python"]);
    assert.ok(!Object.keys(manifest.contributes.configuration.properties).some((k) => /trust/i.test(k)));
  });
});
