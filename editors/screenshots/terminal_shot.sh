# Screenshots of an editor that runs in a terminal: sourced by nvim.sh and emacs.sh.
#
# The editor runs in a detached tmux pane of a fixed size, with a private HOME, in a work folder
# of its own; `tmux capture-pane -e` takes the screen with its colours, terminal_html.py turns it
# into an HTML page of the same grid, and headless Chromium renders that. No display.
#
# The sourcing script sets HERE, REPO, PYTHON, CHROMIUM, COLS, ROWS and QUIT_KEYS (the keys,
# as `tmux send-keys` takes them, that quit the editor without a question), then calls
#   shot_setup NAME                   the work folder ($WORK) and the tmux server, gone at exit
#   shot_project DIR FILE...          DIR holding copies of examples/FILE... and a pyproject.toml
#   shot_start DIR SCENE CMD...       the editor (CMD) in a pane in DIR; the scene in its env
#   shot_wait SCENE [TEXT]            until the editor writes $FUSELENS_READY, or TEXT is on screen
#   shot_capture SCENE [PASSING]      the screen, as $WORK/SCENE.ansi; the editor quit
#   shot_render SCENE OUT             that screen as the picture OUT
# and may define shot_poll, run at each turn of a shot_wait for the ready file (to answer a prompt,
# say).

for tool in tmux "$CHROMIUM" python3; do
  command -v "$tool" >/dev/null || { echo "missing $tool (Debian: apt-get install -y tmux chromium)" >&2; exit 2; }
done
[[ -x $PYTHON ]] || { echo "no Python with fuselens at $PYTHON (set FUSELENS_PYTHON)" >&2; exit 2; }

shot_setup() {
  WORK=$(mktemp -d "/tmp/fuselens-$1-shots.XXXXXX")
  SOCKET=$WORK/tmux.sock
  printf '%s\n' 'set -g status off' 'set -g default-terminal tmux-256color' 'set -sg escape-time 0' >"$WORK/tmux.conf"
  trap shot_cleanup EXIT
}

# Quit the editor (and with it the server) before its pane goes: killing the pane alone can leave
# the editor, and the server under it, running.
shot_quit() {
  tmux -S "$SOCKET" send-keys "${QUIT_KEYS[@]}" 2>/dev/null || return 0
  for _ in $(seq 40); do
    tmux -S "$SOCKET" has-session 2>/dev/null || break
    sleep 0.25
  done
  tmux -S "$SOCKET" kill-server 2>/dev/null || true
}

shot_cleanup() {
  shot_quit
  if [[ ${KEEP:-} == 1 ]]; then echo "work folder: $WORK"; else rm -rf "$WORK"; fi
}

shot_project() {
  local dir=$1 file
  shift
  mkdir -p "$dir"
  for file in "$@"; do cp "$REPO/examples/$file" "$dir/"; done
  printf '[project]\nname = "models"\n' >"$dir/pyproject.toml"
}

shot_start() {
  local dir=$1 scene=$2 home=$WORK/$2/home
  shift 2
  mkdir -p "$home"
  rm -f "$WORK/ready"
  tmux -S "$SOCKET" -f "$WORK/tmux.conf" new-session -d -x "$COLS" -y "$ROWS" -c "$dir" \
    env HOME="$home" XDG_CONFIG_HOME="$home/.config" XDG_CACHE_HOME="$home/.cache" \
        XDG_DATA_HOME="$home/.local/share" XDG_STATE_HOME="$home/.local/state" \
        FUSELENS_PYTHON="$PYTHON" FUSELENS_SCENE="$scene" FUSELENS_PROJECT="$dir" \
        FUSELENS_READY="$WORK/ready" "$@"
}

shot_screen() { tmux -S "$SOCKET" capture-pane -p; }

shot_poll() { :; }

shot_wait() {
  local scene=$1 text=${2:-}
  for _ in $(seq 1500); do
    [[ -e $WORK/ready ]] && return 0
    if [[ -n $text ]] && shot_screen | grep -q "$text"; then
      return 0
    fi
    [[ -z $text ]] && shot_poll
    sleep 0.2
  done
  shot_screen
  echo "$scene: timed out" >&2
  exit 1
}

# PASSING: the text of a passing state the scene is of ("fuselens: validating"): the screen is taken
# at once, and the scene fails if the text is gone from it. Otherwise the screen settles first.
shot_capture() {
  local scene=$1 passing=${2:-}
  [[ -n $passing ]] || sleep 1
  tmux -S "$SOCKET" capture-pane -e -N -p >"$WORK/$scene.ansi"
  shot_quit
  if [[ -n $passing ]] && ! grep -q "$passing" "$WORK/$scene.ansi"; then
    echo "$scene: \"$passing\" was over before the screen was taken" >&2
    exit 1
  fi
}

shot_render() {
  local scene=$1 out=$2 size
  size=$(python3 "$HERE/terminal_html.py" "$WORK/$scene.ansi" "$WORK/$scene.html" "$COLS" "$ROWS")
  "$CHROMIUM" --headless --no-sandbox --disable-gpu --disable-background-networking --no-first-run \
    --hide-scrollbars --user-data-dir="$WORK/chromium" --screenshot="$out" --window-size="$size" \
    "file://$WORK/$scene.html" 2>/dev/null
  echo "wrote $out (${size/,/x})"
}
