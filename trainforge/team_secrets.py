"""Team secrets through the API: set, list, delete (`Client.secrets`). Values go in and never come back out.

With `team=`, the platform-admin routes for any team are used instead of
the caller's own team's.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from trainforge.sdk import Client


class Secrets:
    def __init__(self, client: Client):
        self._c = client

    @staticmethod
    def _base(team: str | None) -> str:
        return f"/v1/admin/teams/{team}/secrets" if team else "/v1/team/secrets"

    def list(self, team: str | None = None) -> list[dict]:
        """[{name, team, created_at, updated_at, updated_by}]: names and times only."""
        return self._c._request("GET", self._base(team))["secrets"]

    def set(self, name: str, value: str, team: str | None = None) -> dict:
        """Create or replace a secret; jobs deployed from now on get this value."""
        return self._c._request("PUT", f"{self._base(team)}/{name}", json={"value": value})

    def delete(self, name: str, team: str | None = None) -> dict:
        return self._c._request("DELETE", f"{self._base(team)}/{name}")
