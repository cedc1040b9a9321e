"""The manifest's requirements/labels/timeout fields and how the controller reads a requirement set."""

from __future__ import annotations

import pytest

from trainforge_services.common.errors import InvalidArgument, RefusedReference
from trainforge_services.common.manifest import parse_manifest
from trainforge_services.controller.pyenv import EnvBuildFailed, EnvCache, requirements_of


def manifest(**kw):
    return parse_manifest({"name": "m", "command": "true"} | kw)


@pytest.mark.parametrize("bad", ["-r other.txt", "--index-url http://x", "a\nb", "", "pkg @ file:///etc/x",
                                 "./pkg", "pkg @ https://h/p.whl"])
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
    (tmp_path / "req.txt").write_text("# deps\nnumpy  # arrays\n\ntorch>=2\n")
    reqs = requirements_of(manifest(requirements="req.txt"), tmp_path)
    assert reqs is not None and reqs.lines == ("numpy", "torch>=2") and reqs.source == "req.txt"
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


HOST_FILE = "root:x:0:0:host-secret-line\n"


@pytest.mark.parametrize("line", ["-r {host}", "-c {host}", "-e file://{host}", "--find-links {dir}",
                                  "--requirement={host}", "pkg @ file://{host}", "{host}", "numpy==${{HOME}}"])
def test_a_requirements_file_line_that_reaches_the_host_is_refused_naming_file_line_and_rule(tmp_path, line):
    host = tmp_path / "host" / "passwd"
    host.parent.mkdir()
    host.write_text(HOST_FILE)
    code = tmp_path / "code"
    code.mkdir()
    (code / "requirements.txt").write_text("numpy\n# a comment\n" + line.format(host=host, dir=host.parent) + "\n")
    with pytest.raises(RefusedReference) as refused:
        requirements_of(manifest(requirements="requirements.txt"), code)
    message = refused.value.message
    assert message.startswith("requirements: requirements.txt, line 3: "), message
    assert "host-secret-line" not in message and str(host) not in message
    assert refused.value.refusals == [{"field": "requirements", "source": "requirements.txt, line 3",
                                       "rule": message.split("line 3: ", 1)[1]}]


def test_a_list_entry_is_refused_by_the_same_rules_with_its_entry_number():
    with pytest.raises(RefusedReference) as refused:
        manifest(requirements=["numpy", "-r /etc/passwd"])
    assert "requirements: entry 2: installer options are not allowed" in refused.value.message
    assert refused.value.refusals[0]["source"] == "the manifest's requirements, entry 2"
    assert refused.value.details == [{"field": "requirements", "message": refused.value.details[0]["message"]}]


def test_the_installer_runs_without_the_hosts_configuration_or_source_builds(tmp_path, monkeypatch):
    monkeypatch.setenv("UV_INDEX_URL", "https://index.invalid/simple")
    monkeypatch.setenv("UV_CONFIG_FILE", "/etc/some/uv.toml")
    monkeypatch.setenv("TF_SECRETS_KEY", "not-for-the-installer")
    env = EnvCache.installer_env(tmp_path / "home")
    assert env["HOME"] == str(tmp_path / "home") and env["XDG_CONFIG_HOME"].startswith(str(tmp_path / "home"))
    assert env["UV_NO_CONFIG"] == "1" and env["UV_INDEX_URL"] == "https://index.invalid/simple"
    assert "UV_CONFIG_FILE" not in env and "TF_SECRETS_KEY" not in env
    argv = EnvCache(tmp_path).install_argv("uv", tmp_path / "env", tmp_path / "r.txt")
    assert argv[:5] == ["uv", "pip", "install", "--no-config", "--no-build"]
    assert "--no-build" not in EnvCache(tmp_path, source_builds=True).install_argv("uv", tmp_path, tmp_path)


def test_a_failed_builds_tail_masks_credentials_and_sees_an_empty_home(tmp_path):
    fake = tmp_path / "uv"
    fake.write_text("#!/bin/sh\n"
                    "echo \"home has: $(ls -A \"$HOME\" | wc -l) entries\"\n"
                    "echo 'error: https://user:hunter2@index.invalid/simple/numpy/ answered 401'\n"
                    "exit 3\n")
    fake.chmod(0o755)
    cache = EnvCache(tmp_path / "envs", uv=str(fake))
    with pytest.raises(EnvBuildFailed) as failed:
        cache.ensure(requirements_of(manifest(requirements=["numpy"]), tmp_path))
    message = failed.value.message
    assert "home has: 0 entries" in message and "hunter2" not in message, message
    assert "https://***@index.invalid/simple/numpy/" in message, message
