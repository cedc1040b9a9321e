"""Filling the learner's working directory from the object store before it starts.

Everything that lands here comes from users (the code archive, data sets,
a checkpoint), so nothing may escape the working directory: archive members
with absolute paths, '..', links pointing outside, members under a link the
archive makes, hard links to anything but an earlier file of the archive or
device files are refused with the member named, and every download target is
checked to resolve inside the directory.

The archive is then extracted with tarfile's "data" filter where the Python
has it (3.11.4 and newer); on an older 3.11 (Debian 12's 3.11.2) `_extract_plain`
does what that filter does on top of the checks: it checks every target
resolves inside the directory as it goes, masks modes (no setuid, setgid or
sticky bit, no group or other write, owner read and write on files) and
ignores the archive's owners.

Nothing is fetched that the job may not read: the controller holds the
platform's object-store access, so each reference (code, data, checkpoint)
must lie under the job's own `jobs/<id>/` or a key the Trainer granted it
(`LearnerSpec.reads`, services/common/storeaccess.py), else PermissionDenied
before any byte is read.
"""

from __future__ import annotations

import copy
import logging
import os
import posixpath
import tarfile
from collections.abc import Callable
from pathlib import Path, PurePosixPath

from trainforge_services.common.adapters.objectstore import (
    ObjectStore,
    key_from_uri,
    objects_under,
    safe_relative,
)
from trainforge_services.common.contracts.specs import LearnerSpec
from trainforge_services.common.contracts.storekeys import job_prefix
from trainforge_services.common.errors import InvalidArgument, NotFound, PermissionDenied
from trainforge_services.common.storeaccess import check_key, covered, under

from .checkpoints import restore

log = logging.getLogger(__name__)


class Stopped(Exception):
    """The controller was asked to stop while preparing."""


def _unsafe(name: str) -> bool:
    return not safe_relative(name)


# tarfile's extraction filters (PEP 706) came with 3.11.4; module-level so a test can force the other path.
HAS_DATA_FILTER = hasattr(tarfile, "data_filter")
_FILTER_ERRORS: tuple[type[Exception], ...] = (tarfile.FilterError,) if HAS_DATA_FILTER else ()


def check_member(m: tarfile.TarInfo) -> None:
    """Raise InvalidArgument when extracting `m` could write outside the target directory."""
    if _unsafe(m.name):
        raise InvalidArgument(f"code archive member {m.name!r} has an absolute path or '..'; refusing to extract")
    if m.issym():
        target = posixpath.normpath(posixpath.join(posixpath.dirname(m.name), m.linkname))
        if PurePosixPath(m.linkname).is_absolute() or target == ".." or target.startswith("../"):
            raise InvalidArgument(f"code archive member {m.name!r} links outside the archive ({m.linkname!r})")
    elif m.islnk():
        if _unsafe(m.linkname):
            raise InvalidArgument(f"code archive member {m.name!r} links outside the archive ({m.linkname!r})")
    elif not (m.isfile() or m.isdir()):
        raise InvalidArgument(f"code archive member {m.name!r} is a device or pipe; refusing to extract")


def _parents(path: str) -> list[str]:
    """'a/b/c' -> ['a', 'a/b']: the folders a member's path passes through."""
    parts = PurePosixPath(path).parts
    return ["/".join(parts[:i]) for i in range(1, len(parts))]


def check_archive(members: list[tarfile.TarInfo]) -> None:
    """Every member by itself (`check_member`), then what the members do to each other.

    Refused: a member whose path, or a link's target path, passes through a
    symbolic link of the archive (a link inside may point anywhere inside,
    but "l -> sub" then "l/../../x", or "a -> ." then "a/b -> .." then
    "a/b/x", would leave the folder once the links exist on disk), and a hard
    link to anything but a regular file the archive holds before it. A link
    to a link ("lib.so -> lib.so.1 -> lib.so.1.2") is fine.
    """
    for m in members:
        check_member(m)
    links = {posixpath.normpath(m.name) for m in members if m.issym()}
    files: set[str] = set()
    for m in members:
        name = posixpath.normpath(m.name)
        via = next((p for p in _parents(name) if p in links), None)
        if via is not None:
            raise InvalidArgument(f"code archive member {m.name!r} lies under the archive's link {via!r}")
        if m.issym():
            through = posixpath.join(posixpath.dirname(name), m.linkname)
            via = next((p for p in map(posixpath.normpath, _parents(through)) if p in links), None)
            if via is not None:
                raise InvalidArgument(f"code archive member {m.name!r} links through the archive's link {via!r}")
        elif m.islnk():
            if posixpath.normpath(m.linkname) not in files:
                raise InvalidArgument(f"code archive member {m.name!r} is a hard link to {m.linkname!r}, "
                                      "which is no earlier file of the archive")
            files.add(name)
        elif m.isfile():
            files.add(name)
        else:
            files.discard(name)
        if m.issym():
            files.discard(name)


def _within(root: str, path: str) -> bool:
    return os.path.commonpath([root, path]) == root


def _plain_copy(m: tarfile.TarInfo, root: str) -> tarfile.TarInfo:
    """What the "data" filter makes of a member that passed `check_archive`, for a tarfile without it."""
    target = os.path.realpath(os.path.join(root, m.name))
    if not _within(root, target):
        raise InvalidArgument(f"code archive member {m.name!r} would be written outside the folder ({target})")
    if m.issym() or m.islnk():
        base = os.path.dirname(os.path.join(root, m.name)) if m.issym() else root
        linked = os.path.realpath(os.path.join(base, m.linkname))
        if not _within(root, linked):
            raise InvalidArgument(f"code archive member {m.name!r} links outside the folder ({linked})")
    c = copy.copy(m)
    mode = m.mode & 0o755
    if m.isdir():
        mode |= 0o700
    elif not m.issym():
        if not mode & 0o100:
            mode &= ~0o111
        mode |= 0o600
    c.mode = mode
    c.uid, c.gid, c.uname, c.gname = os.getuid(), os.getgid(), "", ""
    return c


