// The extension's client options against the real server: the exact command, arguments,
// working directory, initializationOptions and settings answers the extension builds,
// spoken to `fuselens serve --stdio` over JSON-RPC (no VS Code). Skipped when there is no
// interpreter with fuselens ($FUSELENS_PYTHON, else the repository's .venv).

import * as assert from "assert";
import { spawn } from "child_process";
import * as fs from "fs";
import * as os from "os";
import * as path from "path";
import {
  createProtocolConnection,
  StreamMessageReader,
  StreamMessageWriter,
} from "vscode-languageserver-protocol/node";
import { clients, fakeContext, FakeUri, freshState, loadExtension } from "./fakes";
import { renderPage, tableRows } from "./webview";

const REPO = path.resolve(__dirname, "..", "..", "..", "..");
const PYTHON = process.env.FUSELENS_PYTHON || path.join(REPO, ".venv", "bin", "python");

describe("the real server, started as the extension starts it", function () {
  this.timeout(240_000); // the first analysis imports torch in a fresh worker

  it("accepts the settings, publishes cluster diagnostics and feeds the status bar", async function () {
    if (!fs.existsSync(PYTHON)) {
      this.skip();
    }
    const workspace = fs.mkdtempSync(path.join(os.tmpdir(), "fuselens-vscode-ws-"));
    const model = path.join(workspace, "example_net.py");
    fs.copyFileSync(path.join(REPO, "examples", "example_net.py"), model);

    const state = freshState();
    state.trusted = true;
    state.workspaceFolders = [{ uri: FakeUri.file(workspace) }];
    Object.assign(state.settings, {
      "fuselens.server.python": PYTHON,
      "fuselens.severity": "warning",
      "fuselens.remoteRunner": "",
      "fuselens.peakGbps": null,
      "fuselens.worker.timeoutSeconds": 180,
    });
    const uri = FakeUri.file(model);
    state.activeEditor = { document: { uri, languageId: "python" } };
    clients.length = 0;
    const { extension } = loadExtension(state);
    await extension.activate(fakeContext(fs.mkdtempSync(path.join(os.tmpdir(), "fuselens-ext-"))));
    const { serverOptions, clientOptions } = clients[0];
    const mw = clientOptions.middleware;

    const { proc, connection, shown, progressed, stderr } = startServer(serverOptions, mw);
    const published = new Promise<{ uri: string; diagnostics: any[] }>((resolve) => {
      connection.onNotification("textDocument/publishDiagnostics", (p: { uri: string; diagnostics: any[] }) => {
        if (p.diagnostics.length > 0) {
          resolve(p);
        }
      });
    });
    connection.listen();

    try {
      const init: any = await connection.sendRequest("initialize", {
        processId: process.pid,
        rootUri: FakeUri.file(workspace).toString(),
        workspaceFolders: [{ uri: FakeUri.file(workspace).toString(), name: "ws" }],
        capabilities: { workspace: { configuration: true }, window: { workDoneProgress: true } },
        initializationOptions: clientOptions.initializationOptions(),
      });
      const commands: string[] = init.capabilities.executeCommandProvider.commands;
      for (const c of ["fuselens.analyze", "fuselens.validateKernel", "fuselens.validateAll", "fuselens.showKernel"]) {
        assert.ok(commands.includes(c), `server command ${c}`);
      }
      assert.ok(init.capabilities.codeLensProvider && init.capabilities.inlayHintProvider);
      await connection.sendNotification("initialized", {});

      const text = fs.readFileSync(model, "utf8");
      const doc = { uri, languageId: "python", version: 1, getText: () => text };
      mw.didOpen(doc, () =>
        connection.sendNotification("textDocument/didOpen", {
          textDocument: { uri: uri.toString(), languageId: "python", version: 1, text },
        }));
      const item = state.statusItems[0];
      assert.match(item.text, /analyzing/);

      const { diagnostics } = await published;
      const clusters = diagnostics.filter((d) => d.data?.cluster);
      assert.strictEqual(clusters.length, 3, JSON.stringify(diagnostics, null, 1));
      assert.ok(clusters.every((d) => d.severity === 2), "fuselens.severity=warning reached the server");
      mw.handleDiagnostics(uri, diagnostics, () => undefined);
      assert.strictEqual(item.text, "$(zap) fuselens: 3 clusters");
      assert.deepStrictEqual(shown.filter((m) => /setting|ignored/.test(m)), [], "the server took every setting");

      // A validation run from a code lens: its result opens the results view, drawn from the server's data.
      const execute = (command: string, args: unknown[]) =>
        connection.sendRequest("workspace/executeCommand", { command, arguments: args });
      const status: string[] = []; // what the status bar said at each progress the server sent
      progressed.push(() => status.push(item.text));
      const validation: any = await mw.executeCommand("fuselens.validateKernel", [uri.toString(), "c0", { interpret: true }], execute);
      // The progress moved while it ran, on this document's status: not 0% until it was done.
      const percentages = status.map((t) => /^\$\(sync~spin\) fuselens: validating c0.* (\d+)%$/.exec(t)?.[1]).filter(Boolean).map(Number);
      assert.ok(percentages.some((p) => p > 0 && p < 100), status.join("\n"));
      const view = validation.results_view;
      assert.strictEqual(state.panels.length, 1, "the results view opened");
      const page = await renderPage(state.panels[0].webview.html);
      const rows = tableRows(page.document.querySelector("table.results")!);
      assert.deepStrictEqual(rows, view.models[0].rows);
      assert.deepStrictEqual([rows[0][0], rows[0][2]], ["c0", "verified"]);
      const legend = Array.from(page.document.querySelectorAll(".chart .legendtext")).map((t) => t.textContent);
      assert.deepStrictEqual(legend, ["max |error| / tolerance", "tolerance: atol + rtol·|expected|"]); // the interpreter: numerics, not times

      // Later, from the palette: the server answers with the last run it kept for the file.
      clients[0].answer = (method, params) => connection.sendRequest(method, params);
      await state.commands.get("fuselens.palette.showResults")!();
      const data = /<script type="application\/json" id="fuselens-results">(.*?)<\/script>/s.exec(state.panels[0].webview.html);
      assert.deepStrictEqual(JSON.parse(data![1]), view);

      await connection.sendRequest("shutdown");
      await connection.sendNotification("exit");
    } catch (error) {
      throw new Error(`${error}\nserver stderr:\n${stderr().slice(-3000)}`);
    } finally {
      connection.dispose();
      proc.kill();
    }
  });

  it("in an untrusted workspace, tells the user once, in VS Code's words, and adds no notification of its own", async function () {
    if (!fs.existsSync(PYTHON)) {
      this.skip();
    }
    const workspace = fs.mkdtempSync(path.join(os.tmpdir(), "fuselens-vscode-untrusted-"));
    const models = ["example_net.py", "gpt.py"].map((name) => {
      fs.copyFileSync(path.join(REPO, "examples", name), path.join(workspace, name));
      return FakeUri.file(path.join(workspace, name));
    });
    const state = freshState();
    state.trusted = false;
    state.workspaceFolders = [{ uri: FakeUri.file(workspace) }];
    state.settings["fuselens.server.python"] = PYTHON; // (a user setting: VS Code keeps it in restricted mode)
    state.activeEditor = { document: { uri: models[0], languageId: "python" } };
    clients.length = 0;
    const { extension } = loadExtension(state);
    await extension.activate(fakeContext(fs.mkdtempSync(path.join(os.tmpdir(), "fuselens-ext-"))));
    const { serverOptions, clientOptions } = clients[0];
    const { proc, connection, shown, stderr } = startServer(serverOptions, clientOptions.middleware);
    connection.listen();
    const execute = (command: string, args: unknown[]) =>
      connection.sendRequest("workspace/executeCommand", { command, arguments: args });
    try {
      await connection.sendRequest("initialize", {
        processId: process.pid,
        clientInfo: { name: "Visual Studio Code" }, // what vscode-languageclient sends: vscode.env.appName
        rootUri: FakeUri.file(workspace).toString(),
        workspaceFolders: [{ uri: FakeUri.file(workspace).toString(), name: "ws" }],
        capabilities: { workspace: { configuration: true }, window: { workDoneProgress: true } },
        initializationOptions: clientOptions.initializationOptions(),
      });
      await connection.sendNotification("initialized", {});

      // Two files opened and one saved, as VS Code sends them; the palette's commands run; and the
      // server's commands asked directly (a code lens, or another client of the same server).
      for (const [version, uri] of models.entries()) {
        const text = fs.readFileSync(uri.fsPath, "utf8");
        await connection.sendNotification("textDocument/didOpen", {
          textDocument: { uri: uri.toString(), languageId: "python", version: version + 1, text },
        });
      }
      await connection.sendNotification("textDocument/didSave", { textDocument: { uri: models[0].toString() } });
      clients[0].answer = (method, params) => connection.sendRequest(method, params);
      for (const command of ["analyze", "validateKernel", "validateAll", "showKernel"] as const) {
        await state.commands.get(`fuselens.palette.${command}`)!();
      }
      const analyzed: any = await execute("fuselens.analyze", [models[0].toString()]);
      const validated: any = await execute("fuselens.validateAll", [models[1].toString(), null, { interpret: true }]);

      // (Every notification the server sent before answering the last request has been read.)
      assert.strictEqual(shown.length, 1, JSON.stringify(shown, null, 1));
      const [told] = shown;
      assert.match(told, /waits until you trust this folder: trust the workspace \(Workspaces: Manage Workspace Trust\)/);
      assert.ok(!told.includes("trusted_folders") && !told.includes("Neovim"), told);
      assert.deepStrictEqual(state.messages, [], "the extension showed a notification of its own");
      const opened = state.executed.filter(([id]) => id === "workbench.trust.manage");
      assert.strictEqual(opened.length, 4, "each palette command that needs trust opens Workspace Trust instead");
      assert.strictEqual(clients[0].requests.length, 0, "the palette asked the server for nothing it cannot do");
      assert.deepStrictEqual(analyzed, { scheduled: false, reason: "untrusted", message: told });
      assert.deepStrictEqual(validated, { error: "untrusted", message: told });
      assert.doesNotMatch(state.statusItems[0].text, /analyzing/);

      await connection.sendRequest("shutdown");
      await connection.sendNotification("exit");
    } catch (error) {
      throw new Error(`${error}\nserver stderr:\n${stderr().slice(-3000)}`);
    } finally {
      connection.dispose();
      proc.kill();
    }
  });
});

