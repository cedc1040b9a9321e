"""JWTs for dashboard sessions: the exchange, what a token may do, and the attacks that must get 401.

Tokens are forged here by hand (base64url + HMAC) where pyjwt would refuse
to make them, e.g. an HS256 token keyed with an RSA public key. The
platform ships no `cryptography` package, so RS256 tokens carry a random
signature: the API must refuse them for their algorithm alone, before it
would look at a signature.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import os
import time

import jwt
import pytest

from tests.integration.test_api_admin import bearer, make_platform
from tests.integration.test_api_app import assert_error_shape
from trainforge_services.api.identity import Role, Tenant, key_id_of
from trainforge_services.api.tokens import TokenCodec
from trainforge_services.common.errors import Unauthenticated

SECRET = "x" * 24 + "-test-signing-secret-0123456789"
RSA_PUBLIC_KEY = """-----BEGIN PUBLIC KEY-----
MIIBIjANBgkqhkiG9w0BAQEFAAOCAQ8AMIIBCgKCAQEA41JHrm9KHL+xBc14NOAV
DtznJHTPRH+e5G0ZId7GNYHCbY4jyZ43vvp+51ApXdhUiPPC6P4pXuH3TMy7wcHf
Kstp+JMY8hULA8a0tWGQSQpXFtryakfIM2s1qHn/Yf7my9Qif5YJXjokIGns1dno
jVB7dZha3xvbp+MXrSF1IqPOXun+vmLlsjE/8h9jXrYgrHyagzEQDWytGuDOfgGY
druCC8ZhNEiNM3+FalED8piSv4wip/1SwQJ2NVBY7LIZ5ZlpherAXRISe6Hih9x3
8o7RvWb9oQsihjVuZiL3D5zH8u0erOMPUiKM5VRoVtV6zSBoHuzksdjSDQvV+6Em
0wIDAQAB
-----END PUBLIC KEY-----
"""


def b64(data: bytes | dict) -> str:
    raw = json.dumps(data).encode() if isinstance(data, dict) else data
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def forge(header: dict, payload: dict, key: bytes | None, digest=hashlib.sha256) -> str:  # noqa: ANN001
    """A JWT signed by hand; key None: an empty signature; b"random": 256 random bytes."""
    signing_input = f"{b64(header)}.{b64(payload)}"
    if key is None:
        signature = b""
    elif key == b"random":
        signature = os.urandom(256)
    else:
        signature = hmac.new(key, signing_input.encode(), digest).digest()
    return f"{signing_input}.{b64(signature)}"


@pytest.fixture
def p(mongo_db, logstore, tmp_path):
    with make_platform(mongo_db, logstore, tmp_path, jwt_secret=SECRET, jwt_lifetime=600) as platform:
        yield platform


def claims_for(p, who: str = "alpha_member", **over) -> dict:
    now = int(time.time())
    key_id = key_id_of(p.keys[who])
    team, role = ("alpha", "member") if who == "alpha_member" else (who.split("_")[0], "team_admin")
    base = {"sub": key_id, "team": team, "role": role, "iat": now, "exp": now + 300, "aud": "trainforge",
            "iss": "trainforge"}
    base.update(over)
    return {k: v for k, v in base.items() if v is not None}


def exchange(p, who: str = "alpha_member") -> dict:
    resp = p.client.post("/v1/auth/token", headers=p.h[who])
    assert resp.status_code == 200, resp.text
    return resp.json()


def test_an_api_key_is_exchanged_for_a_token_that_works_like_it(p):
    before = int(time.time())
    issued = exchange(p)
    assert issued["token_type"] == "bearer" and 595 <= issued["expires_in"] <= 600
    claims = jwt.decode(issued["token"], SECRET, algorithms=["HS256"], audience="trainforge", issuer="trainforge")
    assert claims["sub"] == key_id_of(p.keys["alpha_member"])
    assert claims["team"] == "alpha" and claims["role"] == "member"
    assert claims["aud"] == "trainforge" and claims["iss"] == "trainforge"
    assert before <= claims["iat"] <= time.time() and claims["exp"] == claims["iat"] + 600
    assert jwt.get_unverified_header(issued["token"])["alg"] == "HS256"

    token = bearer(issued["token"])
    assert p.client.get("/v1/auth/me", headers=token).json() == {
        "team": "alpha", "key_id": key_id_of(p.keys["alpha_member"]), "role": "member", "via": "jwt"}
    job = p.client.post("/v1/jobs", data={"manifest": json.dumps({"name": "t", "framework": "custom",
                                                                   "command": "true"})}, headers=token).json()
    assert job["team"] == "alpha" and job["submitted_by"] == key_id_of(p.keys["alpha_member"])
    assert p.client.get(f"/v1/jobs/{job['id']}", headers=p.h["alpha_member"]).status_code == 200
    assert p.client.get(f"/v1/jobs/{job['id']}", headers=p.h["beta_member"]).status_code == 404
    # a token keeps its key's role: no admin routes for a member's token
    assert_error_shape(p.client.get("/v1/team/keys", headers=token), 403, "permission_denied")
    # and it cannot be exchanged for a fresh one
    assert_error_shape(p.client.post("/v1/auth/token", headers=token), 403, "permission_denied")


def test_a_token_never_outlives_its_key(p):
    soon = time.time() + 120
    issued = p.client.post("/v1/team/keys", json={"name": "short", "expires_at": soon},
                           headers=p.h["alpha_admin"]).json()
    token = p.client.post("/v1/auth/token", headers=bearer(issued["key"])).json()
    assert token["expires_at"] <= soon and token["expires_in"] <= 120


def test_revoking_the_key_or_disabling_the_team_ends_its_tokens(p):
    member, admin = exchange(p, "alpha_member")["token"], exchange(p, "beta_admin")["token"]
    assert p.client.get("/v1/jobs", headers=bearer(member)).status_code == 200
    p.client.delete(f"/v1/team/keys/{key_id_of(p.keys['alpha_member'])}", headers=p.h["alpha_admin"])
    err = assert_error_shape(p.client.get("/v1/jobs", headers=bearer(member)), 401, "unauthenticated")
    assert "revoked" in err["message"]

    assert p.client.get("/v1/team/keys", headers=bearer(admin)).status_code == 200
    p.client.post("/v1/admin/teams/beta/disable", headers=p.h["platform"])
    assert_error_shape(p.client.get("/v1/team/keys", headers=bearer(admin)), 401, "unauthenticated")
    p.client.post("/v1/admin/teams/beta/enable", headers=p.h["platform"])
    assert p.client.get("/v1/team/keys", headers=bearer(admin)).status_code == 200


ATTACKS = {
    "alg none": lambda p: forge({"alg": "none", "typ": "JWT"}, claims_for(p), None),
    "alg None": lambda p: forge({"alg": "None", "typ": "JWT"}, claims_for(p), None),
    "RS256-signed while only HS256 is accepted": lambda p: forge({"alg": "RS256", "typ": "JWT"}, claims_for(p),
                                                                 b"random"),
    "HS256 keyed with an RSA public key": lambda p: forge({"alg": "HS256", "typ": "JWT"}, claims_for(p),
                                                          RSA_PUBLIC_KEY.encode()),
    "HS384 with the right secret while only HS256 is accepted": lambda p: forge(
        {"alg": "HS384", "typ": "JWT"}, claims_for(p), SECRET.encode(), hashlib.sha384),
    "expired": lambda p: jwt.encode(claims_for(p, iat=int(time.time()) - 4000, exp=int(time.time()) - 3600),
                                    SECRET, algorithm="HS256"),
    "issued in the future": lambda p: jwt.encode(claims_for(p, iat=int(time.time()) + 3600,
                                                            exp=int(time.time()) + 7200), SECRET, algorithm="HS256"),
    "wrong aud": lambda p: jwt.encode(claims_for(p, aud="someone-else"), SECRET, algorithm="HS256"),
    "wrong iss": lambda p: jwt.encode(claims_for(p, iss="evil"), SECRET, algorithm="HS256"),
    "missing exp": lambda p: jwt.encode(claims_for(p, exp=None), SECRET, algorithm="HS256"),
    "missing iat": lambda p: jwt.encode(claims_for(p, iat=None), SECRET, algorithm="HS256"),
    "missing aud": lambda p: jwt.encode(claims_for(p, aud=None), SECRET, algorithm="HS256"),
    "missing iss": lambda p: jwt.encode(claims_for(p, iss=None), SECRET, algorithm="HS256"),
    "missing sub": lambda p: jwt.encode(claims_for(p, sub=None), SECRET, algorithm="HS256"),
    "bad signature": lambda p: jwt.encode(claims_for(p), SECRET, algorithm="HS256")[:-6] + "AAAAAA",
    "signed with another secret": lambda p: jwt.encode(claims_for(p), "another-secret-" + "y" * 32,
                                                       algorithm="HS256"),
    "another team in the claims": lambda p: jwt.encode(claims_for(p, team="beta"), SECRET, algorithm="HS256"),
    "a stronger role in the claims": lambda p: jwt.encode(claims_for(p, role="platform_admin"), SECRET,
                                                          algorithm="HS256"),
    "a key that does not exist": lambda p: jwt.encode(claims_for(p, sub="0badf00d"), SECRET, algorithm="HS256"),
    "not a JWT at all": lambda p: "eyJhbGciOi.garbage.x",
}


@pytest.mark.parametrize("attack", list(ATTACKS))
def test_attacks_get_401(p, attack):
    token = ATTACKS[attack](p)
    for method, path in (("GET", "/v1/jobs"), ("GET", "/v1/auth/me"), ("POST", "/v1/auth/token")):
        resp = p.client.request(method, path, headers=bearer(token))
        assert_error_shape(resp, 401, "unauthenticated")
        assert resp.headers["www-authenticate"] == "Bearer"


def test_the_good_token_of_the_attack_table_works(p):
    """The forged tokens differ from an accepted one only in what each attack changes."""
    good = jwt.encode(claims_for(p), SECRET, algorithm="HS256")
    assert p.client.get("/v1/auth/me", headers=bearer(good)).json()["via"] == "jwt"
    by_hand = forge({"alg": "HS256", "typ": "JWT"}, claims_for(p), SECRET.encode())
    assert p.client.get("/v1/auth/me", headers=bearer(by_hand)).status_code == 200


def test_an_rs256_verifier_refuses_hs256_tokens_keyed_with_its_public_key():
    """The classic confusion: the verifier's public key used as an HMAC secret by the attacker."""
    codec = TokenCodec(algorithms=["RS256"], audience="trainforge", issuer="trainforge", lifetime=600,
                       signing_key=None, verification_key=RSA_PUBLIC_KEY)
    now = int(time.time())
    payload = {"sub": "0badf00d", "team": "alpha", "role": "platform_admin", "iat": now, "exp": now + 60,
               "aud": "trainforge", "iss": "trainforge"}
    for key in (RSA_PUBLIC_KEY.encode(), RSA_PUBLIC_KEY.strip().encode()):
        with pytest.raises(Unauthenticated):
            codec.verify(forge({"alg": "HS256", "typ": "JWT"}, payload, key))
    with pytest.raises(Unauthenticated):
        codec.verify(forge({"alg": "none"}, payload, None))


def test_the_codec_never_takes_its_algorithms_from_a_token():
    with pytest.raises(ValueError):
        TokenCodec(algorithms=["none"], audience="a", issuer="i", lifetime=60, signing_key=b"k", verification_key=b"k")
    with pytest.raises(ValueError):
        TokenCodec(algorithms=[], audience="a", issuer="i", lifetime=60, signing_key=b"k", verification_key=b"k")
    codec = TokenCodec(algorithms=["HS512"], audience="a", issuer="i", lifetime=60, signing_key=b"k" * 64,
                       verification_key=b"k" * 64)
    tenant = Tenant(team="t", key_id="0badf00d", role=Role.MEMBER)
    token = codec.encode(codec.issue(tenant))
    assert jwt.get_unverified_header(token)["alg"] == "HS512"
    assert codec.verify(token).key_id == "0badf00d"