def _extract_plain(tar: tarfile.TarFile, members: list[tarfile.TarInfo], dest: Path) -> None:
    dest.mkdir(parents=True, exist_ok=True)
    root = os.path.realpath(dest)
    # Where tarfile has filters (a test forcing this path), say the members are filtered already.
    trusted = {"filter": "fully_trusted"} if hasattr(tarfile, "fully_trusted_filter") else {}
    for m in members:
        # One at a time, so each target is resolved with the members before it on disk.
        tar.extract(_plain_copy(m, root), root, **trusted)


def extract_code(archive: Path, dest: Path) -> int:
    """Extract a (gzipped) tar archive into dest after checking every member; returns the member count."""
    try:
        with tarfile.open(archive, "r:*") as tar:
            members = tar.getmembers()
            check_archive(members)
            if HAS_DATA_FILTER:
                tar.extractall(dest, members=members, filter="data")
            else:
                _extract_plain(tar, members, dest)
    except _FILTER_ERRORS as e:
        raise InvalidArgument(f"code archive member refused: {e}") from None
    except tarfile.TarError as e:
        raise InvalidArgument(f"code archive is not a readable tar archive: {e}") from None
    return len(members)


def _inside(root: Path, target: Path) -> Path:
    resolved = target.resolve()
    if not resolved.is_relative_to(root.resolve()):
        raise InvalidArgument(f"{target} resolves outside the working directory")
    return target


def fetch(store: ObjectStore, uri: str, dest: Path, root: Path, *, into_folder: bool = False) -> int:
    """Download a store URI: one object to a file, or every object under a prefix into a folder.

    With `into_folder`, a single object lands inside dest under its own name.
    Returns the number of files written.
    """
    key = key_from_uri(uri)
    if store.exists(key):
        target = dest / PurePosixPath(key).name if into_folder else dest
        store.get_file(key, _inside(root, target))
        return 1
    count = 0
    for info, rel in objects_under(store, key):
        store.get_file(info.key, _inside(root, Path(dest) / rel))
        count += 1
    if count == 0:
        raise NotFound(f"{uri} holds no objects")
    return count


def check_granted(spec: LearnerSpec, uri: str, field: str) -> str:
    """The key of `uri` when the job may read it (its own objects, or what the Trainer granted); else
    PermissionDenied naming the field and the reference."""
    key = check_key(key_from_uri(uri), field)
    if under(key, job_prefix(spec.job_id)) or covered(key, spec.reads):
        return key
    raise PermissionDenied(f"{field} ({uri}): not granted to job {spec.job_id} of team {spec.team or '?'}; "
                           "it reads only its own objects and what the Trainer granted at deploy",
                           details=[{"field": field, "message": "not granted", "source": uri}])


def prepare(spec: LearnerSpec, store: ObjectStore,
            stop_requested: Callable[[], bool] = lambda: False) -> int | None:
    """Code, data, checkpoint and the empty checkpoint/output folders, in that order.

    Returns the step of the checkpoint restored (None: none was asked for or
    none is complete). Raises `Stopped` between steps when `stop_requested()`
    turns true, and a TrainforgeError (or OSError) naming what could not be
    prepared.
    """
    # every reference is checked before anything is fetched
    if spec.code_uri:
        check_granted(spec, spec.code_uri, "code_uri")
    for i, ds in enumerate(spec.manifest.data):
        check_granted(spec, ds.source, f"data[{i}].source")
    if spec.checkpoint_uri:
        check_granted(spec, spec.checkpoint_uri, "checkpoint_uri")
    workdir = spec.workdir
    workdir.mkdir(parents=True, exist_ok=True)

    def step(what: str) -> None:
        if stop_requested():
            raise Stopped(f"stopped while {what}")
        log.info("%s", what)

    if spec.code_uri:
        step(f"downloading code from {spec.code_uri}")
        archive = workdir.parent / f".code-{spec.rank}-{spec.attempt}.tar.gz"
        try:
            try:
                store.get_file(key_from_uri(spec.code_uri), archive)
            except NotFound:
                raise NotFound(f"code archive {spec.code_uri} does not exist") from None
            n = extract_code(archive, workdir)
            log.info("extracted %d archive members into %s", n, workdir)
        finally:
            archive.unlink(missing_ok=True)
    for i, ds in enumerate(spec.manifest.data):
        step(f"downloading data {ds.source} into {ds.path}")
        try:
            fetch(store, ds.source, workdir / ds.path, workdir, into_folder=ds.path.endswith("/"))
        except (NotFound, InvalidArgument) as e:
            raise type(e)(f"data[{i}] ({ds.source}): {e.message}") from None
    spec.checkpoint_dir.mkdir(parents=True, exist_ok=True)
    restored = None
    if spec.checkpoint_uri:
        step(f"restoring the newest checkpoint of every learner from {spec.checkpoint_uri}")
        _inside(workdir, spec.checkpoint_dir)
        restored = restore(store, spec.checkpoint_uri, spec.rank, spec.world_size, spec.checkpoint_dir,
                           own=spec.manifest.elastic)
    spec.output_dir.mkdir(parents=True, exist_ok=True)
    return restored
