#!/usr/bin/env bash
# Screenshots of the Emacs configuration (editors/emacs/fuselens-eglot.el) at work (see README.md
# beside this file).
#
#   editors/screenshots/emacs.sh [OUT_DIR]          (default: editors/screenshots)
#
# Writes, from a copy of examples/example_net.py (and examples/branchy.py beside it for the status):
#   emacs-hover.png    the hover of the cluster under point, through ElDoc in the echo area
#   emacs-results.png  the file's results buffer after M-x fuselens-eglot-validate in the Triton
#                      interpreter, and the server's summary in the echo area
#   emacs-status.png   two models one above the other: the mode line of the one validating says
#                      so, the other's does not
#
# How: the real Emacs (emacs -nw, Eglot from Debian's elpa-eglot) runs in a tmux pane
# (terminal_shot.sh) with only this configuration (an init file written below, a private HOME, the
# copy's folder in `fuselens-eglot-trusted-folders`) and walks through the scene.
#
# Environment:
#   EMACS            the Emacs to run (default: emacs on PATH)
#   FUSELENS_PYTHON  an interpreter with fuselens and torch (default: the repository's .venv)
#   CHROMIUM         the browser (default: chromium)
#   COLS, ROWS       the terminal size (default 172x54)
#   SCENES           which to take (default: all: "hover results status")
#   KEEP=1           keep the work folder (captured ANSI text, HTML, logs) and print its path
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
OUT_DIR=$(realpath -m "${1:-$HERE}")
EMACS=$(command -v "${EMACS:-emacs}")
PYTHON=${FUSELENS_PYTHON:-$REPO/.venv/bin/python}
CHROMIUM=${CHROMIUM:-chromium}
COLS=${COLS:-172}
ROWS=${ROWS:-54}
SCENES=${SCENES:-hover results status}
# C-g twice leaves any prompt or minibuffer; kill-emacs asks nothing.
QUIT_KEYS=(C-g C-g M-x kill-emacs Enter)

# shellcheck source=terminal_shot.sh
. "$HERE/terminal_shot.sh"
"$EMACS" --batch -q --eval "(progn (package-initialize) (require 'eglot))" 2>/dev/null ||
  { echo "no Eglot in $EMACS (Debian: apt-get install -y emacs-nox elpa-eglot)" >&2; exit 2; }
shot_setup emacs

# The init file: the configuration as the README sets it up, plus what makes the picture. The scene
# ($FUSELENS_SCENE) runs in steps polled every 250 ms, and writes $FUSELENS_READY when the screen
# shows what it is for.
cat >"$WORK/init.el" <<'ELISP'
;;; -*- lexical-binding: t; -*-
;; No native compilation of the packages in the background: in a fresh HOME it would start at every
;; run, take the CPU, and pop up its warnings over the scene.
(setq native-comp-deferred-compilation nil
      native-comp-async-report-warnings-errors nil)
(require 'package)
(package-initialize)  ; Debian's elpa-eglot is a package.el package
(setq inhibit-startup-screen t
      make-backup-files nil
      auto-save-default nil
      create-lockfiles nil)
(menu-bar-mode -1)
(load-theme 'modus-vivendi t)
(column-number-mode 1)
(setq split-width-threshold nil)  ; a new window (the results) below, the width of the frame
(add-hook 'prog-mode-hook #'display-line-numbers-mode)

(add-to-list 'load-path (getenv "FUSELENS_LISP"))
(require 'fuselens-eglot)
(setq fuselens-eglot-server-command
      (list (getenv "FUSELENS_PYTHON") "-P" "-m" "fuselens.cli.main" "serve" "--stdio"))
(setq fuselens-eglot-trusted-folders (list (getenv "FUSELENS_PROJECT")))
(setq fuselens-eglot-settings '(:compareInductor :json-false))
(setq fuselens-eglot-interpret t)  ; no GPU here: validate in the Triton interpreter
(fuselens-eglot-register)
(add-hook 'python-mode-hook #'eglot-ensure)

(defun shot-analyzed (buffer)
  "Non-nil once BUFFER's diagnostics name its clusters."
  (with-current-buffer buffer
    (cl-some (lambda (d) (string-search "fusable:" (flymake-diagnostic-text d)))
             (flymake-diagnostics))))

(defun shot-model () (get-file-buffer (expand-file-name "example_net.py" (getenv "FUSELENS_PROJECT"))))

(defun shot-goto (line column)
  (select-window (get-buffer-window (shot-model)))
  (goto-char (point-min))
  (forward-line (1- line))
  (move-to-column column))

(defun shot-results () (get-buffer "*fuselens results: example_net.py*"))

;; Each scene: a list of steps; a step returns non-nil when it is done.
(defvar shot-scenes
  `((hover
     ,(lambda () (shot-analyzed (shot-model)))
     ,(lambda ()  ; ElDoc in the echo area, as when point comes to rest on the middle line of c1
        (shot-goto 24 18)  ; x = torch.sigmoid(x)
        (setq last-command 'next-line)  ; (ElDoc speaks up after a motion command)
        (eldoc-print-current-symbol-info)
        t)
     ,(lambda () (string-search "c1 ·" (or (current-message) ""))))
    (results
     ,(lambda () (shot-analyzed (shot-model)))
     ,(lambda () (shot-goto 18 8) (fuselens-eglot-validate) t)
     ,(lambda () (shot-results)))
    (status  ; each window's mode line is its own buffer's: one validating, the other not
     ,(lambda () (shot-analyzed (shot-model)))
     ,(lambda ()
        (select-window (split-window-below))
        (find-file (expand-file-name "branchy.py" (getenv "FUSELENS_PROJECT")))
        t)
     ,(lambda () (shot-analyzed (current-buffer)))
     ,(lambda () (shot-goto 18 8) (fuselens-eglot-validate) t))))

(defvar shot-steps (alist-get (intern (getenv "FUSELENS_SCENE")) shot-scenes))
(defvar shot-timer nil)
(defun shot-tick ()
  (if (null shot-steps)
      (progn
        (cancel-timer shot-timer)
        (redisplay t)
        (write-region "" nil (getenv "FUSELENS_READY") nil 'silent))
    (when (funcall (car shot-steps))
      (pop shot-steps))))
(setq shot-timer (run-with-timer 0.5 0.25 #'shot-tick))
ELISP

mkdir -p "$OUT_DIR"
echo "$("$EMACS" --version | head -1), ${COLS}x${ROWS}"

take() { # take SCENE OUT.png
  local scene=$1 out=$2 project=$WORK/$1/models
  shot_project "$project" example_net.py branchy.py
  # COLORTERM: Emacs draws in 24-bit colour on a terminal whose terminfo has none (tmux-256color).
  shot_start "$project" "$scene" FUSELENS_LISP="$REPO/editors/emacs" COLORTERM=truecolor \
    "$EMACS" -nw -q -l "$WORK/init.el" example_net.py
  shot_wait "$scene"
  # The status scene is of a validation that runs.
  if [[ $scene == status ]]; then shot_capture "$scene" "fuselens: validating"; else shot_capture "$scene"; fi
  shot_render "$scene" "$out"
}

for scene in $SCENES; do
  case $scene in
    hover) take hover "$OUT_DIR/emacs-hover.png" ;;
    results) take results "$OUT_DIR/emacs-results.png" ;;
    status) take status "$OUT_DIR/emacs-status.png" ;;
    *) echo "unknown scene $scene (hover, results, status)" >&2; exit 2 ;;
  esac
done
