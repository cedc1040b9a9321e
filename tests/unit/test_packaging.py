"""The distribution's import names: pyproject.toml maps the folders services/, protos/ and frameworks/ to
`trainforge_services`, `trainforge_protos` and `trainforge_frameworks`, and lists every package by that name.

tests/integration/test_client_install.py builds the wheel and checks what lands in site-packages.
"""

from __future__ import annotations

import importlib.util
import site
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE_DIR = {"trainforge": "trainforge", "trainforge_services": "services", "trainforge_protos": "protos",
               "trainforge_frameworks": "frameworks"}


def setuptools_config() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]


def test_every_top_level_name_is_distinctive_and_maps_to_its_folder():
    assert setuptools_config()["package-dir"] == PACKAGE_DIR


def test_every_package_of_the_tree_is_listed_by_its_import_name():
    found = {".".join((name, *init.parent.relative_to(ROOT / folder).parts))
             for name, folder in PACKAGE_DIR.items() for init in (ROOT / folder).rglob("__init__.py")}
    listed = setuptools_config()["packages"]
    assert sorted(listed) == sorted(found), {"not listed": sorted(found - set(listed)),
                                             "no such package": sorted(set(listed) - found)}


def test_the_installed_names_are_this_trees_folders_and_the_generic_ones_are_gone():
    for name, folder in PACKAGE_DIR.items():
        spec = importlib.util.find_spec(name)
        assert spec is not None and spec.origin == str(ROOT / folder / "__init__.py"), (name, spec)
    # the repository root may be on the path (tests import `tests.*`); the installation never adds these
    installed = {Path(p).resolve() for p in site.getsitepackages()}
    for generic in ("services", "protos", "frameworks"):
        assert not any((d / generic).exists() for d in installed), generic
