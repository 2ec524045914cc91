;;; test-eglot.el --- drive fuselens-eglot in `emacs --batch' for tests/test_emacs.py  -*- lexical-binding: t; -*-
;; Opens $FUSELENS_MODEL with the user-facing configuration, then uses Eglot's own paths
;; (Flymake diagnostics, the ElDoc hover function, eglot-code-actions) and the
;; fuselens-eglot commands, and writes what it saw to $FUSELENS_RESULTS as JSON.
;; $FUSELENS_MODE "library": a transformers model instead, and two quick fixes of clusters in
;; the library's code, one after the other.  "checkout": the model in a git repository, a syntax
;; error saved, then `git checkout' of the file; then a validation whose whole-model check ends in
;; an error, and what the user is told.

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
(defun test-fix (prefix)
  "Apply the code action at point whose title starts with PREFIX, as a user picks it; return the titles."
  (let* ((actions (eglot-code-actions (point) (point)))
         (title (cl-loop for a in actions for title = (plist-get a :title)
                         when (string-prefix-p prefix title) return title))
         (last-nonmenu-event ?\r))  ; not a mouse event: Eglot asks with completing-read
    (unless title (error "no action %s among %S" prefix (mapcar (lambda (a) (plist-get a :title)) actions)))
    (cl-letf (((symbol-function 'completing-read) (lambda (&rest _) title)))
      (eglot--read-execute-code-action actions (eglot-current-server)))
    (mapcar (lambda (a) (plist-get a :title)) actions)))
(defun test-file-text (file)
  (and (file-exists-p file) (with-temp-buffer (insert-file-contents file) (buffer-string))))
(defun test-modified-buffers ()
  "The names of the buffers visiting a file with changes not saved."
  (vconcat (mapcar #'buffer-name (cl-remove-if-not (lambda (b) (and (buffer-file-name b) (buffer-modified-p b)))
                                                   (buffer-list)))))
(defvar test-messages nil "What Eglot told the user (the server's window/showMessage among it), newest first.")
(advice-add 'eglot--message :before
            (lambda (format &rest args) (push (apply #'format-message format args) test-messages)))
(defun test-syntax-error-p ()
  (flymake-start)
  (cl-some (lambda (d) (string-search "SyntaxError" (flymake-diagnostic-text d))) (flymake-diagnostics)))
(defun test-diags-matching (text)
  (flymake-start)
  (cl-remove-if-not (lambda (d) (string-search text (flymake-diagnostic-text d))) (test-fuselens-diags)))

;; fuselens-eglot-validate and -profile return at once; their answer comes to this hook.
(defvar test-answered nil "The last validation's or profile's answer, as fuselens-eglot hands it on.")
(add-hook 'fuselens-eglot-result-functions (lambda (_buffer result) (setq test-answered result)))
(defun test-messages-say (text)
  (with-current-buffer (messages-buffer)
    (save-excursion (goto-char (point-min)) (and (search-forward text nil t) t))))
(defun test-results-buffer ()
  (with-current-buffer (format "*fuselens results: %s*" (file-name-nondirectory (getenv "FUSELENS_MODEL")))
    (list :text (buffer-substring-no-properties (point-min) (point-max)) :read-only buffer-read-only)))

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

(when (equal (getenv "FUSELENS_MODE") "library")
  (let ((module (expand-file-name "llama_user_kernels.py" (file-name-directory (buffer-file-name))))
        (norm "patch of LlamaRMSNorm.forward (")
        (mlp "patch of LlamaMLP.forward ("))
    (test-step "library diagnostics"
      (unless (test-wait 300 (lambda () (test-diags-matching mlp))) (error "no diagnostics of the library's clusters"))
      (test-put :clusters-before (length (test-diags-matching "fusable:"))))
    (test-step "first library fix"
      (goto-char (point-min)) (search-forward "model = LlamaForCausalLM") (beginning-of-line)
      (test-put :first-titles (vconcat (test-fix "Fuse pow → mean")))
      (save-buffer)  ; the model's buffer, the one the user edits; no other is saved
      (unless (test-wait 300 (lambda () (null (test-diags-matching norm)))) (error "no analysis after saving"))
      (test-put :first-module (test-file-text module))
      (test-put :clusters-between (length (test-diags-matching "fusable:"))))
    (test-step "second library fix"
      (goto-char (point-min)) (search-forward "model = LlamaForCausalLM") (beginning-of-line)
      (test-put :second-titles (vconcat (test-fix "Fuse linear → silu → mul")))
      (test-wait 15 (lambda () (string-search "modeling_llama.LlamaMLP.forward: " (or (test-file-text module) ""))))
      (test-put :second-module (test-file-text module))
      (test-put :modified-buffers (test-modified-buffers))
      (unless (test-wait 300 (lambda () (and (test-diags-matching "fusable:") (null (test-diags-matching mlp)))))
        (error "the MLP's cluster is still there"))
      (test-put :clusters-after (length (test-diags-matching "fusable:")))))
  (test-save)
  (ignore-errors (eglot-shutdown (eglot-current-server)))
  (kill-emacs 0))

(when (equal (getenv "FUSELENS_MODE") "checkout")
  (let* ((dir (file-name-directory (buffer-file-name)))
         (name (file-name-nondirectory (buffer-file-name)))
         (git (lambda (&rest args)
                (unless (zerop (apply #'call-process "git" nil nil nil "-C" dir
                                      "-c" "user.name=t" "-c" "user.email=t@example.com" args))
                  (error "git %S failed" args)))))
    (test-step "diagnostics"
      (unless (test-wait 240 (lambda () (= 3 (length (test-diags-matching "fusable:"))))) (error "no diagnostics")))
    (test-step "syntax error saved"
      (funcall git "init" "-q")
      (funcall git "add" name)
      (funcall git "commit" "-q" "-m" "a model")
      (goto-char (point-min)) (search-forward "x = F.relu(x)") (delete-char -1)
      (save-buffer)
      (unless (test-wait 60 #'test-syntax-error-p) (error "no syntax error")))
    (test-step "checkout"
      (let ((start (float-time)))
        (funcall git "checkout" "--" name)
        ;; What auto-revert-mode, magit and vc do once a file changed under a buffer without unsaved
        ;; changes: revert it, keeping its modes.
        (revert-buffer 'ignore-auto 'dont-ask 'preserve-modes)
        (unless (test-wait 60 (lambda () (and (not (test-syntax-error-p))
                                              (= 3 (length (test-diags-matching "fusable:"))))))
          (error "the diagnostics of the file checked out did not come"))
        (test-put :checkout-seconds (- (float-time) start))))
    (test-step "validation error"
      ;; The kernel module's name is taken by a file of the user's: the whole-model check cannot run.
      (write-region "def mine():\n    pass\n" nil (expand-file-name "example_net_kernels.py" dir))
      (setq test-messages nil test-answered nil)
      (fuselens-eglot-validate)
      (unless (test-wait 300 (lambda () test-answered)) (error "no validation result"))
      (let ((result test-answered))
        (test-put :whole-model (plist-get (plist-get (aref (plist-get result :models) 0) :model) :status))
        (test-put :results-markdown (plist-get result :results_markdown)))
      (test-wait 10 (lambda () (cl-some (lambda (m) (string-search "as a whole: error" m)) test-messages)))
      (test-put :messages (vconcat (reverse test-messages)))))
  (test-save)
  (ignore-errors (eglot-shutdown (eglot-current-server)))
  (kill-emacs 0))

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

(defun test-kernel-view ()
  "What the selected window shows: the file, whether it is read-only, the line at point."
  (list :file (buffer-file-name) :read-only buffer-read-only
        :line (buffer-substring-no-properties (line-beginning-position) (line-end-position))))
(defun test-back-to-the-model (model)
  (delete-other-windows)
  (switch-to-buffer model))

(test-step "open the kernel from the hover"
  ;; As a user: the hover of a cluster's line in ElDoc's buffer (M-x eldoc-doc-buffer), then RET on
  ;; its "Open the kernel".
  (let ((model (current-buffer)))
    (unwind-protect
        (progn
          (goto-char (point-min)) (forward-line 18) (forward-char 12)  ; line 19: x = F.relu(x)
          (eldoc-print-current-symbol-info t)
          (unless (test-wait 15 (lambda () (and (buffer-live-p eldoc--doc-buffer)
                                                (with-current-buffer eldoc--doc-buffer
                                                  (string-search "Open the kernel" (buffer-string))))))
            (error "no hover in the ElDoc buffer"))
          (pop-to-buffer eldoc--doc-buffer)
          (test-put :hover-buffer (buffer-substring-no-properties (point-min) (point-max)))
          (goto-char (point-min))
          (search-forward "Open the kernel")
          (goto-char (match-beginning 0))
          (let ((key (key-binding (kbd "RET"))))
            (test-put :hover-link-key (format "%s" key))
            (command-execute key))
          (test-put :kernel-from-hover (test-kernel-view)))
      (test-back-to-the-model model))))

(test-step "open the kernel at point"
  ;; M-x fuselens-eglot-open-kernel-at-point on another cluster's line: that cluster's kernel.
  (let ((model (current-buffer)))
    (unwind-protect
        (progn
          (goto-char (point-min)) (forward-line 23) (forward-char 12)  ; line 24: x = torch.sigmoid(x)
          (command-execute 'fuselens-eglot-open-kernel-at-point)
          (test-put :kernel-at-point (test-kernel-view)))
      (test-back-to-the-model model))))

(test-step "validate"
  (with-current-buffer (messages-buffer) (let ((inhibit-read-only t)) (erase-buffer)))
  (setq test-answered nil)
  (fuselens-eglot-validate)
  ;; The command is back at once: the validation runs, the mode line says so, Emacs is the user's.
  (test-put :answered-when-command-returned (or test-answered (test-messages-say "verified")))
  (test-put :running fuselens-eglot-running)
  ;; (what the mode line shows: `format-mode-line' draws nothing in batch mode)
  (test-put :mode-line (and (assq 'fuselens-eglot-running mode-line-misc-info) t))
  (goto-char (point-min)) (forward-line 18) (forward-char 12)
  (let (hover)
    (eglot-hover-eldoc-function (lambda (info &rest _) (setq hover info)))
    (test-put :hover-while-validating (and (test-wait 15 (lambda () hover)) t)))
  (unless (test-wait 300 (lambda () test-answered)) (error "no validation result"))
  (let ((result test-answered))
    (test-put :running-after fuselens-eglot-running)
    (test-put :validation-mode (plist-get result :mode))
    (test-put :validation
              (vconcat (cl-loop for m across (plist-get result :models)
                                append (cl-loop for c across (plist-get m :clusters)
                                                collect (list (plist-get c :id) (plist-get c :status))))))
    (test-put :validation-results (test-results-buffer))))

(test-step "profile"
  (setq test-answered nil)
  (fuselens-eglot-profile)
  (test-put :profiling fuselens-eglot-running)
  (unless (test-wait 300 (lambda () test-answered)) (error "no profile"))
  (test-put :profile-results (test-results-buffer))
  (fuselens-eglot-results)
  (test-put :results-again (test-results-buffer)))

(test-step "validate and profile at once"
  ;; Both started before either ends: the mode line says fuselens works until the second answer.
  (let (answers)
    (let ((record (lambda (buffer result)
                    (push (list :answered (if (plist-get result :profile) "profile" "validation")
                                :running (buffer-local-value 'fuselens-eglot-running buffer))
                          answers))))
      (add-hook 'fuselens-eglot-result-functions record)
      (fuselens-eglot-validate)
      (fuselens-eglot-profile)
      (test-put :running-with-both fuselens-eglot-running)
      (unwind-protect (test-wait 300 (lambda () (= 2 (length answers))))
        (remove-hook 'fuselens-eglot-result-functions record)))
    (test-put :both-answers (vconcat (reverse answers)))))

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
