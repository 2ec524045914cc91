// Packaging: `vsce package`, as a person runs it in a terminal, makes the .vsix without stopping at a
// question (a manifest without a repository, an extension without a LICENSE each ask "Do you want to
// continue? [y/N]" there). The terminal is `script`'s pseudo-terminal, typed "n" and Enter: a question
// is answered "no", and vsce stops. Skipped where util-linux's `script` is missing.

import * as assert from "assert";
import { spawnSync } from "child_process";
import * as fs from "fs";
import * as os from "os";
import * as path from "path";

const ROOT = path.resolve(__dirname, "..", "..");

function hasScript(): boolean {
  return spawnSync("script", ["--version"], { encoding: "utf8" }).status === 0;
}

describe("packaging", function () {
  this.timeout(180_000); // (the prepublish step compiles the extension)

  it("vsce package in a terminal makes the .vsix without asking anything", function () {
    if (!hasScript()) {
      this.skip();
    }
    const vsix = path.join(fs.mkdtempSync(path.join(os.tmpdir(), "fuselens-vsix-")), "fuselens.vsix");
    const done = spawnSync("script", ["-qec", `npx vsce package --out ${JSON.stringify(vsix)}`, "/dev/null"], {
      cwd: ROOT,
      encoding: "utf8",
      input: "n\n",
      timeout: 150_000,
    });
    const said = done.stdout + done.stderr;
    assert.doesNotMatch(said, /Do you want to continue/, said);
    assert.strictEqual(done.status, 0, said);
    assert.ok(fs.statSync(vsix).size > 0, said);
  });
});
