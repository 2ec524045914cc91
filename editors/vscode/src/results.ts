// The results view: a webview panel that shows what the server sends with each validation
// (`results_view`, built by contracts/results_view.py): per model the results table, its chart
// as a Plotly figure, and the earlier runs of the same file. Nothing is computed here: the page
// (media/results.js) lays out the server's text and hands its figures to plotly.js, which ships
// inside the extension (node_modules/plotly.js-dist-min) and loads under a nonce-only CSP.

import * as crypto from "crypto";
import * as path from "path";
import * as vscode from "vscode";

export interface HistoryTable {
  columns: string[];
  rows: string[][];
  title: string;
}

export interface ModelResults {
  name: string;
  heading: string;
  rows: string[][];
  whole_model: string;
  chart: { data: unknown[]; layout: Record<string, unknown> };
  history: HistoryTable;
  no_data?: string; // why there is no table or chart ("" when there are)
}

/** The server's results view of one validation (the fields the page reads). */
export interface ResultsView {
  file: string;
  time: string;
  where: string;
  summary: string;
  revision: string;
  versions: Record<string, string>;
  columns: string[];
  models: ModelResults[];
  problems: string[];
  earlier_runs: number;
  kind?: string;
}

export const RESULTS_VIEW_TYPE = "fuselens.results";
const PLOTLY = ["node_modules", "plotly.js-dist-min"];

/** The results view a server command's result carries, if any (a validation's, or the last one's). */
export function resultsViewOf(result: unknown): ResultsView | undefined {
  const view = (result as { results_view?: unknown } | undefined)?.results_view;
  return view && typeof view === "object" && Array.isArray((view as ResultsView).models)
    ? (view as ResultsView)
    : undefined;
}

/** The one results panel: created on first use, reused (and revealed) after. */
export class ResultsPanel {
  private panel: vscode.WebviewPanel | undefined;

  constructor(private readonly extensionUri: vscode.Uri) {}

  /** Show `view`; `preserveFocus` keeps the editor focused (when a validation opens it by itself). */
  show(view: ResultsView, preserveFocus: boolean): vscode.WebviewPanel {
    if (!this.panel) {
      this.panel = vscode.window.createWebviewPanel(
        RESULTS_VIEW_TYPE,
        "fuselens results",
        { viewColumn: vscode.ViewColumn.Beside, preserveFocus },
        {
          enableScripts: true,
          localResourceRoots: [vscode.Uri.joinPath(this.extensionUri, "media"), vscode.Uri.joinPath(this.extensionUri, ...PLOTLY)],
        },
      );
      this.panel.onDidDispose(() => (this.panel = undefined));
    } else {
      this.panel.reveal(undefined, preserveFocus);
    }
    this.panel.title = `fuselens results: ${path.basename(view.file)}`;
    this.panel.webview.html = resultsHtml(this.panel.webview, this.extensionUri, view, nonce());
    return this.panel;
  }

  /** After a validation: its results beside the editor, which keeps the focus. */
  showValidation(result: unknown): void {
    const view = resultsViewOf(result);
    if (view) {
      this.show(view, true);
    }
  }

  dispose(): void {
    this.panel?.dispose();
  }
}

/** The page: the view as a JSON block (data, never run), plotly.js and the page script, each allowed by the nonce. */
export function resultsHtml(webview: vscode.Webview, extensionUri: vscode.Uri, view: ResultsView, nonce: string): string {
  const asset = (...parts: string[]) => webview.asWebviewUri(vscode.Uri.joinPath(extensionUri, ...parts)).toString();
  const csp = [
    "default-src 'none'",
    `img-src ${webview.cspSource} data: blob:`,
    `font-src ${webview.cspSource}`,
    // plotly.js adds its own <style> elements and styles its nodes inline.
    `style-src ${webview.cspSource} 'unsafe-inline'`,
    `script-src 'nonce-${nonce}'`,
  ].join("; ");
  return `<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta http-equiv="Content-Security-Policy" content="${csp}">
<meta name="viewport" content="width=device-width, initial-scale=1">
<link rel="stylesheet" href="${asset("media", "results.css")}">
<title>fuselens results</title>
</head>
<body>
<div id="root"></div>
<script type="application/json" id="fuselens-results">${jsonInHtml(view)}</script>
<script nonce="${nonce}" src="${asset(...PLOTLY, "plotly.min.js")}"></script>
<script nonce="${nonce}" src="${asset("media", "results.js")}"></script>
</body>
</html>`;
}

/** JSON that cannot end the <script> block it sits in, nor start markup: `<`, `>` and `&` as escapes. */
export function jsonInHtml(value: unknown): string {
  return JSON.stringify(value)
    .replace(/</g, "\\u003c")
    .replace(/>/g, "\\u003e")
    .replace(/&/g, "\\u0026")
    .replace(/\u2028/g, "\\u2028")
    .replace(/\u2029/g, "\\u2029");
}

function nonce(): string {
  return crypto.randomBytes(16).toString("base64");
}
