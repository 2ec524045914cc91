#!/usr/bin/env bash
# A screenshot of the extension at work in a real VS Code: code-server (VS Code in a browser,
# from npm) driven by Debian's headless Chromium through playwright-core.
#
#   editors/vscode/scripts/screenshot.sh [OUT_DIR]     (default: docs/images)
#
# Not run in CI: the first run installs code-server (~400 MB, native modules compiled from
# source) into $FUSELENS_CODE_SERVER_CACHE (default ~/.cache/fuselens-code-server); later runs
# reuse it. Needs, from Debian:
#   apt-get install -y chromium ripgrep build-essential pkg-config python3 libkrb5-dev
# and Node 20 (code-server 4.100.x is the last release that runs on Node 20), plus the
# repository's .venv (or $FUSELENS_PYTHON) with fuselens and torch installed.
#
# What it does: builds and packages the extension, installs the .vsix into a fresh
# code-server profile whose settings point fuselens.server.python at the venv, opens a copy
# of examples/example_net.py in a workspace, trusts it, waits for the diagnostics, inlay hints
# and code lens, and saves vscode.png (the editor) and vscode-hover.png (a cluster's hover).
set -euo pipefail

HERE="$(cd "$(dirname "$0")" && pwd)"
EXT="$(dirname "$HERE")"
REPO="$(cd "$EXT/../.." && pwd)"
OUT_DIR="$(mkdir -p "${1:-$REPO/docs/images}" && cd "${1:-$REPO/docs/images}" && pwd)"
CACHE="${FUSELENS_CODE_SERVER_CACHE:-$HOME/.cache/fuselens-code-server}"
PYTHON="${FUSELENS_PYTHON:-$REPO/.venv/bin/python}"
CODE_SERVER_VERSION=4.100.3
PLAYWRIGHT_VERSION=1.65.1
CHROMIUM="${CHROMIUM:-/usr/bin/chromium}"

for tool in "$CHROMIUM" rg g++ make pkg-config node npm; do
  command -v "$tool" >/dev/null || { echo "missing $tool: apt-get install -y chromium ripgrep build-essential pkg-config libkrb5-dev" >&2; exit 2; }
done
[ -x "$PYTHON" ] || { echo "no Python with fuselens at $PYTHON (set FUSELENS_PYTHON)" >&2; exit 2; }

# --- code-server ---------------------------------------------------------------------------
# Its own postinstall cannot run here: it downloads ripgrep from GitHub, and node-pty's calls
# `npx node-gyp` without --yes. So: install without scripts, use Debian's rg, and build the
# native modules against the local Node headers (/usr/include/node) ourselves.
install_code_server() {
  mkdir -p "$CACHE"
  cd "$CACHE"
  [ -f package.json ] || npm init -y >/dev/null
  npm install --ignore-scripts --no-audit --no-fund "code-server@$CODE_SERVER_VERSION" "playwright-core@$PLAYWRIGHT_VERSION"
  export npm_config_nodedir=/usr npm_config_yes=true
  npm rebuild argon2 --foreground-scripts
  cd node_modules/code-server/lib/vscode
  npm install --omit=dev --ignore-scripts --no-audit --no-fund
  mkdir -p node_modules/@vscode/ripgrep/bin
  ln -sf "$(command -v rg)" node_modules/@vscode/ripgrep/bin/rg  # its postinstall skips an existing bin/
  npm rebuild --foreground-scripts @vscode/spdlog native-watchdog node-pty kerberos @vscode/deviceid || true
  test -f node_modules/node-pty/build/Release/pty.node  # the one that matters for the terminal
  ln -sfn node_modules node_modules.asar                # what code-server's postinstall would link
  (cd bin/remote-cli && ln -sf code-linux.sh code-server)
  (cd bin/helpers && ln -sf browser-linux.sh browser.sh)
  (cd extensions && npm install --omit=dev --ignore-scripts --no-audit --no-fund)
  touch "$CACHE/.installed-$CODE_SERVER_VERSION"
}
[ -f "$CACHE/.installed-$CODE_SERVER_VERSION" ] || (install_code_server)

# --- the extension -------------------------------------------------------------------------
cd "$EXT"
[ -d node_modules ] || npm ci
npm run compile
npx vsce package -o "$CACHE/fuselens.vsix" </dev/null

WORK="$(mktemp -d -t fuselens-screenshot-XXXXXX)"
trap 'rm -rf "$WORK"' EXIT
export XDG_CONFIG_HOME="$WORK/config" XDG_DATA_HOME="$WORK/data"  # keep code-server's config out of ~
"$CACHE/node_modules/.bin/code-server" --user-data-dir "$WORK/user" --extensions-dir "$WORK/extensions" \
  --install-extension "$CACHE/fuselens.vsix"

node "$HERE/screenshot.mjs" --cache "$CACHE" --work "$WORK" --python "$PYTHON" --chromium "$CHROMIUM" \
  --model "$REPO/examples/example_net.py" --out "$OUT_DIR"
