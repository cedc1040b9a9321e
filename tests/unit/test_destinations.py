"""Webhook destinations (services/common/destinations.py): the address classes, the platform's own services,
TF_WEBHOOK_ALLOW, and a delivery target pinned to the address that was checked."""

from __future__ import annotations

import pytest

from trainforge_services.common import destinations as d
from trainforge_services.common.errors import RefusedReference
from trainforge_services.common.settings import ApiSettings, TrainerSettings

NAMES = {"hook.example": ["93.184.216.34"], "sneaky.example": ["93.184.216.34", "127.0.0.1"],
         "meta.example": ["169.254.169.254"], "api.internal": ["10.0.0.7"], "v6.example": ["fe80::1"],
         "localhost": ["127.0.0.1", "::1"]}


def resolver(host: str, port: int) -> list[str]:
    if host not in NAMES:
        raise OSError(f"no such name {host}")
    return NAMES[host]


def policy(allow: str = "", own: tuple[str, ...] = ("api.internal:8080", "127.0.0.1:50051")) -> d.WebhookPolicy:
    return d.policy(allow, own, resolve=resolver)


@pytest.mark.parametrize(("url", "rule"), [
    ("http://127.0.0.1:9000/x", d.LOOPBACK), ("http://127.9.9.9/", d.LOOPBACK), ("http://[::1]:80/", d.LOOPBACK),
    ("http://[::ffff:127.0.0.1]/", d.LOOPBACK), ("http://localhost:9000/", d.LOOPBACK),
    ("http://169.254.169.254/latest/meta-data/", d.LINK_LOCAL), ("http://[fe80::1]/", d.LINK_LOCAL),
    ("http://0.0.0.0:9000/", d.UNSPECIFIED), ("http://0.1.2.3/", d.UNSPECIFIED), ("http://[::]/", d.UNSPECIFIED),
    ("http://224.0.0.1/", d.NOT_UNICAST), ("http://sneaky.example/", d.LOOPBACK),
    ("http://meta.example/", d.LINK_LOCAL), ("http://v6.example/", d.LINK_LOCAL),
    ("http://api.internal:8080/hook", d.OWN_SERVICE), ("http://10.0.0.7:8080/", d.OWN_SERVICE),
])
def test_a_destination_in_the_platforms_own_network_is_refused_naming_the_rule(url, rule):
    with pytest.raises(RefusedReference) as refused:
        policy().check_url(url, "notify.webhook")
    assert rule in refused.value.message and refused.value.message.startswith("notify.webhook: ")
    assert refused.value.refusals == [{"field": "notify.webhook", "source": url, "rule": refused.value.refusals[0]["rule"]}]
    with pytest.raises(RefusedReference):
        policy().target(url)


@pytest.mark.parametrize("url", ["https://hook.example/x", "http://10.0.0.7:9000/", "http://192.168.1.5/",
                                 "https://unknown.example/"])
def test_other_destinations_pass(url):
    assert policy().check_url(url) == url


def test_an_unresolvable_name_is_left_to_the_delivery_which_tries_again_later():
    with pytest.raises(OSError):
        policy().target("https://unknown.example/")


def test_the_allow_list_opens_what_it_names_but_the_platforms_services_only_with_their_port():
    allowing = policy("127.0.0.0/8,[::1],meta.example:80,[fe80::/10]")
    for url in ("http://127.0.0.1:9000/", "http://localhost:1234/", "http://meta.example/", "http://[fe80::2]/"):
        assert allowing.check_url(url) == url
    with pytest.raises(RefusedReference, match="own services"):
        allowing.check_url("http://127.0.0.1:50051/")  # the Trainer: 127.0.0.1 without a port does not open it
    assert policy("127.0.0.1:50051").check_url("http://127.0.0.1:50051/")
    with pytest.raises(RefusedReference, match="link-local"):
        allowing.check_url("http://meta.example:81/")
    with pytest.raises(RefusedReference, match=r"resolves to ::1\) is a loopback"):
        policy("127.0.0.1").check_url("http://localhost:1234/")  # every address the name has is checked
    assert policy("10.0.0.0/8:8080").check_url("http://api.internal:8080/")


@pytest.mark.parametrize("bad", ["a b", "host:0", "host:x", "[::1", "10.0.0.0/33", "-bad-"])
def test_a_bad_allow_item_is_named(bad):
    with pytest.raises(ValueError, match="TF_WEBHOOK_ALLOW"):
        d.parse_allow(bad)
    with pytest.raises(ValueError, match="TF_WEBHOOK_ALLOW"):
        TrainerSettings(webhook_allow=bad)


def test_the_target_is_the_checked_address_with_the_name_in_host():
    target = policy().target("https://u:p@hook.example:8443/a?b=1")
    assert target.ip == "93.184.216.34" and target.host == "hook.example"
    assert target.connect_url == "https://u:p@93.184.216.34:8443/a?b=1" and target.host_header == "hook.example:8443"
    assert policy().target("http://hook.example/").host_header == "hook.example"


def test_the_settings_name_the_platforms_services():
    api = ApiSettings(dev_mode=True, api_host="0.0.0.0", api_port=8080, s3_endpoint="https://s3.internal:9000",
                      mongo_url="mongodb://m1:27017,m2/tf")
    assert {("m1", 27017), ("m2", 27017), ("s3.internal", 9000), ("0.0.0.0", 8080), ("127.0.0.1", 50051),
            ("127.0.0.1", 2379), ("127.0.0.1", 9200)} <= set(d.endpoints(api.service_addresses()))
    trainer = TrainerSettings(api_address="api.svc:8080,api2.svc:8081", metrics_port=9100)
    assert {("api.svc", 8080), ("api2.svc", 8081), ("0.0.0.0", 9100)} <= set(d.endpoints(trainer.service_addresses()))
    # the embedded stack's stores are on unix sockets: no network endpoint to name
    assert d.endpoints(["mongodb://%2Fs%2Fmongo%2Fmongo.sock", "http+unix://%2Fs%2Flogstore.sock", "etcd:2379"]) == \
        (("etcd", 2379),)


@pytest.mark.parametrize("url", ["https://" + "0" * 64 + "/", "http://a..b/", "http://-x.example/",
                                 "http://bad_host!.example/"])
def test_a_host_no_resolver_takes_is_refused_as_invalid(url):
    """Not an error from the resolver (an IDNA label over 63 characters made the API answer 500)."""
    for check in (policy().check_url, policy().target):
        with pytest.raises(RefusedReference, match="not a valid host name"):
            check(url)
