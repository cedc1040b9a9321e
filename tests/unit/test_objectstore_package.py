"""The object-store package: the local store works without boto3, and get_dir keeps its contract."""

from __future__ import annotations

import subprocess
import sys
import textwrap

from trainforge_services.common.adapters.objectstore import LocalStore, get_dir, objects_under, put_dir


def test_importing_the_package_and_opening_a_local_store_never_imports_boto3(tmp_path):
    script = textwrap.dedent(f"""
        import sys
        from trainforge_services.common.adapters.objectstore import open_store
        store = open_store("file://{tmp_path}/store")
        store.put_bytes("a/b", b"x")
        assert store.get_bytes("a/b") == b"x"
        loaded = sorted(m for m in ("boto3", "botocore", "s3transfer") if m in sys.modules)
        print(",".join(loaded) or "none")
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.strip() == "none"


def test_s3store_is_still_importable_by_name_from_the_package():
    from trainforge_services.common.adapters.objectstore import S3Store
    from trainforge_services.common.adapters.objectstore.s3 import S3Store as direct

    assert S3Store is direct


def test_get_dir_downloads_markers_last_and_skips_keys_beside_the_prefix(tmp_path):
    store = LocalStore(tmp_path / "store")
    src = tmp_path / "src"
    (src / "sub").mkdir(parents=True)
    (src / "meta.json").write_text("{}")
    (src / "z.bin").write_text("z")
    (src / "sub" / "a.bin").write_text("a")
    put_dir(store, "ckpt/1", src)
    store.put_bytes("ckpt/10/other", b"not mine")  # "ckpt/1" must not match "ckpt/10"
    got = get_dir(store, "ckpt/1", tmp_path / "out", last=lambda rel: rel == "meta.json")
    assert [i.key for i in got] == ["ckpt/1/sub/a.bin", "ckpt/1/z.bin", "ckpt/1/meta.json"]
    assert (tmp_path / "out" / "sub" / "a.bin").read_text() == "a"
    assert sorted(rel for _, rel in objects_under(store, "ckpt/1/")) == ["meta.json", "sub/a.bin", "z.bin"]