/**
 * `fuselens serve --stdio` started with the extension's server options, its requests for settings
 * answered by the extension's middleware `mw`, in a fresh cache folder (where the server keeps its
 * validation histories). `shown` collects the server's window/showMessage texts.
 */
function startServer(serverOptions: any, mw: any) {
  const cache = fs.mkdtempSync(path.join(os.tmpdir(), "fuselens-vscode-cache-"));
  const proc = spawn(serverOptions.command, serverOptions.args, {
    cwd: serverOptions.options.cwd,
    env: { ...process.env, XDG_CACHE_HOME: cache },
  });
  let stderr = "";
  proc.stderr.on("data", (chunk) => (stderr += chunk));
  const connection = createProtocolConnection(new StreamMessageReader(proc.stdout), new StreamMessageWriter(proc.stdin));
  const shown: string[] = [];
  connection.onNotification("window/showMessage", (p: { message: string }) => void shown.push(p.message));
  connection.onNotification("window/logMessage", () => undefined);
  connection.onRequest("workspace/configuration", (params: unknown) =>
    mw.workspace.configuration(params, undefined, () => assert.fail("the extension answers this itself")));
  connection.onRequest("client/registerCapability", () => null);
  connection.onRequest("window/workDoneProgress/create", () => null);
  // Work-done progress goes where the language client sends it: the middleware, which feeds the status bar.
  const progressed: (() => void)[] = []; // called after each progress notification is handled
  connection.onNotification("$/progress", (p: { token: string; value: any }) => {
    mw.handleWorkDoneProgress(p.token, p.value, () => undefined);
    progressed.forEach((f) => f());
  });
  return { proc, connection, shown, progressed, stderr: () => stderr };
}
