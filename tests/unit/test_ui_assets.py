"""The dashboard's files: all shipped as package data, nothing from another origin, no inline script."""

from __future__ import annotations

import fnmatch
import re
import tomllib
from pathlib import Path

import trainforge_services.api.ui as ui

ROOT = Path(__file__).resolve().parents[2]
UI = Path(ui.__file__).parent


def _assets() -> list[str]:
    return sorted(str(p.relative_to(UI)) for d in ("static", "templates") for p in (UI / d).rglob("*") if p.is_file())


def test_every_template_and_static_file_is_package_data():
    patterns = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]["trainforge_services.api.ui"]
    missing = [a for a in _assets() if not any(fnmatch.fnmatch(a, p) for p in patterns)]
    assert _assets() and missing == []


def test_no_external_origin_no_inline_script_no_inner_html():
    for name in _assets():
        text = (UI / name).read_text()
        assert not re.search(r"(src|href)=\"(https?:)?//", text), name  # nothing loaded from another origin
        assert "@import" not in text and "url(http" not in text, name
        if name.endswith(".html"):
            assert not re.search(r"<script(?![^>]*\bsrc=\"/ui/static/)", text), name
            assert not re.search(r"\son[a-z]+\s*=", text), name
            assert "|safe" not in text and "autoescape false" not in text, name
        if name.endswith(".js"):
            assert not re.search(r"\.(innerHTML|outerHTML)\b|insertAdjacentHTML|document\.write|\beval\(", text), name
