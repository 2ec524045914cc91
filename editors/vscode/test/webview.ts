// The results panel's page as a browser shows it: its HTML in jsdom, the scripts it names
// (plotly.js and media/results.js) run in the order it names them, under the rules its
// Content-Security-Policy sets (each script carries the nonce; no eval, no Function()).

import * as assert from "assert";
import * as fs from "fs";
import { DOMWindow, JSDOM, VirtualConsole } from "jsdom";
import { WEBVIEW_SCHEME } from "./fakes";

export interface RenderedPage {
  window: DOMWindow;
  document: Document;
  errors: string[];
  scripts: string[]; // the local files the page loaded, in order
}

/** The CSP's script nonce. */
export function scriptNonce(html: string): string {
  const csp = /http-equiv="Content-Security-Policy" content="([^"]*)"/.exec(html)?.[1] ?? "";
  const nonce = /script-src 'nonce-([^']+)'/.exec(csp)?.[1];
  assert.ok(nonce, `no script nonce in the CSP: ${csp}`);
  return nonce;
}

export async function renderPage(html: string): Promise<RenderedPage> {
  const errors: string[] = [];
  const virtualConsole = new VirtualConsole();
  virtualConsole.on("jsdomError", (error) => errors.push(String(error.message)));
  virtualConsole.on("error", (...args: unknown[]) => errors.push(args.map(String).join(" ")));
  const dom = new JSDOM(html, { runScripts: "outside-only", pretendToBeVisual: true, virtualConsole });
  const window = dom.window;
  const run = window.eval.bind(window) as (code: string) => unknown;
  // What jsdom lacks and plotly.js touches: canvas contexts (for text metrics), TextDecoder, object URLs.
  (window.HTMLCanvasElement.prototype as any).getContext = () => null;
  Object.assign(window, { TextDecoder, TextEncoder });
  (window.URL as any).createObjectURL = () => "blob:fake";
  // The CSP has no 'unsafe-eval': neither eval nor Function() may run in the page.
  run(`(() => {
    const blocked = () => { throw new EvalError("blocked by the Content-Security-Policy"); };
    blocked.prototype = Function.prototype;
    Object.defineProperty(Function.prototype, "constructor", { value: blocked });
    globalThis.Function = blocked;
    globalThis.eval = blocked;
  })()`);
  const nonce = scriptNonce(html);
  const scripts: string[] = [];
  for (const script of Array.from(window.document.querySelectorAll("script[src]"))) {
    assert.strictEqual(script.getAttribute("nonce"), nonce, `script ${script.getAttribute("src")} without the nonce`);
    const src = script.getAttribute("src") ?? "";
    assert.ok(src.startsWith(WEBVIEW_SCHEME), `a script from outside the extension: ${src}`);
    const file = src.slice(WEBVIEW_SCHEME.length);
    scripts.push(file);
    run(fs.readFileSync(file, "utf8"));
  }
  await (window as any).fuselensDrawn;
  return { window, document: window.document, errors, scripts };
}

/** The cells of each row of a table, as text. */
export function tableRows(table: Element): string[][] {
  return Array.from(table.querySelectorAll("tbody tr")).map((row) =>
    Array.from(row.querySelectorAll("td")).map((cell) => cell.textContent ?? ""),
  );
}

export function tableColumns(table: Element): string[] {
  return Array.from(table.querySelectorAll("thead th")).map((cell) => cell.textContent ?? "");
}
