"""Preparing a learner's working directory from a local object store: code, data, checkpoint."""

from __future__ import annotations

import io
import stat
import tarfile

import pytest

from trainforge_services.common.adapters.objectstore import LocalStore
from trainforge_services.common.contracts.specs import LearnerSpec
from trainforge_services.common.errors import InvalidArgument, NotFound, PermissionDenied
from trainforge_services.controller import workdir
from trainforge_services.controller.workdir import Stopped, extract_code, fetch, prepare

# Both ways of extracting where this Python has tarfile's "data" filter (3.11.4+); only the plain one before.
PATHS = ["plain", "data-filter"] if workdir.HAS_DATA_FILTER else ["plain"]


@pytest.fixture(params=PATHS)
def extraction(request, monkeypatch):
    """Runs a test once per extraction path, the plain one forced by hiding the filter."""
    monkeypatch.setattr(workdir, "HAS_DATA_FILTER", request.param == "data-filter")
    return request.param


def tar_bytes(entries: list[tarfile.TarInfo | tuple[str | tarfile.TarInfo, bytes]]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for e in entries:
            if isinstance(e, tarfile.TarInfo):
                tar.addfile(e)
            else:
                name, data = e
                info = name if isinstance(name, tarfile.TarInfo) else tarfile.TarInfo(name)
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def file(name: str, data: bytes, mode: int = 0o644) -> tuple[tarfile.TarInfo, bytes]:
    info = tarfile.TarInfo(name)
    info.size, info.mode = len(data), mode
    return info, data


def link(name: str, target: str, kind: bytes = tarfile.SYMTYPE) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.linkname = kind, target
    return info


def special(name: str, kind: bytes) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type = kind
    return info


def test_extracts_files_folders_and_inner_links(tmp_path, extraction):
    archive = tmp_path / "code.tar.gz"
    archive.write_bytes(tar_bytes([("train.py", b"print(1)\n"), ("pkg/util.py", b"X = 1\n"),
                                   link("pkg/alias.py", "util.py")]))
    dest = tmp_path / "w"
    assert extract_code(archive, dest) == 3
    assert (dest / "train.py").read_text() == "print(1)\n"
    assert (dest / "pkg" / "alias.py").read_text() == "X = 1\n"


@pytest.mark.parametrize(("entry", "message"), [
    (("/etc/evil", b"x"), "'/etc/evil' has an absolute path or '..'"),
    (("../evil", b"x"), "'../evil' has an absolute path or '..'"),
    (("a/../../evil", b"x"), "has an absolute path or '..'"),
    (link("out", "/etc/passwd"), "'out' links outside the archive"),
    (link("a/out", "../../x"), "'a/out' links outside the archive"),
    (link("hard", "../x", tarfile.LNKTYPE), "'hard' links outside the archive"),
    (link("hard", "/etc/passwd", tarfile.LNKTYPE), "'hard' links outside the archive"),
    (link("hard", "etc/passwd", tarfile.LNKTYPE), "'hard' is a hard link to 'etc/passwd', which is no earlier file"),
    (special("dev", tarfile.CHRTYPE), "'dev' is a device or pipe"),
    (special("disk", tarfile.BLKTYPE), "'disk' is a device or pipe"),
    (special("fifo", tarfile.FIFOTYPE), "'fifo' is a device or pipe"),
])
def test_refuses_members_that_escape(tmp_path, entry, message, extraction):
    archive = tmp_path / "code.tar.gz"
    archive.write_bytes(tar_bytes([("ok.py", b""), entry]))
    with pytest.raises(InvalidArgument, match=message):
        extract_code(archive, tmp_path / "w")
    assert not (tmp_path / "w" / "ok.py").exists(), "nothing is extracted from a refused archive"


@pytest.mark.parametrize(("entries", "message"), [
    # A link inside, then a member written through it: "a -> ." makes "a/b -> .." point at the folder's parent.
    ([link("a", "."), link("a/b", ".."), ("a/b/escaped", b"x")], "'a/b' lies under the archive's link 'a'"),
    ([link("l", "sub"), ("l/x.py", b"x")], "'l/x.py' lies under the archive's link 'l'"),
    ([("l/x.py", b"x"), link("l", "sub")], "'l/x.py' lies under the archive's link 'l'"),
    # A link whose target passes through another link of the archive ("sub/y -> .." makes "sub/y/.." the parent).
    ([link("sub/x", "y/../../escaped"), link("sub/y", "..")], "'sub/x' links through the archive's link 'sub/y'"),
    ([link("sub/y", ".."), link("sub/x", "y/z")], "'sub/x' links through the archive's link 'sub/y'"),
    # Hard links: only to an earlier regular file, never to a link or to what comes later.
    ([link("s", "train.py"), link("h", "s", tarfile.LNKTYPE)], "'h' is a hard link to 's', which is no earlier file"),
    ([link("h", "later.py", tarfile.LNKTYPE), ("later.py", b"x")], "'h' is a hard link to 'later.py'"),
])
def test_refuses_members_that_escape_through_other_members(tmp_path, entries, message, extraction):
    archive = tmp_path / "code.tar.gz"
    archive.write_bytes(tar_bytes([("train.py", b"print(1)\n"), *entries]))
    dest = tmp_path / "w" / "learner"
    with pytest.raises(InvalidArgument, match=message):
        extract_code(archive, dest)
    assert not dest.exists() or not any(dest.iterdir()), "nothing is extracted from a refused archive"
    assert not (tmp_path / "w" / "escaped").exists() and not (tmp_path / "escaped").exists()


def test_refuses_writing_through_a_link_already_in_the_folder(tmp_path, extraction):
    dest = tmp_path / "w"
    dest.mkdir()
    (tmp_path / "elsewhere").mkdir()
    (dest / "out").symlink_to(tmp_path / "elsewhere", target_is_directory=True)
    archive = tmp_path / "code.tar.gz"
    archive.write_bytes(tar_bytes([("out/x.py", b"x")]))
    with pytest.raises(InvalidArgument, match="'out/x.py'.*outside"):
        extract_code(archive, dest)
    assert not (tmp_path / "elsewhere" / "x.py").exists()


def test_modes_are_masked_and_links_inside_kept(tmp_path, extraction):
    d = tarfile.TarInfo("bin")
    d.type, d.mode = tarfile.DIRTYPE, 0o7777
    archive = tmp_path / "code.tar.gz"
    archive.write_bytes(tar_bytes([
        d,
        file("bin/run", b"#!/bin/sh\n", 0o6777),     # setuid, setgid, world-writable, executable
        file("data.txt", b"abc", 0o666),             # group/other writable
        file("secret", b"s", 0o000),                 # the owner can still read and write it
        file("lib.so.1.2", b"ELF", 0o755),
        link("lib.so.1", "lib.so.1.2"), link("lib.so", "lib.so.1"),   # a link to a link
        link("copy.txt", "data.txt", tarfile.LNKTYPE),
    ]))
    dest = tmp_path / "w"
    assert extract_code(archive, dest) == 8
    mode = {name: stat.S_IMODE((dest / name).stat().st_mode) for name in ("bin/run", "data.txt", "secret")}
    assert mode == {"bin/run": 0o755, "data.txt": 0o644, "secret": 0o600}
    assert not stat.S_IMODE((dest / "bin").stat().st_mode) & (stat.S_ISUID | stat.S_ISGID | stat.S_ISVTX | 0o022)
    assert (dest / "bin" / "run").read_bytes() == b"#!/bin/sh\n"
    assert (dest / "lib.so").read_bytes() == b"ELF" and (dest / "lib.so").is_symlink()
    assert (dest / "copy.txt").read_bytes() == b"abc"
    assert (dest / "copy.txt").stat().st_ino == (dest / "data.txt").stat().st_ino


def test_not_a_tar_archive(tmp_path):
    archive = tmp_path / "code.tar.gz"
    archive.write_bytes(b"definitely not gzip")
    with pytest.raises(InvalidArgument, match="not a readable tar archive"):
        extract_code(archive, tmp_path / "w")


@pytest.fixture
def store(tmp_path):
    s = LocalStore(tmp_path / "objects")
    s.put_bytes("datasets/mnist/train.bin", b"train")
    s.put_bytes("datasets/mnist/sub/test.bin", b"test")
    s.put_bytes("datasets/mnist2/other.bin", b"other")
    s.put_bytes("datasets/labels.csv", b"a,b\n")
    return s


def test_fetch_a_prefix_into_a_folder(store, tmp_path):
    root = tmp_path / "w"
    assert fetch(store, "store://datasets/mnist", root / "data", root) == 2
    assert sorted(p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file()) == [
        "data/sub/test.bin", "data/train.bin"]


def test_fetch_one_object_to_a_file_or_into_a_folder(store, tmp_path):
    root = tmp_path / "w"
    assert fetch(store, "store://datasets/labels.csv", root / "labels.csv", root) == 1
    assert fetch(store, "store://datasets/labels.csv", root / "meta", root, into_folder=True) == 1
    assert (root / "labels.csv").read_bytes() == (root / "meta" / "labels.csv").read_bytes() == b"a,b\n"


def test_fetch_nothing_is_an_error(store, tmp_path):
    with pytest.raises(NotFound, match="store://datasets/none holds no objects"):
        fetch(store, "store://datasets/none", tmp_path / "w" / "d", tmp_path / "w")


def test_fetch_refuses_targets_behind_a_link_out_of_the_workdir(store, tmp_path):
    root = tmp_path / "w"
    root.mkdir()
    (root / "data").symlink_to(tmp_path / "elsewhere", target_is_directory=True)
    with pytest.raises(InvalidArgument, match="resolves outside the working directory"):
        fetch(store, "store://datasets/mnist", root / "data", root)


def spec_for(tmp_path, **manifest_fields) -> dict:
    manifest = {"name": "m", "command": "true", "outputs": "results/"} | manifest_fields
    return {"job_id": "j1", "team": "t", "attempt": 1, "rank": 0, "world_size": 1, "manifest": manifest,
            "workdir": str(tmp_path / "attempt" / "learner-0")}


def test_prepare_fills_the_working_directory(store, tmp_path):
    store.put_bytes("jobs/j1/code.tar.gz", tar_bytes([("train.py", b"print('hi')\n")]))
    for step in (7, 9):
        store.put_bytes(f"jobs/j1/checkpoints/0/{step:012d}/checkpoint.pt", f"ckpt{step}".encode())
        store.put_bytes(f"jobs/j1/checkpoints/0/{step:012d}/checkpoint.json", f'{{"step": {step}}}'.encode())
    spec = LearnerSpec.model_validate(
        spec_for(tmp_path, data=[{"source": "store://datasets/mnist", "path": "data"},
                                 {"source": "store://datasets/labels.csv", "path": "meta/"}])
        | {"code_uri": "store://jobs/j1/code.tar.gz", "checkpoint_uri": "store://jobs/j1/checkpoints/",
           "reads": ["datasets/mnist", "datasets/labels.csv"]})
    assert prepare(spec, store) == 9
    w = spec.workdir
    assert (w / "train.py").read_text() == "print('hi')\n"
    assert (w / "data" / "train.bin").read_bytes() == b"train"
    assert (w / "meta" / "labels.csv").is_file()
    assert (spec.checkpoint_dir / "checkpoint.pt").read_bytes() == b"ckpt9"
    assert spec.output_dir.is_dir() and spec.output_dir == w / "results"
    assert not list(w.parent.glob(".code-*")), "the downloaded archive is removed"


def test_a_restore_takes_the_newest_step_every_rank_stored_completely(store, tmp_path):
    def stored(rank: int, step: int, complete: bool = True) -> None:
        prefix = f"jobs/j1/checkpoints/{rank}/{step:012d}/"
        store.put_bytes(prefix + "checkpoint.pt", f"r{rank}s{step}".encode())
        if complete:
            store.put_bytes(prefix + "checkpoint.json", f'{{"step": {step}}}'.encode())

    for rank in (0, 1):
        stored(rank, 10)
        stored(rank, 20)
    stored(0, 30)              # rank 1 has not stored 30 yet
    stored(1, 30, complete=False)  # ... its copy is incomplete
    spec = LearnerSpec.model_validate(spec_for(tmp_path) | {"world_size": 2, "rank": 1,
                                                            "checkpoint_uri": "store://jobs/j1/checkpoints/"})
    assert prepare(spec, store) == 20
    assert (spec.checkpoint_dir / "checkpoint.pt").read_bytes() == b"r1s20"


def test_no_complete_checkpoint_starts_from_scratch(store, tmp_path):
    spec = LearnerSpec.model_validate(spec_for(tmp_path) | {"checkpoint_uri": "store://jobs/j1/checkpoints/"})
    assert prepare(spec, store) is None
    assert spec.checkpoint_dir.is_dir() and not list(spec.checkpoint_dir.iterdir())


def test_prepare_names_the_missing_code_archive(store, tmp_path):
    spec = LearnerSpec.model_validate(spec_for(tmp_path) | {"code_uri": "store://jobs/j1/code.tar.gz"})
    with pytest.raises(NotFound, match="code archive store://jobs/j1/code.tar.gz does not exist"):
        prepare(spec, store)


def test_prepare_names_the_data_source(store, tmp_path):
    spec = LearnerSpec.model_validate(spec_for(tmp_path, data=[{"source": "store://nope", "path": "d"}])
                                      | {"reads": ["nope"]})
    with pytest.raises(NotFound, match=r"data\[0\] \(store://nope\): store://nope holds no objects"):
        prepare(spec, store)


def test_prepare_stops_between_steps(store, tmp_path):
    spec = LearnerSpec.model_validate(spec_for(tmp_path, data=[{"source": "store://datasets/mnist", "path": "d"}])
                                      | {"reads": ["datasets/mnist"]})
    with pytest.raises(Stopped, match="stopped while downloading data"):
        prepare(spec, store, stop_requested=lambda: True)


@pytest.mark.parametrize(("fields", "refused"), [
    ({"manifest": {"data": [{"source": "store://datasets/mnist", "path": "d"}]}}, r"data\[0\]\.source"),
    # a grant is a whole segment: datasets/mnist does not grant datasets/mnist2
    ({"manifest": {"data": [{"source": "store://datasets/mnist2", "path": "d"}]}, "reads": ["datasets/mnist"]},
     r"data\[0\]\.source \(store://datasets/mnist2\)"),
    ({"manifest": {"data": [{"source": "store://jobs/j2/outputs/", "path": "d"}]}}, "store://jobs/j2/outputs/"),
    ({"code_uri": "store://jobs/j2/code.tar.gz"}, "code_uri"),
    ({"checkpoint_uri": "store://jobs/j2/checkpoints/"}, "checkpoint_uri"),
    ({"checkpoint_uri": "store://jobs/j10/checkpoints/"}, "checkpoint_uri"),  # j1's prefix is jobs/j1/, not jobs/j1*
])
def test_prepare_fetches_nothing_the_job_was_not_granted(store, tmp_path, fields, refused):
    """The controller's own wall, whatever the Trainer sent: another job's objects or an ungranted prefix are
    refused before any byte is fetched."""
    store.put_bytes("jobs/j2/code.tar.gz", tar_bytes([("stolen.py", b"secret")]))
    store.put_bytes("jobs/j2/outputs/0/secret.txt", b"secret")
    store.put_bytes("jobs/j2/checkpoints/0/000000000001/checkpoint.json", b'{"step": 1}')
    store.put_bytes("jobs/j10/checkpoints/0/000000000001/checkpoint.json", b'{"step": 1}')
    raw = spec_for(tmp_path, **fields.pop("manifest", {})) | fields
    spec = LearnerSpec.model_validate(raw)
    with pytest.raises(PermissionDenied, match=refused):
        prepare(spec, store)
    assert not spec.workdir.exists() or not any(spec.workdir.rglob("*"))


def test_prepare_refuses_dot_segments_a_local_store_would_resolve(store, tmp_path):
    spec = LearnerSpec.model_validate(spec_for(tmp_path, data=[{"source": "store://jobs/j1/../j2/outputs", "path": "d"},
                                                                {"source": "store://jobs/./j2/outputs", "path": "e"}]))
    with pytest.raises(InvalidArgument):
        prepare(spec, store)
