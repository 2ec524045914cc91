"""Which installed distribution a library's package comes from, as a report's `libraries` names it:
found by the package's own name where that distribution installs it, else from every distribution's
files, never from a distribution that only shares the package's name."""

from __future__ import annotations

import pytest

from fuselens.analysis import packages
from fuselens.analysis.packages import Package


def _dist_info(site, name: str, version: str, top_level: list[str] | None, files: list[str]) -> None:
    info = site / f"{name.replace('-', '_')}-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    record = [*files, f"{info.name}/METADATA,,", f"{info.name}/RECORD,,"]
    (info / "RECORD").write_text("".join(f"{f},,\n" if "," not in f else f"{f}\n" for f in record))
    if top_level is not None:
        (info / "top_level.txt").write_text("".join(f"{t}\n" for t in top_level))


@pytest.fixture
def site(tmp_path, monkeypatch):
    """A folder on sys.path to install into, with the lookups' caches empty before and after."""
    folder = tmp_path / "site"
    folder.mkdir()
    monkeypatch.syspath_prepend(str(folder))
    packages._distribution.cache_clear()
    packages._distributions.cache_clear()
    yield folder
    packages._distribution.cache_clear()
    packages._distributions.cache_clear()


def test_a_package_installed_by_a_distribution_of_its_own_name(site):
    _dist_info(site, "tinynorm", "0.3.0", ["tinynorm"], ["tinynorm/__init__.py"])
    assert Package("tinynorm", str(site)).distribution() == ("tinynorm", "0.3.0")


def test_a_package_whose_distribution_is_named_otherwise(site):
    _dist_info(site, "tiny-norm-kit", "1.2.0", ["tinynorm"], ["tinynorm/__init__.py", "tinynorm/layers.py"])
    assert Package("tinynorm", str(site)).distribution() == ("tiny-norm-kit", "1.2.0")


def test_a_distribution_that_only_shares_the_package_name_is_not_taken_for_it(site):
    _dist_info(site, "tinynorm", "9.9.0", ["something_else"], ["something_else/__init__.py"])
    _dist_info(site, "tiny-norm-kit", "1.2.0", None, ["tinynorm/__init__.py", "tinynorm/layers.py"])
    assert Package("tinynorm", str(site)).distribution() == ("tiny-norm-kit", "1.2.0")


def test_a_package_no_distribution_installed(site):
    assert Package("vendored_only", str(site)).distribution() == ("", "")
