#!/usr/bin/env bash
# Screenshots of the VS Code extension at work, for the README (see README.md beside this file):
# code-server (VS Code in a browser, from npm) driven by Debian's headless Chromium through
# playwright-core.
#
#   editors/screenshots/vscode.sh [OUT_DIR]     (default: docs/images)
#
# The first run installs code-server (~330 MB, native modules built from source) into
# $FUSELENS_CODE_SERVER_CACHE (default ~/.cache/fuselens-code-server); later runs reuse it. Needs,
# from Debian:
#   apt-get install -y chromium ripgrep build-essential pkg-config python3 libkrb5-dev
# and Node 20 (code-server 4.100.x is the last release that runs on Node 20), plus the
# repository's .venv (or $FUSELENS_PYTHON) with fuselens and torch installed.
#
# It builds and packages the extension, installs the .vsix into a fresh code-server profile whose
# settings point fuselens.server.python at the venv, and runs vscode.mjs, which takes each
# scene in a workspace holding a copy of examples/example_net.py. SCENES (default: all of
# vscode.mjs's) picks some, e.g. SCENES="untrusted hover".
set -euo pipefail

HERE="$(cd "$(dirname "$0")" && pwd)"
REPO="$(cd "$HERE/../.." && pwd)"
EXT="$REPO/editors/vscode"
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
(
  cd "$EXT"
  [ -d node_modules ] || npm ci
  npm run compile
  npx vsce package -o "$CACHE/fuselens.vsix" </dev/null
)

WORK="$(mktemp -d /tmp/fuselens.XXXX)"
trap 'rm -rf "$WORK"' EXIT
node "$HERE/vscode.mjs" --cache "$CACHE" --work "$WORK" --python "$PYTHON" --chromium "$CHROMIUM" \
  --vsix "$CACHE/fuselens.vsix" --model "$REPO/examples/example_net.py" --out "$OUT_DIR" ${SCENES:+--scenes "$SCENES"}
