;;; fuselens-eglot.el --- The fuselens language server in Eglot  -*- lexical-binding: t; -*-

;; Package-Requires: ((emacs "28.1") (eglot "1.9"))

;;; Commentary:

;; fuselens shows which PyTorch operators could run as one GPU kernel.  This file
;; registers its language server (`fuselens serve --stdio') with Eglot for Python
;; buffers, passes settings and trust, and adds the commands that Eglot has no UI for
;; (fuselens' code lenses):
;;
;;   (require 'fuselens-eglot)
;;   (setq fuselens-eglot-server-command
;;         '("~/venv/bin/python" "-P" "-m" "fuselens.cli.main" "serve" "--stdio"))
;;   (setq fuselens-eglot-trusted-folders '("~/src/models"))
;;   (setq fuselens-eglot-interpret t)          ; no GPU: validate in the Triton interpreter
;;   (fuselens-eglot-register)                  ; then M-x eglot in a Python buffer
;;
;; Eglot runs one server per buffer, so in the projects where you use fuselens it takes the
;; place of your usual Python server.  Tested with Emacs 28.2 and Eglot 1.9 (Debian 12):
;; diagnostics (Flymake), hover (ElDoc), the quick fix (M-x eglot-code-actions) and the
;; commands below work; Eglot 1.9 has no code lenses, inlay hints or work-done progress.
;;
;; Validating and profiling take seconds to minutes: those commands return at once and Emacs
;; stays usable; the mode line says "fuselens: validating…" meanwhile, and the results open in
;; a buffer of their own, one per file, when they come (M-x fuselens-eglot-results shows them
;; again).
;;
;; The hover's "Open the kernel" link (M-x eldoc-doc-buffer shows the hover in a buffer) opens
;; the cluster's kernel with RET or a click; M-x fuselens-eglot-open-kernel-at-point does the
;; same there, or, on a cluster's line of the model, for the cluster there.

;;; Code:

(require 'cl-lib)
(require 'eglot)
(require 'eldoc)
(require 'jsonrpc)
(require 'project)
(require 'url-util)

(defgroup fuselens-eglot nil
  "The fuselens language server in Eglot."
  :group 'eglot)

(defcustom fuselens-eglot-server-command '("fuselens" "serve" "--stdio")
  "Command that starts the server.
With an interpreter, use `python -P -m fuselens.cli.main serve --stdio':
-P keeps the project folder (the server's working directory) off `sys.path'."
  :type '(repeat string))

(defcustom fuselens-eglot-trusted-folders nil
  "Folders whose models fuselens may run (analysis imports the model).
Only this list, in your own configuration, trusts a project: nothing inside the
project can.  A project not listed is left to the server's user-level file
~/.config/fuselens/trusted-folders.json."
  :type '(repeat directory))

(defcustom fuselens-eglot-settings nil
  "Server settings, a plist.
Keys: :device :peakGbps :severity :show :models :worker :remoteRunner
:remoteProfiler."
  :type 'plist)

(defcustom fuselens-eglot-interpret nil
  "Non-nil: validate kernels in the Triton interpreter.
That checks numerics only, and needs no GPU."
  :type 'boolean)

(defclass fuselens-eglot-server (eglot-lsp-server) ()
  :documentation "The fuselens language server.")

(defun fuselens-eglot--inside-p (dir folder)
  "Non-nil if DIR is FOLDER or lies inside it (both resolved)."
  (let ((d (file-name-as-directory (file-truename dir)))
        (f (file-name-as-directory (file-truename (expand-file-name folder)))))
    (string-prefix-p f d)))

(defun fuselens-eglot-trusted-p (root)
  "Non-nil if ROOT is inside one of `fuselens-eglot-trusted-folders'."
  (and root (cl-some (lambda (folder) (fuselens-eglot--inside-p root folder))
                     fuselens-eglot-trusted-folders)))

(cl-defmethod eglot-initialization-options ((server fuselens-eglot-server))
  "Settings, and `workspaceTrusted' only when the user listed the project."
  (let ((root (project-root (eglot--project server))))
    (append (list :settings (or fuselens-eglot-settings (make-hash-table)))
            (when (fuselens-eglot-trusted-p root) (list :workspaceTrusted t)))))

;;;###autoload
(defun fuselens-eglot-register ()
  "Make Eglot use fuselens for Python buffers."
  (add-to-list 'eglot-server-programs
               `((python-mode python-ts-mode) . (fuselens-eglot-server . ,fuselens-eglot-server-command)))
  (add-hook 'eglot-managed-mode-hook #'fuselens-eglot--use-hover-view))

(defun fuselens-eglot--request (command &rest arguments)
  "Run the server's COMMAND with ARGUMENTS for this buffer; return its answer.
For commands the server answers at once (analyze, show kernels)."
  (jsonrpc-request (eglot--current-server-or-lose) :workspace/executeCommand
                   (list :command command :arguments (vconcat arguments))
                   :timeout 60))

(defvar-local fuselens-eglot-running nil
  "What fuselens is doing for this buffer (\"validating\", \"profiling\"), or nil.
With several commands running, the one started last.")

(defvar-local fuselens-eglot--runs nil
  "The buffer's commands not yet answered, newest first: each a list (DOING).
A validation and a profile can run at once; the mode line speaks until both end.")

(defvar-local fuselens-eglot-last-result nil
  "The server's answer to this buffer's last validation or profile (a plist).")

(defvar fuselens-eglot-result-functions nil
  "Functions called with the buffer and the server's answer.
They run when a validation or a profile ends.")

;; The mode line of a buffer whose validation or profile is running says so.
(add-to-list 'mode-line-misc-info
             '(fuselens-eglot-running (" fuselens: " fuselens-eglot-running "…")))

(defun fuselens-eglot--run (doing command &rest arguments)
  "Run the server's COMMAND with ARGUMENTS for this buffer; do not wait for it.
DOING (\"validating\") shows in the mode line until the answer comes; then the
answer is this buffer's `fuselens-eglot-last-result' and its results are shown."
  (let ((buffer (current-buffer))
        (run (list doing)))
    (push run fuselens-eglot--runs)
    (setq fuselens-eglot-running doing)
    (force-mode-line-update)
    (message "fuselens: %s %s…" doing (file-name-nondirectory (buffer-file-name)))
    (jsonrpc-async-request
     (eglot--current-server-or-lose) :workspace/executeCommand
     (list :command command :arguments (vconcat arguments))
     :timeout 900  ; validation can take minutes on a GPU machine
     :success-fn (lambda (result) (fuselens-eglot--answered buffer run result))
     :error-fn (lambda (error)
                 (fuselens-eglot--answered buffer run nil)
                 (message "fuselens: %s" (plist-get error :message)))
     :timeout-fn (lambda ()
                   (fuselens-eglot--answered buffer run nil)
                   (message "fuselens: no answer from the server within 900 s")))))

(defun fuselens-eglot--answered (buffer run result)
  "The server answered RUN, a validation or profile of BUFFER, with RESULT.
RESULT is nil when it failed."
  (when (buffer-live-p buffer)
    (with-current-buffer buffer
      (setq fuselens-eglot--runs (delq run fuselens-eglot--runs))
      (setq fuselens-eglot-running (car (car fuselens-eglot--runs)))  ; the newest still running, if any
      (force-mode-line-update)
      (when result
        (setq fuselens-eglot-last-result result)
        (when (plist-get result :results_markdown)
          (fuselens-eglot--show-results buffer (plist-get result :results_markdown))))))
  (when result
    (run-hook-with-args 'fuselens-eglot-result-functions buffer result)))

(defun fuselens-eglot--show-results (buffer markdown)
  "Show MARKDOWN, the results of BUFFER's file, in a read-only buffer of its own."
  (let ((results (get-buffer-create
                  (format "*fuselens results: %s*" (file-name-nondirectory (buffer-file-name buffer))))))
    (with-current-buffer results
      (let ((inhibit-read-only t))
        (erase-buffer)
        (insert markdown)
        (goto-char (point-min)))
      (when (fboundp 'markdown-mode) (markdown-mode))
      (setq buffer-read-only t))
    (display-buffer results)
    results))

(defun fuselens-eglot--uri ()
  "The URI of this buffer's file."
  (eglot--path-to-uri (buffer-file-name)))

(defun fuselens-eglot--options ()
  "Validation options for the server."
  (if fuselens-eglot-interpret (list :interpret t) (make-hash-table)))

(defun fuselens-eglot-analyze ()
  "Analyze this file now."
  (interactive)
  (fuselens-eglot--request "fuselens.analyze" (fuselens-eglot--uri)))

(defun fuselens-eglot-validate (&optional cluster)
  "Validate CLUSTER's kernel (an id such as c0), or every kernel of the file.
Returns at once; the results open when the validation ends."
  (interactive (list (read-string "Cluster (empty: all): ")))
  (if (and cluster (not (string-empty-p cluster)))
      (fuselens-eglot--run "validating" "fuselens.validateKernel"
                           (fuselens-eglot--uri) cluster (fuselens-eglot--options))
    (fuselens-eglot--run "validating" "fuselens.validateAll" (fuselens-eglot--uri) nil (fuselens-eglot--options))))

(defun fuselens-eglot-profile ()
  "Profile the file's models: where a forward's time goes, by line and cluster.
Returns at once; the results open when the profile ends."
  (interactive)
  (fuselens-eglot--run "profiling" "fuselens.profile" (fuselens-eglot--uri)))

(defun fuselens-eglot-results ()
  "Show this file's last validation or profile.
Before any, the last validation the server kept for the file."
  (interactive)
  (if-let ((markdown (plist-get fuselens-eglot-last-result :results_markdown)))
      (fuselens-eglot--show-results (current-buffer) markdown)
    (let ((result (fuselens-eglot--request "fuselens.validationResults" (fuselens-eglot--uri))))
      (if-let ((markdown (plist-get result :results_markdown)))
          (fuselens-eglot--show-results (current-buffer) markdown)
        (message "fuselens: %s" (or (plist-get result :message) "no validation yet"))))))

(defun fuselens-eglot--show-view (result)
  "Show the view the server answered with, RESULT (its :path), at its kernel.
An Eglot that supports window/showDocument has been shown it by the server."
  (when-let ((path (plist-get result :path)))
    (if-let ((shown (get-file-buffer path))
             (window (get-buffer-window shown)))
        (select-window window)
      (find-file-other-window path)
      (let ((kernels (plist-get result :kernels)))
        (when (= (length kernels) 1)
          (goto-char (point-min))
          (re-search-forward (concat "^def " (regexp-quote (elt kernels 0)) "(") nil t)
          (beginning-of-line))))))

(defun fuselens-eglot-show-kernel ()
  "Open the kernels generated for this file."
  (interactive)
  (let ((result (fuselens-eglot--request "fuselens.showKernel" (fuselens-eglot--uri))))
    (fuselens-eglot--show-view result)
    result))

;;; The hover's links to the server's commands ("Open the kernel")

;; The server writes them as markdown links to `command:fuselens.showKernel?ARGUMENTS' URIs (the
;; arguments a URL-encoded JSON list), which VS Code runs.  markdown-mode draws them as links,
;; and following one would find a file named after the command; here RET or a click on one runs
;; its command.

(defconst fuselens-eglot--link-regexp
  "\\[\\([^]\n]*\\)\\](command:\\(fuselens\\.[[:alnum:]_.]+\\)\\??\\([^)[:space:]]*\\))"
  "A markdown link to a server command: its label, command and encoded arguments.")

(defvar fuselens-eglot-link-map
  (let ((map (make-sparse-keymap)))
    (define-key map (kbd "RET") #'fuselens-eglot-open-kernel-at-point)
    (define-key map [mouse-2] #'fuselens-eglot-open-kernel-at-point)
    (define-key map [follow-link] 'mouse-face)
    map)
  "Keys on a hover's link to a server command: RET or a click runs it.")

(defun fuselens-eglot--matched-link (string)
  "The link `fuselens-eglot--link-regexp' last matched in STRING.
A plist (:command COMMAND :arguments ARGUMENTS)."
  (let ((command (match-string 2 string))
        (query (match-string 3 string)))
    (save-match-data
      (let ((json (decode-coding-string (url-unhex-string query t) 'utf-8)))
        (list :command command
              :arguments (unless (string-empty-p json)
                           (let ((arguments (json-parse-string json :array-type 'list :null-object nil)))
                             (if (listp arguments) arguments (list arguments)))))))))

(defun fuselens-eglot--hover-view (hover)
  "HOVER, the text Eglot made of the server's markdown, as a view.
Its command links are made followable, and the trailing spaces of a hard line
break go: markdown-mode marks them, for editing."
  (when (stringp hover)
    (let ((text (replace-regexp-in-string "[ \t]+$" "" hover t t))
          (start 0))
      (while (string-match fuselens-eglot--link-regexp text start)
        (add-text-properties (match-beginning 0) (match-end 0)
                             (list 'fuselens-eglot-link (fuselens-eglot--matched-link text)
                                   'keymap fuselens-eglot-link-map
                                   'mouse-face 'highlight
                                   'help-echo "RET, mouse-2: open the kernel")
                             text)
        (setq start (match-end 0)))
      text)))

(defun fuselens-eglot-hover-eldoc-function (callback &rest _)
  "Eglot's hover for ElDoc (CALLBACK gets it), its kernel links followable."
  (eglot-hover-eldoc-function
   (lambda (info &rest properties)
     (apply callback (fuselens-eglot--hover-view info) properties))))

(defun fuselens-eglot--use-hover-view ()
  "ElDoc shows the hover as a view, its links followable, in fuselens' buffers."
  (when (and (eglot-managed-p) (cl-typep (eglot-current-server) 'fuselens-eglot-server))
    (setq-local eldoc-documentation-functions
                (cl-substitute #'fuselens-eglot-hover-eldoc-function #'eglot-hover-eldoc-function
                               eldoc-documentation-functions))))

(defun fuselens-eglot--hover-link ()
  "The first command link of the server's hover at point, in a fuselens buffer."
  (when (and (eglot-managed-p) (cl-typep (eglot-current-server) 'fuselens-eglot-server))
    (let* ((hover (jsonrpc-request (eglot--current-server-or-lose) :textDocument/hover
                                   (eglot--TextDocumentPositionParams)))
           (contents (plist-get hover :contents))
           (markdown (if (stringp contents) contents (plist-get contents :value))))
      (when (and markdown (string-match fuselens-eglot--link-regexp markdown))
        (fuselens-eglot--matched-link markdown)))))

(defun fuselens-eglot--follow (link)
  "Run LINK's command in the buffer of the file it names; show the view it answers."
  (let* ((uri (car (plist-get link :arguments)))
         (buffer (and (stringp uri) (find-buffer-visiting (eglot--uri-to-path uri)))))
    (unless buffer
      (user-error "fuselens: the file of this link is not open"))
    (fuselens-eglot--show-view
     (with-current-buffer buffer
       (apply #'fuselens-eglot--request (plist-get link :command) (plist-get link :arguments))))))

(defun fuselens-eglot-open-kernel-at-point (&optional event)
  "Open the kernel of the hover link at point, or of the cluster at point.
On a hover's \"Open the kernel\" link (in the ElDoc buffer), or where EVENT,
a click, is, run the link; on a cluster's line of a model, open the kernel its
hover shows first."
  (interactive (list last-nonmenu-event))
  (when (mouse-event-p event)
    (posn-set-point (event-end event)))
  (if-let ((link (or (get-text-property (point) 'fuselens-eglot-link) (fuselens-eglot--hover-link))))
      (fuselens-eglot--follow link)
    (user-error "fuselens: no kernel link or cluster here")))

(provide 'fuselens-eglot)
;;; fuselens-eglot.el ends here
