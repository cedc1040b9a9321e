"""The requirement-line rules (services/common/reqlines.py): package names only, each refusal names its rule."""

from __future__ import annotations

import pytest

from trainforge_services.common import reqlines

ACCEPTED = ["numpy", "numpy>=2,<3", "torch[cuda]>=2; python_version >= \"3.10\"", "Foo.Bar_baz==1.0.*",
            "numpy (>=1.0)", "scikit-learn~=1.5", "pkg[a, b]!=2.0"]
REFUSED = {
    "-r /etc/passwd": reqlines.OPTION, "--requirement=/etc/passwd": reqlines.OPTION, "-c /etc/c": reqlines.OPTION,
    "--constraint /x": reqlines.OPTION, "-e file:///etc": reqlines.OPTION, "--editable .": reqlines.OPTION,
    "-f /tmp": reqlines.OPTION, "--find-links /tmp": reqlines.OPTION, "-i http://x": reqlines.OPTION,
    "--index-url http://x": reqlines.OPTION, "--extra-index-url http://x": reqlines.OPTION,
    "--trusted-host x": reqlines.OPTION, "--pre": reqlines.OPTION, "-Z": reqlines.OPTION,
    "./pkg": reqlines.LOCAL_PATH, "/abs/pkg": reqlines.LOCAL_PATH, "~/pkg": reqlines.LOCAL_PATH,
    "pkg @ file:///etc/x": reqlines.LOCAL_PATH, "src/pkg": reqlines.LOCAL_PATH, "dist.whl": reqlines.LOCAL_PATH,
    "pkg.tar.gz": reqlines.LOCAL_PATH, "pkg @ https://h.example/p.whl": reqlines.URL,
    "git+https://h.example/r": reqlines.URL, "pkg @ http://169.254.169.254/": reqlines.URL,
    "numpy --hash=sha256:00": reqlines.OPTION_ON_LINE, "numpy \\": reqlines.CONTINUATION,
    "numpy==${HOME}": reqlines.VARIABLE, "numpy>>2": reqlines.NOT_A_REQUIREMENT, "numpy==1 2": reqlines.NOT_A_REQUIREMENT,
    "x" * 1001: reqlines.TOO_LONG,
}


@pytest.mark.parametrize("line", ACCEPTED)
def test_package_names_pass(line):
    assert reqlines.rule_broken(line) is None


@pytest.mark.parametrize("line", sorted(REFUSED))
def test_every_other_line_breaks_a_named_rule(line):
    assert (reqlines.rule_broken(line) or "").startswith(REFUSED[line])


def test_a_files_refusal_counts_every_line_and_never_repeats_its_text():
    with pytest.raises(reqlines.RefusedLine) as refused:
        reqlines.file_lines("# deps\nnumpy  # arrays\n\n--find-links /srv/secret-dir\n", "reqs/base.txt")
    assert refused.value.refusal == reqlines.Refusal("reqs/base.txt", 4, f"{reqlines.OPTION}: --find-links")
    assert str(refused.value.refusal).startswith("requirements: reqs/base.txt, line 4: installer options")
    assert "secret-dir" not in str(refused.value.refusal)
    assert reqlines.file_lines("numpy # x\n#only a comment\n  torch>=2\n", "r.txt") == ("numpy", "torch>=2")


def test_a_list_is_numbered_by_entry():
    assert reqlines.list_lines([" numpy ", "torch"]) == ("numpy", "torch")
    with pytest.raises(reqlines.RefusedLine, match="entry 3: "):
        reqlines.list_lines(["numpy", "torch", "./local"])
    with pytest.raises(reqlines.RefusedLine, match="at most 200"):
        reqlines.list_lines(["numpy"] * 201)
