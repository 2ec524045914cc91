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

;;; Code:

(require 'cl-lib)
(require 'eglot)
(require 'jsonrpc)
(require 'project)

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
               `((python-mode python-ts-mode) . (fuselens-eglot-server . ,fuselens-eglot-server-command))))

(defun fuselens-eglot--request (command &rest arguments)
  "Run the server's COMMAND with ARGUMENTS for this buffer; return its answer."
  (jsonrpc-request (eglot--current-server-or-lose) :workspace/executeCommand
                   (list :command command :arguments (vconcat arguments))
                   :timeout 900))  ; validation can take minutes on a GPU machine

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
  "Validate CLUSTER's kernel (an id such as c0), or every kernel of the file."
  (interactive (list (read-string "Cluster (empty: all): ")))
  (if (and cluster (not (string-empty-p cluster)))
      (fuselens-eglot--request "fuselens.validateKernel" (fuselens-eglot--uri) cluster (fuselens-eglot--options))
    (fuselens-eglot--request "fuselens.validateAll" (fuselens-eglot--uri) nil (fuselens-eglot--options))))

(defun fuselens-eglot-show-kernel ()
  "Open the kernels generated for this file."
  (interactive)
  (let ((result (fuselens-eglot--request "fuselens.showKernel" (fuselens-eglot--uri))))
    (when-let ((path (plist-get result :path)))
      (find-file-other-window path))
    result))

(provide 'fuselens-eglot)
;;; fuselens-eglot.el ends here
