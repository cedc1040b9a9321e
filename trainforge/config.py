"""Where the CLI keeps its state and which API and key it uses.

One state directory (`$TF_STATE_DIR`, else `~/.trainforge`) holds the
embedded stack and `config.json` with the API URL and key that
`trainforge up` (or `trainforge login`) wrote. Named profiles
(`trainforge login --profile NAME`) sit beside them in the same file and are
chosen with `--profile NAME` or `TRAINFORGE_PROFILE`.
`TRAINFORGE_API_URL` / `TRAINFORGE_API_KEY` override both, so the same CLI
can point at a shared platform without touching the file.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path

CONFIG_FILE = "config.json"


def state_dir(env: Mapping[str, str] | None = None) -> Path:
    env = os.environ if env is None else env
    return Path(env.get("TF_STATE_DIR") or Path.home() / ".trainforge").expanduser().resolve()


@dataclass
class Config:
    api_url: str = ""
    api_key: str = ""
    team: str = ""
    # a platform admin's key, for `trainforge admin` (saved by `trainforge admin bootstrap --save`)
    admin_key: str = ""
    # name -> {"api_url", "api_key", "team"}, written by `trainforge login --profile NAME`
    profiles: dict[str, dict[str, str]] = field(default_factory=dict)


class UnknownProfile(KeyError):
    """--profile / TRAINFORGE_PROFILE names a profile config.json does not have."""

    def __init__(self, name: str, known: list[str]):
        super().__init__(name)
        self.name, self.known = name, known

    def __str__(self) -> str:
        have = f"; profiles: {', '.join(self.known)}" if self.known else ""
        return f"no profile {self.name!r}; create it with `trainforge login --profile {self.name}`{have}"


def load_file(state: Path) -> Config:
    """The config as stored, without environment overrides."""
    path = Path(state) / CONFIG_FILE
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return Config()
    if not isinstance(data, dict):
        return Config()
    raw_profiles = data.get("profiles")
    profiles = {str(name): {k: str(v) for k, v in p.items()} for name, p in raw_profiles.items()
                if isinstance(p, dict)} if isinstance(raw_profiles, dict) else {}
    return Config(api_url=str(data.get("api_url", "")), api_key=str(data.get("api_key", "")),
                  team=str(data.get("team", "")), admin_key=str(data.get("admin_key", "")), profiles=profiles)


def load(state: Path | None = None, env: Mapping[str, str] | None = None, profile: str | None = None) -> Config:
    """The config the CLI uses: the file (or its profile `profile`, else $TRAINFORGE_PROFILE), then
    TRAINFORGE_API_URL / TRAINFORGE_API_KEY / TRAINFORGE_ADMIN_KEY on top. UnknownProfile when the
    profile is not in the file."""
    env = os.environ if env is None else env
    cfg = load_file(state if state is not None else state_dir(env))
    profile = profile or env.get("TRAINFORGE_PROFILE") or None
    if profile:
        chosen = cfg.profiles.get(profile)
        if chosen is None:
            raise UnknownProfile(profile, sorted(cfg.profiles))
        cfg.api_url, cfg.api_key = chosen.get("api_url", ""), chosen.get("api_key", "")
        cfg.team, cfg.admin_key = chosen.get("team", ""), ""
    cfg.api_url = env.get("TRAINFORGE_API_URL") or cfg.api_url
    cfg.api_key = env.get("TRAINFORGE_API_KEY") or cfg.api_key
    cfg.admin_key = env.get("TRAINFORGE_ADMIN_KEY") or cfg.admin_key
    return cfg


def save(state: Path, cfg: Config) -> Path:
    """Write config.json readable by its owner only: it holds an API key."""
    state = Path(state)
    state.mkdir(parents=True, exist_ok=True)
    path = state / CONFIG_FILE
    tmp = path.with_suffix(".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.fchmod(fd, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(asdict(cfg), f, indent=2)
        f.write("\n")
    os.replace(tmp, path)
    return path
