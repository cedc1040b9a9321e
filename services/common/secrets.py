"""Team secrets: named values encrypted at rest, readable only where a learner is started.

The API writes them (`PUT /v1/team/secrets/<name>`) and lists their names;
no route ever returns a value. The Trainer reads them once per deploy,
to hand them to the LCM in the DeployJob request (never persisted), and
the learner gets them in its environment only. A manifest refers to one by
name: `env: {WANDB_API_KEY: {secret: wandb}}` (`trainforge_services.common.manifest`).

Values are encrypted with Fernet (AES-128-CBC + HMAC-SHA256, from
`cryptography`) under the key in the `secrets_key` setting. Outside dev mode
a missing key is refused at start; in dev mode (the embedded stack) a key
is generated once into `<state_dir>/secrets.key` (0600), which every
service of the stack shares. The team and name are bound to the ciphertext
as associated data, so a ciphertext copied to another team's record does
not decrypt there.
"""

from __future__ import annotations

import hashlib
import threading
import time
from collections.abc import Callable
from pathlib import Path

from cryptography.fernet import Fernet, InvalidToken

from trainforge_services.common.adapters.mongo import Database, mapped_as
from trainforge_services.common.errors import InvalidArgument, NotFound, TrainforgeError
from trainforge_services.common.jobcreds import dev_secret
from trainforge_services.common.manifest import SECRET_NAME, SECRET_NAME_RULE

COLLECTION = "secrets"
NAME_RULE = SECRET_NAME_RULE
_NAME = SECRET_NAME
# Big enough for API tokens and small key files, small enough that a secret never bloats a request.
MAX_VALUE_BYTES = 64 * 1024
KEY_FILE = "secrets.key"

mapped = mapped_as("secret store")


def check_name(name: str, field: str = "name") -> str:
    if not isinstance(name, str) or not _NAME.match(name):
        raise InvalidArgument(f"{field} {name!r} is not a valid secret name: use {NAME_RULE}",
                              details=[{"field": field, "message": f"must be {NAME_RULE}"}])
    return name


def load_key(secrets_key: str, *, dev_mode: bool, state_dir: Path) -> bytes:
    """The Fernet key: the setting, or in dev mode `<state_dir>/secrets.key` (made once, 0600).

    ValueError outside dev mode without a key, or for a key that is not a
    urlsafe-base64 32-byte Fernet key (`Fernet.generate_key()` makes one).
    """
    if secrets_key:
        try:
            Fernet(secrets_key.encode())
        except ValueError:
            raise ValueError("secrets_key must be a Fernet key (32 url-safe base64-encoded bytes); "
                             "make one with `python -c 'from cryptography.fernet import Fernet; "
                             "print(Fernet.generate_key().decode())'`") from None
        return secrets_key.encode()
    if not dev_mode:
        raise ValueError("secrets_key (TF_SECRETS_KEY) is required outside dev mode: team secrets are "
                         "encrypted with it")
    # the API and the Trainer may start at once: neither reads a half-written key
    return dev_secret(Path(state_dir) / KEY_FILE, make=lambda: Fernet.generate_key().decode())

class SecretBox:
    """Encrypts and decrypts values bound to (team, name)."""

    def __init__(self, key: bytes):
        self._fernet = Fernet(key)
        # a key id (not the key) so a record says which key sealed it, e.g. when keys are rotated
        self.key_id = hashlib.sha256(key).hexdigest()[:12]

    @staticmethod
    def _bound(team: str, name: str, value: bytes) -> bytes:
        return f"{team}\0{name}\0".encode() + value

    def seal(self, team: str, name: str, value: str) -> str:
        return self._fernet.encrypt(self._bound(team, name, value.encode())).decode()

    def open(self, team: str, name: str, token: str) -> str:
        try:
            plain = self._fernet.decrypt(token.encode())
        except InvalidToken:
            raise TrainforgeError(f"secret {name!r} of team {team} cannot be decrypted with this secrets_key") from None
        prefix = self._bound(team, name, b"")
        if not plain.startswith(prefix):
            raise TrainforgeError(f"secret {name!r} of team {team} was sealed for another team or name")
        return plain[len(prefix):].decode()


def public(doc: dict) -> dict:
    """A secret as the API shows it: its name and times, never its value."""
    return {"name": doc["name"], "team": doc["team"], "created_at": doc.get("created_at"),
            "updated_at": doc.get("updated_at"), "updated_by": doc.get("updated_by", "")}


class SecretStore:
    """A team's secrets in MongoDB, sealed by `box` (or by the box `box()` makes on first use)."""

    def __init__(self, db: Database, box: SecretBox | Callable[[], SecretBox], collection: str = COLLECTION):
        self._docs = db[collection]
        self._make_box = box if callable(box) and not isinstance(box, SecretBox) else (lambda: box)
        self._lock = threading.Lock()
        self._sealer: SecretBox | None = None

    @property
    def _box(self) -> SecretBox:
        with self._lock:
            if self._sealer is None:
                self._sealer = self._make_box()
            return self._sealer

    @staticmethod
    def _id(team: str, name: str) -> str:
        return f"{team}/{name}"

    @mapped
    def put(self, team: str, name: str, value: str, *, actor: str = "") -> dict:
        """Create or replace a secret; returns it without its value."""
        check_name(name)
        if not isinstance(value, str) or not value:
            raise InvalidArgument("value must not be empty", details=[{"field": "value", "message": "required"}])
        if len(value.encode()) > MAX_VALUE_BYTES:
            raise InvalidArgument(f"value is over {MAX_VALUE_BYTES} bytes",
                                  details=[{"field": "value", "message": f"at most {MAX_VALUE_BYTES} bytes"}])
        now = time.time()
        self._docs.update_one(
            {"_id": self._id(team, name)},
            {"$set": {"team": team, "name": name, "ciphertext": self._box.seal(team, name, value),
                      "key_id": self._box.key_id, "updated_at": now, "updated_by": actor},
             "$setOnInsert": {"created_at": now}},
            upsert=True)
        return public(self._docs.find_one({"_id": self._id(team, name)}))

    @mapped
    def list(self, team: str) -> list[dict]:
        return sorted((public(d) for d in self._docs.find({"team": team})), key=lambda d: d["name"])

    @mapped
    def delete(self, team: str, name: str) -> dict:
        check_name(name)
        doc = self._docs.find_one_and_delete({"_id": self._id(team, name)})
        if doc is None:
            raise NotFound(f"team {team} has no secret {name!r}", details=[{"field": "name", "message": "no such secret"}])
        return public(doc)

    @mapped
    def reveal(self, team: str, names: set[str]) -> dict[str, str]:
        """name -> value of each of the team's secrets named; NotFound naming every missing one."""
        for name in names:
            check_name(name)
        docs = {d["name"]: d for d in self._docs.find({"_id": {"$in": [self._id(team, n) for n in names]}})}
        missing = sorted(names - set(docs))
        if missing:
            raise NotFound(f"team {team} has no secret named {', '.join(map(repr, missing))}; set it with "
                           f"`trainforge secret set {missing[0]}`",
                           details=[{"field": f"env.{n}", "message": "no such secret"} for n in missing])
        return {name: self._box.open(team, name, doc["ciphertext"]) for name, doc in docs.items()}

