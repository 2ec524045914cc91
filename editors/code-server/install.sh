#!/usr/bin/env bash
# VS Code in a browser for the extension's end-to-end tests (tests/test_vscode.py) and its
# screenshots (editors/screenshots/vscode.sh): code-server and playwright-core from npm, installed
# into $FUSELENS_CODE_SERVER_CACHE (default ~/.cache/fuselens-code-server), ~330 MB, its native
# modules built from source. playwright-core drives Debian's /usr/bin/chromium: no browser is
# downloaded.
#
#   editors/code-server/install.sh install        install, unless it is there already
#   editors/code-server/install.sh check          exit 0 if it is installed, else say what is missing
#   editors/code-server/install.sh package VSIX   compile and package the extension into VSIX
#
# Needs, from Debian:
#   apt-get install -y chromium ripgrep build-essential pkg-config python3 libkrb5-dev
# and Node 20 (code-server 4.100.x is the last release that runs on Node 20).
set -euo pipefail

HERE="$(cd "$(dirname "$0")" && pwd)"
EXT="$(cd "$HERE/../vscode" && pwd)"
CACHE="${FUSELENS_CODE_SERVER_CACHE:-$HOME/.cache/fuselens-code-server}"
CODE_SERVER_VERSION=4.100.3
PLAYWRIGHT_VERSION=1.65.1
CHROMIUM="${CHROMIUM:-/usr/bin/chromium}"
INSTALLED="$CACHE/.installed-$CODE_SERVER_VERSION"

need_tools() {
  for tool in "$@"; do
    command -v "$tool" >/dev/null || { echo "missing $tool: apt-get install -y chromium ripgrep build-essential pkg-config libkrb5-dev, and Node 20" >&2; exit 2; }
  done
}

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
  touch "$INSTALLED"
}

# The .vsix a user would install: compiled, with its runtime dependencies only.
package_extension() {
  local vsix="$1"
  cd "$EXT"
  [ -d node_modules ] || npm ci --no-audit --no-fund >&2
  npm run compile >&2
  npx vsce package -o "$vsix" </dev/null >&2
}

case "${1:-}" in
  install)
    need_tools "$CHROMIUM" rg g++ make pkg-config node npm
    [ -f "$INSTALLED" ] || (install_code_server) >&2  # (stdout: the folder, for a caller to read)
    echo "$CACHE"
    ;;
  check)
    need_tools "$CHROMIUM" node npm
    [ -f "$INSTALLED" ] || { echo "code-server $CODE_SERVER_VERSION is not installed in $CACHE (editors/code-server/install.sh install)" >&2; exit 2; }
    echo "$CACHE"
    ;;
  package)
    [ -n "${2:-}" ] || { echo "usage: $0 package VSIX" >&2; exit 2; }
    need_tools node npm
    package_extension "$(cd "$(dirname "$2")" && pwd)/$(basename "$2")"
    ;;
  *)
    echo "usage: $0 install | check | package VSIX" >&2
    exit 2
    ;;
esac
