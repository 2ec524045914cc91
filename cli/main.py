"""The `fuselens` command's entry (`python -m fuselens.cli.main`, as the editors run it): the commands
are in `commands.py`.

`fuselens serve` starts its worker host first, before the command line's own imports or the server's
(`server/start.py`): a file's first analysis waits for the host to import torch, and every
millisecond the host starts sooner is one less the editor waits.
"""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args[:1] == ["serve"] and not {"-h", "--help"} & set(args):
        from fuselens.server.start import launch_host

        launch_host()
    from .commands import main as run_command

    return run_command(args)


if __name__ == "__main__":
    sys.exit(main())
