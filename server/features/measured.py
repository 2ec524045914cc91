"""What a file's last profile measured, as the hover, the inlay hints and the lenses show it."""

from __future__ import annotations

from dataclasses import dataclass, field

from fuselens.contracts.profile import ClusterTime, ModelProfile, Profile

from .text import same_file


@dataclass
class LineMeasure:
    """The time of one line of the file: its own calls, and a library's code it reached."""

    us: float = 0.0
    share: float = 0.0
    ops: list[str] = field(default_factory=list)
    through_library: bool = False  # the time is a library's lines' that this line reached


def time_label(us: float) -> str:
    return f"{us / 1000:.2f} ms" if us >= 100 else f"{us:.1f} µs"


def measured_lines(profile: Profile, path: str) -> dict[int, LineMeasure]:
    """Line number of `path` -> what ran there: its own lines' time, or (for a line calling into a
    library's model) the time of the library lines it reached."""
    out: dict[int, LineMeasure] = {}
    for model in profile.models:
        for line in model.lines:
            if same_file(line.file, path):
                number, through = line.line, False
            elif line.entry_line is not None:
                number, through = line.entry_line, True
            else:
                continue
            measure = out.setdefault(number, LineMeasure(through_library=through))
            measure.us += line.us
            measure.share += line.share
            measure.ops += [op for op in line.ops if op not in measure.ops]
    return out


def model_profile(profile: Profile, name: str) -> ModelProfile | None:
    return next((m for m in profile.models if m.name == name and not m.problem), None)


def cluster_time(profile: Profile, model: str, cluster: str) -> ClusterTime | None:
    measured = model_profile(profile, model)
    return next((c for c in measured.clusters if c.id == cluster), None) if measured else None


def where_measured(profile: Profile) -> str:
    what = "GPU kernel time" if profile.mode == "cuda" else "CPU time"
    return f"{what} on {profile.device}, mean of {profile.iterations} forwards"
