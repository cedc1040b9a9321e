"""A requirements file that reaches the host is refused at submit, through the real API and Trainer.

The API reads the file from the uploaded archive (bounded) and answers 422
naming the file, the line and the rule; nothing is stored, no job exists,
the audit log records the refusal with the team, the key and the source,
and nothing of the host file appears in the answer. (The controller refuses
the same lines again before it builds: tests/integration/test_controller_env.py.)
"""

from __future__ import annotations

import json

import pytest

from tests.integration.test_controller_run import pack
from tests.integration.test_webhooks import platform

HOST_SECRET = "root:x:0:0:host-only-secret"


@pytest.mark.parametrize("line", ["-r {host}", "-c {host}", "-e file://{dir}", "--find-links {dir}",
                                  "pkg @ file://{host}"])
def test_a_requirements_file_reaching_the_host_is_refused_at_submit(mongo_server, mongo_db, logstore, tmp_path,
                                                                    unique, line):
    host = tmp_path / "config.json"
    host.write_text(HOST_SECRET)
    reqs = "# deps\nnumpy\n" + line.format(host=host, dir=tmp_path) + "\n"
    with platform(mongo_server, mongo_db, logstore, tmp_path, unique) as p:
        manifest = {"name": "reqs", "framework": "custom", "command": "true", "requirements": "./requirements.txt"}
        code = pack({"./train.py": "print(1)\n", "./requirements.txt": reqs})
        resp = p.http.post("/v1/jobs", data={"manifest": json.dumps(manifest)},
                           files={"code": ("code.tar.gz", code, "application/gzip")}, headers=p.h["member"])
        assert resp.status_code == 422, resp.text
        message = resp.json()["error"]["message"]
        assert message.startswith("requirements: ./requirements.txt, line 3: "), message
        assert HOST_SECRET not in resp.text
        assert p.http.get("/v1/jobs", headers=p.h["member"]).json()["jobs"] == []
        entries = p.http.get("/v1/admin/audit", params={"team": "alpha"}, headers=p.h["platform"]).json()["entries"]
        refused = [e for e in entries if e["refused"]]
        assert len(refused) == 1 and refused[0]["route"] == "/v1/jobs" and refused[0]["key_id"]
        assert refused[0]["refused"][0]["source"] == "./requirements.txt, line 3"


def test_a_clean_requirements_file_and_a_list_entry(mongo_server, mongo_db, logstore, tmp_path, unique):
    with platform(mongo_server, mongo_db, logstore, tmp_path, unique) as p:
        manifest = {"name": "reqs", "framework": "custom", "command": "true", "requirements": "requirements.txt"}
        code = pack({"requirements.txt": "numpy>=1  # arrays\n"})
        resp = p.http.post("/v1/jobs", data={"manifest": json.dumps(manifest)},
                           files={"code": ("code.tar.gz", code, "application/gzip")}, headers=p.h["member"])
        assert resp.status_code == 201, resp.text
        manifest["requirements"] = ["numpy", "--index-url=http://169.254.169.254/"]
        resp = p.http.post("/v1/jobs", data={"manifest": json.dumps(manifest)}, headers=p.h["member"])
        assert resp.status_code == 422 and "requirements: entry 2: installer options" in resp.text, resp.text
        assert "169.254" not in resp.json()["error"]["message"]
