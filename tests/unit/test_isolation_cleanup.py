"""Removing a job's cgroup folders while another process removes some of them at the same time."""

from __future__ import annotations

from pathlib import Path

from trainforge_services.common import isolation


def tree(root: Path) -> Path:
    job = root / "trainforge" / "j-1"
    for rank in ("0-1", "1-1"):
        (job / rank / "inner").mkdir(parents=True)
    return job


def test_a_folder_that_goes_while_it_is_listed_does_not_fail_the_removal(tmp_path, monkeypatch):
    # the job's own controller removed 0-1 between the listing's steps: the first listing raises, as
    # pathlib's rglob does when a folder it is about to scan is gone
    job = tree(tmp_path)
    real = Path.rglob
    calls = []

    def racing(self, pattern):
        if pattern != "*":  # the wait for the tasks files to empty, before the listing
            return real(self, pattern)
        calls.append(self)
        if len(calls) == 1:
            for sub in ("0-1/inner", "0-1"):
                (job / sub).rmdir()
            raise FileNotFoundError(2, "No such file or directory", str(job / "0-1"))
        return real(self, pattern)

    monkeypatch.setattr(Path, "rglob", racing)
    assert isolation.remove_cgroups([job]) is True
    assert not job.exists()
    assert len(calls) == 2  # listed again once


def test_a_tree_is_removed_deepest_first(tmp_path):
    job = tree(tmp_path)
    assert isolation.remove_cgroups([job]) is True
    assert not job.exists() and (tmp_path / "trainforge").is_dir()
