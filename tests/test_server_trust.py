"""Language server, workspace trust: no user code runs until the user (not the workspace) trusts it."""

from __future__ import annotations

import importlib.util
import json
import os

import pytest
from lsprotocol import types as lsp

from fuselens.server.trust import Trust

from lsp_helpers import Client, children, example_text, server_fixture, server_pid, uri_of

pytestmark = pytest.mark.asyncio(loop_scope="module")


def user_config(root: str) -> str:
    """An XDG config folder outside the workspace, like the user's own ~/.config."""
    return os.path.join(os.path.dirname(root), os.path.basename(root) + "-user-config")


def trust_file(config: str, folders: list[str]) -> None:
    os.makedirs(os.path.join(config, "fuselens"), exist_ok=True)
    with open(os.path.join(config, "fuselens", "trusted-folders.json"), "w") as fh:
        json.dump(folders, fh)


def workspace_trusts_itself(root: str) -> None:
    trust_file(os.path.join(root, ".config"), [root])
    with open(os.path.join(root, "pyproject.toml"), "a") as fh:
        fh.write("\n[tool.fuselens]\nworkspaceTrusted = true\ntrusted = true\n")


# Said nothing about trust, and the user's own config lists nothing.
untrusted = server_fixture(
    init_options={}, wait_ready=False, server_env=lambda root: {"XDG_CONFIG_HOME": user_config(root)}
)
# The workspace ships a trust file for itself and points XDG_CONFIG_HOME at it, and says
# "trusted" through workspace/configuration and its pyproject.toml.
self_trusted = server_fixture(
    init_options={},
    wait_ready=False,
    prepare=workspace_trusts_itself,
    server_env=lambda root: {"XDG_CONFIG_HOME": os.path.join(root, ".config")},
    configuration={"fuselens": {"workspaceTrusted": True, "trusted": True}},
)
# The user's own trust file (outside the workspace) lists the folder.
user_trusted = server_fixture(
    init_options={},
    prepare=lambda root: trust_file(user_config(root), [root]),
    server_env=lambda root: {"XDG_CONFIG_HOME": user_config(root)},
)


def trusted_library(root: str) -> str:
    """A folder the user trusts, outside the workspace."""
    return os.path.join(os.path.dirname(root), os.path.basename(root) + "-trusted")


def link_into_a_trusted_folder(root: str) -> None:
    """The untrusted workspace links to a model in a folder the user trusts, and ships its own module
    named like one that model imports."""
    lib = trusted_library(root)
    os.makedirs(lib, exist_ok=True)
    with open(os.path.join(lib, "model.py"), "w") as fh:
        fh.write(
            "import torch\nimport torch.nn as nn\nimport scaling\n\n\n"
            "class Net(nn.Module):  # fuselens: input=(8, 64) float32\n"
            "    def forward(self, x):\n"
            "        return torch.relu(x) * scaling.FACTOR + 1.0\n"
        )
    with open(os.path.join(lib, "scaling.py"), "w") as fh:
        fh.write("FACTOR = 2.0\n")
    with open(os.path.join(root, "scaling.py"), "w") as fh:  # runs only if the workspace's folder is searched
        fh.write(f"open({os.path.join(root, 'workspace-code-ran')!r}, 'w').close()\nFACTOR = 3.0\n")
    os.symlink(os.path.join(lib, "model.py"), os.path.join(root, "linked.py"))
    trust_file(user_config(root), [lib])


linked = server_fixture(  # the workspace itself is not trusted: no worker warms up before the file is opened
    init_options={},
    wait_ready=False,
    prepare=link_into_a_trusted_folder,
    server_env=lambda root: {"XDG_CONFIG_HOME": user_config(root)},
)


def beside(root: str) -> str:
    """A folder beside the workspace, which nobody trusted."""
    return root + " beside"


INSTALLED = os.path.join(".venv", "lib", "python3.11", "site-packages", "models_pkg")  # inside the workspace


def models_outside_the_workspaces_own(root: str) -> None:
    """A model in a folder beside the workspace, and one in a package installed in the workspace's .venv."""
    for folder in (beside(root), os.path.join(root, INSTALLED)):
        os.makedirs(folder)
        with open(os.path.join(folder, "net.py"), "w", encoding="utf-8") as fh:
            fh.write(example_text())


# The editor trusts its window (the default); the files above are outside the folders it trusted.
window_trusted = server_fixture(prepare=models_outside_the_workspaces_own)


def modeling_llama() -> str | None:
    """transformers' modeling_llama.py, where it is installed (without importing transformers)."""
    spec = importlib.util.find_spec("transformers")
    if spec is None or not spec.submodule_search_locations:
        return None
    return os.path.join(next(iter(spec.submodule_search_locations)), "models", "llama", "modeling_llama.py")


def open_path(client: Client, path: str) -> str:
    """Open the file at `path`, wherever it is, as an editor does when the user follows a link to it."""
    with open(path, encoding="utf-8") as fh:
        text = fh.read()
    uri = uri_of(path)
    client.texts[uri], client.versions[uri] = text, 1
    client.text_document_did_open(
        lsp.DidOpenTextDocumentParams(lsp.TextDocumentItem(uri=uri, language_id="python", version=1, text=text))
    )
    return uri


