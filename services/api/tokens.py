"""Short-lived JWTs for dashboard sessions, exchanged for an API key at POST /v1/auth/token.

The token names its key (`sub`), the key's team and role, and carries `exp`,
`iat`, `aud` and `iss`, all four required and checked. Which algorithms are
accepted comes from settings and only from there: the token's own header
never chooses (that is the `alg: none` and HS/RS confusion attacks). A valid
signature is not enough either: the API looks the key up on every request
(services/api/identity.py), so revoking a key, or disabling its team, ends
its tokens too.

The API signs and verifies its own tokens with one shared secret
(`TF_JWT_SECRET`), so `from_settings` accepts the HMAC algorithms only; the
codec itself verifies with any key pyjwt understands, which is what lets the
confusion attacks be tested against an RS256 verifier.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import jwt

from trainforge_services.api.identity import KEY_ID, Role, Tenant
from trainforge_services.common.errors import Unauthenticated
from trainforge_services.common.settings import ApiSettings

# RFC 7518 section 3.2: an HMAC key at least as long as the hash.
HMAC_MIN_KEY_BYTES = {"HS256": 32, "HS384": 48, "HS512": 64}
REQUIRED_CLAIMS = ("exp", "iat", "aud", "iss", "sub")
_ROLES = frozenset(r.value for r in Role)


@dataclass(frozen=True)
class Claims:
    key_id: str
    team: str
    role: Role
    issued_at: float
    expires_at: float


class TokenCodec:
    """Issues and verifies the API's JWTs; `verify` raises Unauthenticated for anything but a good token."""

    def __init__(self, *, algorithms: list[str], audience: str, issuer: str, lifetime: int,
                 signing_key: str | bytes | None, verification_key: str | bytes, leeway: float = 5.0):
        if not algorithms or any(a.lower() == "none" for a in algorithms):
            raise ValueError("JWT algorithms must name at least one signing algorithm, never 'none'")
        self.algorithms = list(algorithms)
        self.audience = audience
        self.issuer = issuer
        self.lifetime = lifetime
        self._signing_key = signing_key
        self._verification_key = verification_key
        self._leeway = leeway

    @classmethod
    def from_settings(cls, settings: ApiSettings) -> TokenCodec:
        """HMAC only; ValueError (the API refuses to start) for anything else or a secret too short."""
        secret = settings.jwt_secret.encode()
        for alg in settings.jwt_algorithms:
            if alg not in HMAC_MIN_KEY_BYTES:
                raise ValueError(f"TF_JWT_ALGORITHMS: {alg!r} is not supported; the API signs its tokens with "
                                 f"TF_JWT_SECRET, so use {', '.join(HMAC_MIN_KEY_BYTES)}")
            if len(secret) < HMAC_MIN_KEY_BYTES[alg]:
                raise ValueError(f"TF_JWT_SECRET must be at least {HMAC_MIN_KEY_BYTES[alg]} bytes for {alg}")
        return cls(algorithms=settings.jwt_algorithms, audience=settings.jwt_audience, issuer=settings.jwt_issuer,
                   lifetime=settings.jwt_lifetime, signing_key=secret, verification_key=secret)

    def issue(self, tenant: Tenant, *, key_expires_at: float | None = None, now: float | None = None) -> Claims:
        """Claims of a new token for the caller; it never outlives the key it was exchanged for."""
        now = time.time() if now is None else now
        expires = now + self.lifetime
        if key_expires_at is not None:
            expires = min(expires, key_expires_at)
        return Claims(key_id=tenant.key_id, team=tenant.team, role=tenant.role, issued_at=now, expires_at=expires)

    def encode(self, claims: Claims) -> str:
        if self._signing_key is None:
            raise ValueError("this codec only verifies tokens")
        payload = {"sub": claims.key_id, "team": claims.team, "role": claims.role.value,
                   "iat": int(claims.issued_at), "exp": int(claims.expires_at),
                   "aud": self.audience, "iss": self.issuer}
        return jwt.encode(payload, self._signing_key, algorithm=self.algorithms[0])

    def verify(self, token: str) -> Claims:
        try:
            payload = jwt.decode(
                token, self._verification_key, algorithms=self.algorithms, audience=self.audience,
                issuer=self.issuer, leeway=self._leeway,
                options={"require": list(REQUIRED_CLAIMS), "verify_signature": True, "verify_exp": True,
                         "verify_iat": True, "verify_aud": True, "verify_iss": True})
        except jwt.ExpiredSignatureError:
            raise Unauthenticated("token expired") from None
        except (jwt.PyJWTError, NotImplementedError, ValueError, TypeError) as e:
            # NotImplementedError: an accepted algorithm whose backend is not installed
            raise Unauthenticated(f"invalid token: {e}") from None
        sub, team, role = payload.get("sub"), payload.get("team"), payload.get("role")
        if not (isinstance(sub, str) and KEY_ID.match(sub) and isinstance(team, str)
                and isinstance(role, str) and role in _ROLES):
            raise Unauthenticated("invalid token: sub, team and role claims are required")
        return Claims(key_id=sub, team=team, role=Role(role), issued_at=float(payload["iat"]),
                      expires_at=float(payload["exp"]))
