"""The manifest's requirements/labels/timeout fields and how the controller reads a requirement set."""

from __future__ import annotations

import pytest

from trainforge_services.common.errors import InvalidArgument
from trainforge_services.common.manifest import parse_manifest
from trainforge_services.controller.pyenv import EnvCache, requirements_of


def manifest(**kw):
    return parse_manifest({"name": "m", "command": "true"} | kw)


@pytest.mark.parametrize("bad", ["-r other.txt", "--index-url http://x", "a\nb", ""])
def test_a_requirement_list_takes_requirements_only(bad):
    with pytest.raises(InvalidArgument, match="requirements"):
        manifest(requirements=[bad])


def test_a_requirements_file_stays_inside_the_code_folder():
    with pytest.raises(InvalidArgument, match="requirements"):
        manifest(requirements="../requirements.txt")


def test_the_list_form_ignores_order_and_duplicates(tmp_path):
    a = requirements_of(manifest(requirements=["torch>=2", "numpy", "numpy"]), tmp_path)
    b = requirements_of(manifest(requirements=["numpy", "torch>=2"]), tmp_path)
    assert a is not None and b is not None and a.lines == b.lines == ("numpy", "torch>=2")
    cache = EnvCache(tmp_path)
    assert cache.digest(a) == cache.digest(b)


def test_a_file_is_read_without_comments_and_a_missing_one_is_named(tmp_path):
    (tmp_path / "req.txt").write_text("# deps\nnumpy  # arrays\n\n-r more.txt\n")
    reqs = requirements_of(manifest(requirements="req.txt"), tmp_path)
    assert reqs is not None and reqs.lines == ("numpy", "-r more.txt") and reqs.source == "req.txt"
    with pytest.raises(InvalidArgument, match="requirements: nope.txt is not in the code folder"):
        requirements_of(manifest(requirements="nope.txt"), tmp_path)
    assert requirements_of(manifest(), tmp_path) is None


def test_labels_and_timeout():
    m = manifest(labels={"team": "vision", "exp.id": "42"}, timeout="2h")
    assert m.labels == {"team": "vision", "exp.id": "42"} and m.timeout == 7200
    for bad in ({"-x": "1"}, {"k": "a=b"}, {"k": "x" * 64}):
        with pytest.raises(InvalidArgument, match="labels"):
            manifest(labels=bad)
    with pytest.raises(InvalidArgument, match="timeout"):
        manifest(timeout=0)
