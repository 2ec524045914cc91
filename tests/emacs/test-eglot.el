;;; test-eglot.el --- drive fuselens-eglot in `emacs --batch' for tests/test_emacs.py  -*- lexical-binding: t; -*-
;; Opens $FUSELENS_MODEL with the user-facing configuration, then uses Eglot's own paths
;; (Flymake diagnostics, the ElDoc hover function, eglot-code-actions) and the
;; fuselens-eglot commands, and writes what it saw to $FUSELENS_RESULTS as JSON.

(require 'package)
(package-initialize)  ; -Q skips it; Debian's elpa-eglot is a package.el package
(require 'json)
(require 'flymake)
(require 'fuselens-eglot)

(defvar test-results nil)
(defun test-put (key value) (setq test-results (plist-put test-results key value)))
(defun test-save ()
  (with-temp-file (getenv "FUSELENS_RESULTS")
    (insert (let ((json-encoding-pretty-print nil)) (json-encode test-results)))))
(defun test-wait (seconds predicate)
  (let ((end (+ (float-time) seconds)))
    (while (and (not (funcall predicate)) (< (float-time) end))
      (accept-process-output nil 0.1))
    (funcall predicate)))
(defmacro test-step (name &rest body)
  `(condition-case err
       (progn ,@body (test-put :steps (vconcat (plist-get test-results :steps) (list ,name))))
     (error (test-put (intern (concat ":error-" ,name)) (error-message-string err))))
  )
(defun test-fuselens-diags ()
  (cl-remove-if-not (lambda (d) (string-match-p "fusable\\|pattern" (flymake-diagnostic-text d)))
                    (flymake-diagnostics)))

(setq fuselens-eglot-server-command
      (list (getenv "FUSELENS_PYTHON") "-P" "-m" "fuselens.cli.main" "serve" "--stdio"))
(setq fuselens-eglot-trusted-folders (list (getenv "FUSELENS_TRUSTED")))
(setq fuselens-eglot-settings '(:severity "warning" :compareInductor :json-false))
(setq fuselens-eglot-interpret t)
(fuselens-eglot-register)

(test-put :emacs emacs-version)
(test-put :eglot (package-version-join (package-desc-version (cadr (assq 'eglot package-alist)))))

(find-file (getenv "FUSELENS_MODEL"))
(python-mode)

(test-step "start"
  (apply #'eglot (eglot--guess-contact))
  (unless (test-wait 30 (lambda () (eglot-current-server))) (error "no server"))
  (test-put :initialization-options
            (eglot-initialization-options (eglot-current-server))))

(test-step "diagnostics"
  ;; In batch mode nothing runs Flymake after commands, so start it as a command would.
  (unless (test-wait 240 (lambda () (flymake-start) (>= (length (test-fuselens-diags)) 3)))
    (error "no diagnostics"))
  (test-put :diagnostics
            (vconcat (mapcar (lambda (d) (list :line (line-number-at-pos (flymake-diagnostic-beg d))
                                               :type (symbol-name (flymake-diagnostic-type d))
                                               :text (flymake-diagnostic-text d)))
                             (test-fuselens-diags)))))

(test-step "hover"
  (goto-char (point-min)) (forward-line 18) (forward-char 12)  ; line 19: x = F.relu(x)
  (let (hover)
    (eglot-hover-eldoc-function (lambda (info &rest _) (setq hover info)))
    (unless (test-wait 15 (lambda () hover)) (error "no hover"))
    (test-put :hover (substring-no-properties hover))))

(test-step "validate"
  (let ((result (fuselens-eglot-validate)))
    (test-put :validation-mode (plist-get result :mode))
    (test-put :validation
              (vconcat (cl-loop for m across (plist-get result :models)
                                append (cl-loop for c across (plist-get m :clusters)
                                                collect (list (plist-get c :id) (plist-get c :status))))))))

(test-step "quick fix"
  (goto-char (point-min)) (forward-line 17) (forward-char 8)  ; line 18: first line of c0
  (let* ((actions (eglot-code-actions (point) (point)))
         (title (cl-loop for a in actions for title = (plist-get a :title)
                         when (string-prefix-p "Fuse lines 18" title) return title))
         (last-nonmenu-event ?\r))  ; not a mouse event: Eglot asks with completing-read
    (test-put :actions (vconcat (mapcar (lambda (a) (plist-get a :title)) actions)))
    (cl-letf (((symbol-function 'completing-read) (lambda (&rest _) title)))
      (eglot--read-execute-code-action actions (eglot-current-server)))
    (test-put :buffer (buffer-substring-no-properties (point-min) (point-max)))
    (let ((module (expand-file-name "example_net_kernels.py" (file-name-directory (buffer-file-name)))))
      (test-wait 15 (lambda () (file-exists-p module)))
      (test-put :module (and (file-exists-p module)
                             (with-temp-buffer (insert-file-contents module) (buffer-string)))))))

(test-save)
(ignore-errors (eglot-shutdown (eglot-current-server)))
(kill-emacs 0)
