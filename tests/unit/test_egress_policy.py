"""Egress policies for sandboxed learners, without a kernel: the grammar, the admin/team rule, the forwarders' plan."""

from __future__ import annotations

import pytest

from trainforge_services.common import egress
from trainforge_services.common.settings import ControllerSettings
from trainforge_services.controller.sandbox.egress import hosts_file, plan, store_destination


def test_a_policy_is_none_store_or_host_ports_and_bad_items_are_named():
    assert egress.parse("").none and egress.parse("none").none and str(egress.parse("")) == "none"
    p = egress.parse(" store , Pypi.Internal:443,10.0.0.5:8080,pypi.internal:443")
    assert p.store and p.hosts == (("10.0.0.5", 8080), ("pypi.internal", 443))
    assert str(p) == "store,10.0.0.5:8080,pypi.internal:443" and egress.parse(str(p)) == p
    for bad, says in (("pypi.internal", "neither `store` nor host:port"), ("h:0", "no port between"),
                      ("h:99999", "no port between"), ("-bad-:80", "not a host name"),
                      ("[::1]:80", "not a host name"), ("none,store", "cannot be combined")):
        with pytest.raises(ValueError, match=says):
            egress.parse(bad, "TF_EGRESS")
    with pytest.raises(ValueError, match="TF_EGRESS"):
        ControllerSettings(egress="pypi")
    assert ControllerSettings().egress == "none"


def test_the_team_narrows_the_admins_policy_and_never_widens_it():
    admin = egress.parse("store,a.example:443")
    assert egress.effective(admin, None) == admin, "a team without a policy of its own gets the admin's"
    assert egress.effective(admin, egress.parse("a.example:443,b.example:80")) == egress.parse("a.example:443")
    assert egress.effective(admin, egress.parse("none")).none
    assert egress.effective(egress.parse("none"), egress.parse("store,a.example:443")).none


def test_the_forwarders_plan_gives_names_loopback_addresses_and_addresses_themselves():
    assert store_destination("") is None and store_destination("http://127.0.0.1:8333") == ("127.0.0.1", 8333)
    assert store_destination("https://S3.example") == ("s3.example", 443)
    routes, names, notes = plan(egress.parse("store,b.example:80,a.example:443,10.0.0.5:22,localhost:7"),
                                "http://127.0.0.1:8333")
    assert names == {"a.example": "127.0.1.1", "b.example": "127.0.1.2"}, "sorted, so every rank agrees"
    assert routes == [("10.0.0.5", 22, "10.0.0.5"), ("127.0.0.1", 8333, "127.0.0.1"),
                      ("127.0.1.1", 443, "a.example"), ("127.0.1.2", 80, "b.example"),
                      ("127.0.0.1", 7, "localhost")]
    assert not notes
    _, _, notes = plan(egress.parse("store"), "")
    assert "no S3 endpoint" in notes[0]
    text = hosts_file(names)
    assert "127.0.0.1\tlocalhost" in text and "127.0.1.1\ta.example\n" in text
