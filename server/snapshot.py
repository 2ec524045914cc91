"""What a request is answered from: the server's state for one document, taken once as the request
arrives.

A request that waits (for the kernels' code, a validation, the client) answers from its snapshot,
never from the server's state as it is by then: a save, a settings change or a torch.compile
comparison landing meanwhile changes the state, never the snapshot, so that no answer mixes two
versions of the document, two analyses or two settings.  Everything in it is immutable: the settings
and the analysis are frozen, and whatever joins an analysis later makes a new one.
"""

from __future__ import annotations

from dataclasses import dataclass

from fuselens.contracts.probe import ProbeReport
from fuselens.contracts.profile import Profile
from fuselens.contracts.training import MeasuredTraining

from .client import ClientFeatures
from .scheduler import Analysis
from .settings import Settings


@dataclass(frozen=True)
class Snapshot:
    uri: str
    path: str | None  # None: not a file URI
    version: int | None  # the document's version; None: it is not open
    text: str | None  # the document's text (None: not open)
    latest: Analysis | None  # its last analysis, of whichever version, with its kernels' code where generated
    settings: Settings  # the server's settings
    client: ClientFeatures
    profile: Profile | None  # the file's last profile, when it measured the text `analysis` is of
    # What the file's validations measured of its clusters' training (its history), which a fix's title tells.
    measured: tuple[MeasuredTraining, ...] = ()
    probe: ProbeReport | None = None  # the file's last probe, when it ran the text `analysis` is of

    @property
    def analysis(self) -> Analysis | None:
        """The analysis of this very version of the document; None while it is being analyzed again
        after the user typed (its lines no longer line up with the document's), or when it failed."""
        latest = self.latest
        if latest is None or latest.failure is not None or self.version is None or latest.version != self.version:
            return None
        return latest
