#!/usr/bin/env bash
# Screenshots of the VS Code extension at work, for the README (see README.md beside this file):
# code-server (VS Code in a browser, from npm) driven by Debian's headless Chromium through
# playwright-core.
#
#   editors/screenshots/vscode.sh [OUT_DIR]     (default: docs/images)
#
# The first run installs code-server (~330 MB, native modules built from source) into
# $FUSELENS_CODE_SERVER_CACHE (default ~/.cache/fuselens-code-server) with
# editors/code-server/install.sh; later runs reuse it. Needs, from Debian:
#   apt-get install -y chromium ripgrep build-essential pkg-config python3 libkrb5-dev
# and Node 20 (code-server 4.100.x is the last release that runs on Node 20), plus the
# repository's .venv (or $FUSELENS_PYTHON) with fuselens and torch installed.
#
# It packages the extension, installs the .vsix into a fresh code-server profile whose settings
# point fuselens.server.python at the venv, and runs vscode.mjs, which takes each scene in a
# workspace holding a copy of examples/example_net.py. SCENES (default: all of vscode.mjs's)
# picks some, e.g. SCENES="untrusted hover".
set -euo pipefail

HERE="$(cd "$(dirname "$0")" && pwd)"
REPO="$(cd "$HERE/../.." && pwd)"
OUT_DIR="$(mkdir -p "${1:-$REPO/docs/images}" && cd "${1:-$REPO/docs/images}" && pwd)"
PYTHON="${FUSELENS_PYTHON:-$REPO/.venv/bin/python}"
CHROMIUM="${CHROMIUM:-/usr/bin/chromium}"
INSTALL="$REPO/editors/code-server/install.sh"

[ -x "$PYTHON" ] || { echo "no Python with fuselens at $PYTHON (set FUSELENS_PYTHON)" >&2; exit 2; }
CACHE="$("$INSTALL" install)"

WORK="$(mktemp -d /tmp/fuselens.XXXX)"
trap 'rm -rf "$WORK"' EXIT
"$INSTALL" package "$WORK/fuselens.vsix"
node "$HERE/vscode.mjs" --cache "$CACHE" --work "$WORK" --python "$PYTHON" --chromium "$CHROMIUM" \
  --vsix "$WORK/fuselens.vsix" --model "$REPO/examples/example_net.py" --out "$OUT_DIR" ${SCENES:+--scenes "$SCENES"}
