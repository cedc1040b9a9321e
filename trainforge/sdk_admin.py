"""The platform-admin half of the SDK: every team, quotas, usage, keys, retention and the audit log.

Reached as `Client.admin`; it sends its requests through the client it was
made from, so it shares the client's key, retries and error mapping.
"""

from __future__ import annotations

import datetime as dt
from typing import TYPE_CHECKING, Any

from trainforge.sdk import key_body
from trainforge.sdk_base import When, time_filters

if TYPE_CHECKING:
    from trainforge.sdk import Client


class Admin:
    """/v1/admin over a Client; every call needs a platform_admin key."""

    def __init__(self, client: Client):
        self._c = client

    def cluster(self) -> dict:
        """The backend's capacity, what is held and queued, and `network_policy`: whether the cluster
        enforces NetworkPolicies, as the LCM's canary last saw it ("" on backends without one)."""
        return self._c._request("GET", "/v1/admin/cluster")

    def retention(self, team: str) -> dict:
        """{"logs_days", "metrics_days", "outputs_days"} (None: kept for ever)."""
        return self._c._request("GET", f"/v1/admin/teams/{team}/retention")

    def set_retention(self, team: str, *, logs_days: float | None = None, metrics_days: float | None = None,
                      outputs_days: float | None = None) -> dict:
        body = {"logs_days": logs_days, "metrics_days": metrics_days, "outputs_days": outputs_days}
        return self._c._request("PUT", f"/v1/admin/teams/{team}/retention", json=body)

    def reindex_logs(self, jobs: list[str] | None = None, all_jobs: bool = False) -> dict:
        """Start rebuilding the log index from the archives: {"jobs": [...], "started": true}."""
        return self._c._request("POST", "/v1/admin/logs/reindex", json={"jobs": jobs or [], "all": all_jobs})

    def sweep_retention(self) -> list[dict]:
        """Apply every team's retention now; what was deleted."""
        return self._c._request("POST", "/v1/admin/retention/sweep")["deleted"]

    def teams(self) -> list[dict]:
        return self._c._request("GET", "/v1/admin/teams")["teams"]

    def team(self, name: str) -> dict:
        return self._c._request("GET", f"/v1/admin/teams/{name}")

    def create_team(self, name: str) -> dict:
        return self._c._request("POST", "/v1/admin/teams", json={"name": name})

    def disable_team(self, name: str) -> dict:
        """The team's keys and tokens are answered 401 from the next request on."""
        return self._c._request("POST", f"/v1/admin/teams/{name}/disable")

    def enable_team(self, name: str) -> dict:
        return self._c._request("POST", f"/v1/admin/teams/{name}/enable")

    def set_quota(self, team: str, *, gpus: int | None = None, cpus: float | None = None,
                  memory: int | str | None = None, jobs: int | None = None,
                  gpus_by_type: dict[str, int] | None = None, cohort: str = "",
                  lending_limit: dict[str, Any] | None = None,
                  borrowing_limit: dict[str, Any] | None = None, egress: str | None = None) -> dict:
        """Replace the team's quota whole: a limit left out is no limit. memory: bytes or e.g. "64Gi".

        cohort: teams naming the same cohort lend each other their unused gpus, cpus and memory;
        lending_limit / borrowing_limit: {"gpus": n, "cpus": x, "memory": "8Gi"} (a resource left out: no limit).
        egress: the team's own policy for sandboxed learners ("none", "store,host:port,..."); None: the admin's.
        """
        body: dict[str, Any] = {"gpus": gpus, "cpus": cpus, "memory": memory, "jobs": jobs,
                                "gpus_by_type": dict(gpus_by_type or {}), "cohort": cohort,
                                "lending_limit": dict(lending_limit or {}),
                                "borrowing_limit": dict(borrowing_limit or {}), "egress": egress}
        return self._c._request("PUT", f"/v1/admin/teams/{team}/quota", json=body)

    def published(self) -> list[dict]:
        """Every published object-store prefix: [{"prefix", "teams"}] ("*" among teams: every team)."""
        return self._c._request("GET", "/v1/admin/published")["publications"]

    def publish(self, prefix: str, teams: list[str]) -> dict:
        """Let jobs of `teams` (["*"]: every team) read objects under `prefix` (a store:// URI), e.g. in `data:`."""
        return self._c._request("PUT", "/v1/admin/published", json={"prefix": prefix, "teams": list(teams)})

    def withdraw(self, prefix: str) -> dict:
        return self._c._request("DELETE", "/v1/admin/published", params={"prefix": prefix})

    def usage(self, team: str | None = None) -> dict | list[dict]:
        """One team's usage, or every team's (a list) when team is None."""
        if team is not None:
            return self._c._request("GET", f"/v1/admin/teams/{team}/usage")
        return self._c._request("GET", "/v1/admin/usage")["teams"]

    def usage_report(self, since: When, until: When = None, group_by: str = "day") -> dict:
        """Per-day accounting of every team: {"since", "until", "group_by", "days": [{"day", "team",
        "gpu_seconds", "gpu_seconds_by_type", "cpu_seconds", "memory_gib_seconds", "jobs_active",
        "jobs_submitted"}]}, computed now from the jobs' histories; since/until: datetime, ISO-8601 or
        unix seconds (until defaults to now)."""
        params = {**time_filters(since=since, until=until), "group_by": group_by}
        return self._c._request("GET", "/v1/admin/usage", params=params)["accounting"]

    def usage_csv(self, since: When, until: When = None, group_by: str = "day") -> str:
        """The same accounting as CSV text (RFC 4180, a header row)."""
        params = {**time_filters(since=since, until=until), "group_by": group_by}
        return self._c._request("GET", "/v1/admin/usage.csv", params=params, as_text=True)

    def keys(self, team: str) -> list[dict]:
        return self._c._request("GET", f"/v1/admin/teams/{team}/keys")["keys"]

    def create_key(self, team: str, name: str, role: str = "member",
                   expires_at: dt.datetime | str | None = None) -> dict:
        return self._c._request("POST", f"/v1/admin/teams/{team}/keys", json=key_body(name, role, expires_at))

    def revoke_key(self, key_id: str) -> dict:
        return self._c._request("DELETE", f"/v1/admin/keys/{key_id}")

    def audit(self, team: str | None = None, since: When = None, limit: int = 100, *, until: When = None,
              cursor: str | None = None) -> list[dict]:
        """Audit entries, newest first; since/until: a datetime, ISO-8601 text or unix seconds."""
        return self.audit_page(team, since, limit, until=until, cursor=cursor)["entries"]

    def audit_page(self, team: str | None = None, since: When = None, limit: int = 100, *, until: When = None,
                   cursor: str | None = None) -> dict:
        """One page: {"entries": [...], "next_cursor": the next page's cursor, None on the last}."""
        params: dict[str, Any] = {"limit": limit, **time_filters(since=since, until=until)}
        if team:
            params["team"] = team
        if cursor:
            params["cursor"] = cursor
        page = self._c._request("GET", "/v1/admin/audit", params=params)
        return {"entries": page["entries"], "next_cursor": page.get("next_cursor")}
