"""Object-store keys: building an archive key and parsing it back."""

from __future__ import annotations

import pytest

from trainforge_services.common.contracts import storekeys


@pytest.mark.parametrize("build, kind", [(storekeys.log_key, "logs"), (storekeys.metrics_key, "metrics")])
def test_an_archive_key_parses_back_to_what_built_it(build, kind):
    parsed = storekeys.parse_archive_key(build("j-1a2b3c4d5e6f", 3, 12))
    assert parsed == storekeys.ArchiveKey("j-1a2b3c4d5e6f", kind, 3, 12)


@pytest.mark.parametrize("key", [
    "jobs/j-1/logs/0-1.json",          # wrong suffix
    "jobs/j-1/logs/a-1.jsonl",         # rank not a number
    "jobs/j-1/logs/sub/0-1.jsonl",     # nested
    "jobs/j-1/outputs/0/0-1.jsonl",    # not an archive folder
    "jobs//logs/0-1.jsonl",            # no job
    "code/j-1/logs/0-1.jsonl",
])
def test_other_keys_are_not_archives(key):
    assert storekeys.parse_archive_key(key) is None
