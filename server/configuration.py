"""The settings the server runs with, read from their sources (`settings.py`): when the client is
initialized, and again whenever it says they changed.  Each read makes new settings, never changed
after: a job or a request that took them keeps them whatever is read meanwhile.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
from collections.abc import Awaitable, Callable
from typing import Any

from fuselens.contracts.config import ConfigError, read_tool_table

from . import settings as settings_mod
from .protocol import remember
from .runner import template_problem
from .settings import Settings

SETTINGS_WAIT = 10.0  # seconds a job waits for the settings `initialized` fetches (5 s of them for the client's)
CLIENT_WAIT = 5.0  # seconds the client has to answer `workspace/configuration`
WARNINGS_KEPT = 256  # how many settings warnings the server remembers having given (each is given once)

AskClient = Callable[[], Awaitable[Any]]  # the client's "fuselens" section of `workspace/configuration`


class Configuration:
    def __init__(self, warn: Callable[[str], None]) -> None:
        self.current = Settings()
        self.init_options: dict[str, Any] = {}  # the client's `initializationOptions`, its later settings merged in
        self._warn = warn
        self._read = asyncio.Event()  # set once `initialized` has read the settings
        self._warned: dict[str, None] = {}  # (the latest WARNINGS_KEPT)
        self._reading = False  # a read is under way
        self._again: tuple[list[str], AskClient | None] | None = None  # what changed meanwhile: read again

    def client_sent(self, settings: Any) -> None:
        """`workspace/didChangeConfiguration`'s settings: its "fuselens" section replaces the one the
        initialization options gave."""
        if isinstance(settings, dict) and isinstance(settings.get("fuselens"), dict):
            self.init_options = {**self.init_options, "settings": settings["fuselens"]}

    async def reload(self, roots: list[str], ask_client: AskClient | None) -> bool:
        """Read the settings again; False when a read already under way takes the change in instead.

        Changes that come while the client is being asked are read once, after its answer: a client
        that is slow or never answers is asked once per read, not once per change, and what the server
        keeps meanwhile does not grow with the changes it is sent."""
        if self._reading:
            self._again = (roots, ask_client)
            return False
        self._reading = True
        try:
            again: tuple[list[str], AskClient | None] | None = (roots, ask_client)
            while again is not None:
                self._again = None
                await self._read_sources(*again)
                again = self._again
        finally:
            self._reading = False
        return True

    async def _read_sources(self, roots: list[str], ask_client: AskClient | None) -> None:
        """Read the settings: each workspace folder's pyproject.toml, the initialization options, then
        what the client answers (`ask_client`, None for a client that cannot be asked).  A value that
        is not taken is warned about, once per server."""
        merged = Settings()
        problems: list[str] = []
        for root in roots:
            pyproject = os.path.join(root, "pyproject.toml")
            if os.path.exists(pyproject):  # (a FIFO or a folder of that name too: the warning says so)
                try:
                    table = read_tool_table(pyproject)
                except ConfigError as exc:
                    problems.append(str(exc))
                    table = {}
                merged, found = settings_mod.merge(merged, settings_mod.from_pyproject(table), "pyproject.toml")
                problems += found
        merged, found = settings_mod.merge(
            merged, self.init_options.get("settings", self.init_options), "initializationOptions"
        )
        problems += [p for p in found if "unknown setting 'settings'" not in p]
        if ask_client is not None:
            try:
                async with asyncio.timeout(CLIENT_WAIT):
                    config = await ask_client()
            except Exception:  # a client that cannot answer keeps the other sources
                config = None
            merged, found = settings_mod.merge(merged, config, "settings")
            problems += found
        if merged.remote_runner is not None and (problem := template_problem(merged.remote_runner)):
            problems.append(problem)
            merged = dataclasses.replace(merged, remote_runner=None)
        self.current = merged
        for problem in problems:
            if problem not in self._warned:
                remember(self._warned, problem, None, WARNINGS_KEPT)
                self._warn(f"fuselens: {problem} (ignored; the default is used)")

    def read(self) -> None:
        """The settings `initialized` reads are in (or could not be read): jobs may start."""
        self._read.set()

    async def settled(self) -> Settings:
        """The settings, once the `initialized` reads are in (bounded: a client that never sends
        `initialized` gets the defaults), so that no job runs with defaults the user has overridden."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(SETTINGS_WAIT):
                await self._read.wait()
        return self.current