async def test_a_trusted_window_runs_only_the_files_of_its_folders(window_trusted: Client):
    """Trust is per folder, never per window: a file the user opens from outside the trusted folders
    (transformers' modeling_llama.py, from a link in a diagnostic), or from a package installed in
    one, is not run (it would be analyzed as a model: an import error on the library's own file),
    and nothing is said about it: no diagnostics, no message."""
    client = window_trusted
    outside = [os.path.join(beside(client.root), "net.py"), os.path.join(client.root, INSTALLED, "net.py")]
    library = modeling_llama()
    uris = [open_path(client, path) for path in [*outside, *([library] if library else [])]]
    model = client.open("example_net.py")
    assert len([d for d in await client.diagnostics_of(model, 1) if d.message.startswith("fusable:")]) == 3

    for uri in uris:
        answer = await client.command("fuselens.analyze", uri)
        assert answer["scheduled"] is False and "does not analyze" in answer["message"], answer
    assert "outside the workspace folders you trusted" in (await client.command("fuselens.analyze", uris[0]))["message"]
    assert "installed package" in (await client.command("fuselens.analyze", uris[1]))["message"]
    await client.roundtrip()
    assert [p for p in client.published if p.uri in uris] == []
    assert client.messages == []
    analyzed = [m.message for m in client.log_messages if m.message.startswith("analyzed ")]
    assert analyzed and all(m.startswith("analyzed example_net.py ") for m in analyzed), analyzed


# The way to trust a folder that each profile's editor is told, and what it is not told.
HOW_TO_TRUST = {
    "visual-studio-code": ("Manage Workspace Trust", "trusted_folders"),
    "neovim": ("trusted_folders", "Workspace Trust"),
}


async def check_nothing_runs(client: Client) -> None:
    first = client.open("example_net.py")
    second = client.open("gpt.py")
    await client.roundtrip()
    assert client.published_for(first) == [] and client.published_for(second) == []
    assert children(server_pid(client)) == []  # no worker was even started
    analyzed = await client.command("fuselens.analyze", first)
    validated = await client.command("fuselens.validateKernel", first, "c0", {"interpret": True})
    client.save_text(first, example_text() + "\n")
    await client.roundtrip()
    assert client.published_for(first) == [] and children(server_pid(client)) == []
    assert await client.hover(first, 19) is None and await client.code_lenses(first) == []

    # One notification, however many files are opened, saved or asked about: a second one would
    # stack on the first in VS Code. It speaks to the editor that asked.
    (told,) = client.messages
    assert told.type == lsp.MessageType.Warning
    told_way, other_way = HOW_TO_TRUST[client.profile]
    for words in ("running its code", told_way, "trusted-folders.json"):
        assert words in told.message
    assert other_way not in told.message
    # The commands' answers carry the same explanation, for a client that answers a command itself.
    assert analyzed == {"scheduled": False, "reason": "untrusted", "message": told.message}
    assert validated == {"error": "untrusted", "message": told.message}


async def test_an_untrusted_workspace_runs_nothing(untrusted: Client):
    await check_nothing_runs(untrusted)


async def test_a_workspace_cannot_trust_itself(self_trusted: Client):
    # It is asked for its settings, and its "trusted" answer does not count.
    await self_trusted.wait_until(lambda: self_trusted.configuration_requests, "the configuration request")
    await check_nothing_runs(self_trusted)


async def test_the_users_trust_file_trusts_the_folder(user_trusted: Client):
    uri = user_trusted.open("example_net.py")
    diags = await user_trusted.diagnostics_of(uri, 1)
    assert len([d for d in diags if d.message.startswith("fusable:")]) == 3
    assert user_trusted.messages == []


async def test_a_link_into_a_trusted_folder_imports_from_that_folder_only(linked: Client):
    """The linked file is trusted (its real place is), and it is analyzed; its imports resolve beside
    the real file, so the untrusted workspace's module of the same name never runs."""
    uri = linked.open("linked.py")
    diags = await linked.diagnostics_of(uri, 1)
    assert [d for d in diags if d.message.startswith("fusable:")]
    assert not os.path.exists(linked.path("workspace-code-ran"))


async def test_the_untrusted_folder_message_speaks_to_the_editor_that_asked():
    """VS Code users are told about Workspace Trust, Neovim users about `trusted_folders`, each not
    about the other's; a client fuselens does not know hears every way."""
    path = "/work/models/net.py"
    vscode = Trust.explanation(path, "Visual Studio Code")
    neovim = Trust.explanation(path, "Neovim")
    other = Trust.explanation(path, "")
    assert "Manage Workspace Trust" in vscode and "trusted_folders" not in vscode
    assert "trusted_folders" in neovim and "Workspace Trust" not in neovim
    assert "fuselens-eglot-trusted-folders" in Trust.explanation(path, "Eglot")
    assert "Manage Workspace Trust" in other and "trusted_folders" in other
    assert all('"/work/models"' in text and "trusted-folders.json" in text for text in (vscode, neovim, other))


async def test_a_workspace_opened_inside_an_installed_package_is_the_users(tmp_path):
    """Below site-packages counts from the workspace folder: a project's `.venv` is a library's code,
    but a package's folder opened as the workspace, to work on it, is the user's."""
    project = tmp_path / "project"
    package = tmp_path / "venv" / "lib" / "python3.11" / "site-packages" / "mylib"
    trust = Trust(True, [str(project), str(package)])
    assert trust.trusted(str(project / "model.py")) and trust.trusted(str(package / "model.py"))
    assert not trust.trusted(str(project / ".venv" / "lib" / "site-packages" / "lib" / "model.py"))
    assert not trust.trusted(str(tmp_path / "elsewhere" / "model.py"))
    assert trust.not_a_model(str(tmp_path / "elsewhere" / "model.py"))
    assert not Trust(False, [str(project)]).trusted(str(project / "model.py"))
