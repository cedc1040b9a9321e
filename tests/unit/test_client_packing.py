"""Packing a code folder: ignore files honoured, size checked before sending, the upload streamed."""

from __future__ import annotations

import io
import tarfile

import httpx
import pytest

from trainforge import packing
from trainforge.sdk import Client, ClientError


def tree(root, files: dict[str, str]) -> None:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def test_gitignore_and_trainforgeignore_are_honoured(tmp_path):
    tree(tmp_path, {
        ".gitignore": "data/\n*.log\n",
        ".trainforgeignore": "checkpoints/\n!keep.log\n",
        "train.py": "x", "keep.log": "k", "run.log": "r",
        "data/big.bin": "d", "checkpoints/c.pt": "c",
        "lib/.gitignore": "generated.py\n", "lib/util.py": "u", "lib/generated.py": "g",
        "other/generated.py": "kept: lib's .gitignore does not apply here",
        ".venv/pyvenv.cfg": "home = /usr", ".venv/lib/site.py": "v",
        "__pycache__/a.pyc": "p", ".git/HEAD": "h",
    })
    code = packing.list_code(tmp_path)
    assert list(code.files) == [".gitignore", ".trainforgeignore", "keep.log", "lib/.gitignore", "lib/util.py",
                                "other/generated.py", "train.py"]
    assert code.total_bytes == sum((tmp_path / f).stat().st_size for f in code.files)
    buf = io.BytesIO()
    packing.pack_to_file(code, buf)
    with tarfile.open(fileobj=io.BytesIO(buf.getvalue())) as tar:
        assert sorted(tar.getnames()) == sorted(code.files)


def test_an_oversize_folder_is_refused_before_anything_is_sent(tmp_path):
    tree(tmp_path / "src", {"train.py": "print(1)\n"})
    (tmp_path / "src" / "weights.bin").write_bytes(b"\0" * 4096)
    sent: list[httpx.Request] = []
    client = Client("http://api.invalid", "k", transport=httpx.MockTransport(lambda r: sent.append(r)))
    with pytest.raises(ClientError, match=r"holds 4\.0 KiB in 2 files, over the upload limit of 1\.0 KiB"):
        client.submit({"name": "big", "command": "true"}, code_dir=tmp_path / "src", max_upload_bytes=1024)
    assert sent == []


def test_the_upload_streams_from_a_file_with_progress_and_overrides(tmp_path):
    tree(tmp_path / "src", {"train.py": "print(1)\n", "notes.tmp": "x", ".trainforgeignore": "*.tmp\n"})
    seen: dict = {}

    def handler(request: httpx.Request) -> httpx.Response:
        # httpx only sends a length it could take from the file without reading it into memory.
        seen["length"] = int(request.headers["content-length"])
        seen["body"] = request.read()
        return httpx.Response(201, json={"id": "j-1", "state": "queued"})

    progress: list[tuple[int, int]] = []
    listed = []
    client = Client("http://api.invalid", "k", transport=httpx.MockTransport(handler))
    job = client.submit({"name": "p", "command": "python train.py {{lr}}", "params": {"lr": 1}, "env": {"A": "1"}},
                        code_dir=tmp_path / "src", params={"lr": 0.5}, env={"B": "2"},
                        on_code=listed.append, on_upload=lambda n, total: progress.append((n, total)))
    assert job["id"] == "j-1"
    assert listed[0].files == (".trainforgeignore", "train.py") and listed[0].ignored == 1
    total = progress[0][1]
    assert sum(n for n, _ in progress) == total > 0 and seen["length"] == len(seen["body"])
    assert b'"params": {"lr": 0.5}' in seen["body"] and b'"env": {"A": "1", "B": "2"}' in seen["body"]
