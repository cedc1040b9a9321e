"""`trainforge admin ...`: teams, quotas, usage, keys and the audit log.

Team admins manage their own team's keys (`admin keys` without `--team`);
everything else needs a platform_admin key. The first one comes from
`trainforge admin bootstrap`, which runs the embedded-stack launcher
(`python -m trainforge_services.devstack bootstrap`) as a subprocess against the
embedded stack, or against the platform the TF_* environment names: the CLI
never imports the services. Admin commands use the key saved
by `bootstrap --save` (or TRAINFORGE_ADMIN_KEY) when there is one, else the
ordinary API key.
"""

from __future__ import annotations

import datetime as dt
import re

import click
from rich.console import Console
from rich.text import Text

from trainforge import cli_usage, clikit, config, stack
from trainforge.clikit import answer, emit_json, json_flag, out, use_json, when
from trainforge.sdk import Client, ClientError

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw]?)\s*$")
_SECONDS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def _admin(ctx: click.Context) -> Client:
    return clikit.client(ctx, admin=True)


def size_text(n: int | None) -> str:
    if n is None:
        return "-"
    for unit, factor in (("Ti", 2**40), ("Gi", 2**30), ("Mi", 2**20), ("Ki", 2**10)):
        if n >= factor:
            value = n / factor
            return f"{value:.0f}{unit}" if value == int(value) else f"{value:.1f}{unit}"
    return str(n)


def _limit(used: float | int | None, limit: float | int | None, fmt=str) -> str:  # noqa: ANN001
    return f"{fmt(used or 0)} / {'∞' if limit is None else fmt(limit)}"


def _cpus(v: float) -> str:
    return f"{v:g}"


def print_usage(console: Console, reports: list[dict]) -> None:
    if not reports:
        console.print("no usage")
        return
    table = clikit.table("team", "gpus", "cpus", "memory", "jobs", "queued", "gpu hours", "by gpu type", "cohort",
                         "borrowed")
    for r in reports:
        q, u = r["quota"], r["in_use"]
        types = sorted(set(q["gpus_by_type"]) | set(u["gpus_by_type"]))
        by_type = ", ".join(f"{t} {u['gpus_by_type'].get(t, 0)}/{q['gpus_by_type'].get(t, '∞')}" for t in types)
        table.add_row(r["team"], _limit(u["gpus"], q["gpus"]), _limit(u["cpus"], q["cpus"], _cpus),
                      _limit(u["memory"], q["memory"], size_text), _limit(u["jobs"], q["jobs"]),
                      str(r["queued_jobs"]), f"{r['gpu_seconds'] / 3600:.2f}", by_type or "-",
                      q.get("cohort") or "-", _borrowed(r.get("borrowed")))
    console.print(table)


def _borrowed(b: dict | None) -> str:
    """'2 GPUs, 4 CPUs' a team's jobs hold on borrowed quota; '-' when none."""
    parts = [f"{b['gpus']} GPUs" if b and b.get("gpus") else "", f"{b['cpus']:g} CPUs" if b and b.get("cpus") else "",
             size_text(b["memory"]) if b and b.get("memory") else ""]
    return ", ".join(p for p in parts if p) or "-"


def _print_keys(console: Console, keys: list[dict]) -> None:
    if not keys:
        console.print("no keys")
        return
    table = clikit.table("id", "name", "role", "state", "created", "last used", "expires")
    for k in keys:
        expired = k["expires_at"] is not None and k["expires_at"] <= dt.datetime.now().timestamp()
        state = "revoked" if k["revoked"] else ("expired" if expired else "active")
        table.add_row(k["key_id"], Text(k["name"]), k["role"], state, when(k["created_at"]),
                      when(k["last_used_at"]), when(k["expires_at"]))
    console.print(table)


def _print_issued(console: Console, issued: dict) -> None:
    console.print(f"{issued['role']} API key {issued['key_id']} for team {issued['team']}; "
                  "it is shown only this once:")
    click.echo(issued["key"])


def _print_revoked(console: Console, revoked: dict) -> None:
    console.print(f"revoked {revoked['key_id']} ({revoked['name']}, team {revoked['team']})")


def _print_team(console: Console, team: dict) -> None:
    state = f"disabled since {when(team['disabled_at'])}" if team["disabled"] else "active"
    console.print(f"{team['name']}  {state}  created {when(team['created_at'])}")


def expires_at(expires_in: str | None) -> str | None:
    """ISO-8601 time `expires_in` (e.g. 30d, 12h, 3600) from now."""
    if not expires_in:
        return None
    m = _DURATION.match(expires_in)
    if not m:
        raise click.BadParameter("use e.g. 90m, 12h, 30d, 2w or a number of seconds", param_hint="--expires-in")
    seconds = float(m.group(1)) * _SECONDS[m.group(2)]
    return (dt.datetime.now(dt.UTC) + dt.timedelta(seconds=seconds)).isoformat()


@click.group(cls=clikit.Group)
def admin() -> None:
    """Teams, quotas, usage, API keys and the audit log (platform and team admins)."""


@admin.command()
@click.option("--team", default="platform", show_default=True, help="the platform admins' team (created if missing)")
@click.option("--name", default="bootstrap", show_default=True, help="label of the key")
@click.option("--save", is_flag=True, help="also store the key in the CLI config for `trainforge admin`")
@json_flag
@click.pass_context
def bootstrap(ctx: click.Context, team: str, name: str, save: bool, as_json: bool) -> None:
    """Create the first platform admin key (prints it once).

    Runs on the platform's side: against the embedded stack of this state directory, or the
    platform that the TF_* environment (TF_MONGO_URL, TF_MONGO_DB, TF_JWT_SECRET) names.
    """
    as_json = use_json(ctx, as_json)
    state = config.state_dir()
    issued = stack.bootstrap_admin(state, team, name)
    if save:
        cfg = config.load_file(state)
        cfg.admin_key = issued["key"]
        config.save(state, cfg)
    if as_json:
        emit_json({**issued, "saved": save})
        return
    console = out()
    _print_issued(console, issued)
    if save:
        console.print(f"saved as the admin key in {state / config.CONFIG_FILE}")


@admin.command()
@json_flag
@click.pass_context
def health(ctx: click.Context, as_json: bool) -> None:
    """The platform's components, the backend's capacity and whether its NetworkPolicies are enforced."""
    client = _admin(ctx)
    try:
        components = client.health()["components"]
    except ClientError as e:  # a component is down: /healthz answers 503 and says which
        components = {"api": {"status": "unavailable", "detail": str(e)}}
    cluster = client.admin.cluster()

    def show(console: Console, data: dict) -> None:
        for name, c in data["components"].items():
            console.print(f"{name}: {c['status']}" + (f" ({c['detail']})" if c.get("detail") else ""))
        cl = data["cluster"]
        console.print(f"backend: {cl['backend'] or 'not known'}" +
                      ("" if cl["known"] else f" ({cl['unknown_reason']})"))
        unknown = "not applicable on this backend" if cl["known"] else f"unknown ({cl['unknown_reason']})"
        console.print(f"NetworkPolicy: {cl['network_policy'] or unknown}")

    answer(use_json(ctx, as_json), {"components": components, "cluster": cluster}, show)


# -- teams ---------------------------------------------------------------------------------


@admin.group(cls=clikit.Group)
def teams() -> None:
    """List, create, disable and enable teams (platform admins)."""


@teams.command("list")
@json_flag
@click.pass_context
def teams_list(ctx: click.Context, as_json: bool) -> None:
    """Every team."""
    as_json = use_json(ctx, as_json)
    found = _admin(ctx).admin.teams()
    if as_json:
        emit_json(found)
        return
    console = out()
    for team in found:
        _print_team(console, team)
    if not found:
        console.print("no teams")


def _team_command(name: str, help_: str, action: str) -> None:
    @teams.command(name, help=help_)
    @click.argument("team")
    @json_flag
    @click.pass_context
    def command(ctx: click.Context, team: str, as_json: bool) -> None:
        as_json = use_json(ctx, as_json)
        answer(as_json, getattr(_admin(ctx).admin, action)(team), _print_team)


_team_command("create", "Create a team.", "create_team")
_team_command("show", "One team.", "team")
_team_command("disable", "Disable a team: its keys and tokens are refused (401) from the next request on.",
              "disable_team")
_team_command("enable", "Enable a disabled team again.", "enable_team")


# -- quotas and usage -------------------------------------------------------------------------


@admin.group(cls=clikit.Group)
def quota() -> None:
    """Team quotas (platform admins)."""


def _gpu_types(_: click.Context, __: click.Parameter, values: tuple[str, ...]) -> dict[str, int]:
    out_: dict[str, int] = {}
    for value in values:
        name, sep, count = value.partition("=")
        if not sep or not count.strip().isdigit():
            raise click.BadParameter(f"{value!r}: use TYPE=COUNT, e.g. a100=4", param_hint="--gpu-type")
        out_[name.strip()] = int(count)
    return out_


def _limits(_: click.Context, param: click.Parameter, value: str | None) -> dict[str, object]:
    """gpus=2,cpus=4,memory=8Gi -> {"gpus": 2, "cpus": 4.0, "memory": "8Gi"}."""
    limits: dict[str, object] = {}
    for part in (value or "").split(","):
        if not part.strip():
            continue
        name, sep, amount = (x.strip() for x in part.partition("="))
        kinds = {"gpus": int, "cpus": float, "memory": str}
        if not sep or name not in kinds or not amount:
            raise click.BadParameter(f"{part!r}: use RESOURCE=AMOUNT with gpus, cpus or memory, e.g. gpus=2,memory=8Gi",
                                     param_hint=f"--{param.name.replace('_', '-')}" if param.name else None)
        try:
            limits[name] = kinds[name](amount)
        except ValueError:
            raise click.BadParameter(f"{name}: {amount!r} is not a number",
                                     param_hint=f"--{(param.name or '').replace('_', '-')}") from None
    return limits


@quota.command("set")
@click.argument("team")
@click.option("--gpus", type=int, help="GPUs the team's jobs may hold at once")
@click.option("--cpus", type=float, help="CPU cores")
@click.option("--memory", help="memory, e.g. 64Gi")
@click.option("--jobs", type=int, help="jobs holding resources at once")
@click.option("--gpu-type", "gpu_types", multiple=True, callback=_gpu_types,
              help="per GPU type, TYPE=COUNT (repeatable), e.g. a100=4")
@click.option("--cohort", default="", help="share unused gpus, cpus and memory with the teams of this cohort")
@click.option("--lending-limit", callback=_limits, help="most of the unused quota the cohort may borrow, "
              "e.g. gpus=2,memory=16Gi")
@click.option("--borrowing-limit", callback=_limits, help="most the team may hold beyond its quota, e.g. gpus=4")
@click.option("--egress", help="the team's own egress policy for sandboxed learners: none, or store and "
                               "host:port items, comma-separated; narrows the admin's (not given: the admin's)")
@json_flag
@click.pass_context
def quota_set(ctx: click.Context, team: str, gpus: int | None, cpus: float | None, memory: str | None,
              jobs: int | None, gpu_types: dict[str, int], cohort: str, lending_limit: dict,
              borrowing_limit: dict, egress: str | None, as_json: bool) -> None:
    """Replace TEAM's quota; a limit not given is no limit of the team's own. In a --cohort, the team lends
    what it leaves unused to the cohort's other teams and may borrow theirs (docs: "Sharing quota")."""
    as_json = use_json(ctx, as_json)
    report = _admin(ctx).admin.set_quota(team, gpus=gpus, cpus=cpus, memory=memory, jobs=jobs,
                                         gpus_by_type=gpu_types, cohort=cohort, lending_limit=lending_limit,
                                         borrowing_limit=borrowing_limit, egress=egress)
    answer(as_json, report, lambda console, one: print_usage(console, [one]))


@admin.command()
@click.argument("team", required=False)
@click.option("--since", help="per-day accounting from this time (ISO-8601, e.g. 2026-11-01, or unix seconds)")
@click.option("--until", help="accounting until this time (exclusive; default now)")
@click.option("--csv", "as_csv", is_flag=True, help="the accounting as CSV (RFC 4180) on stdout")
@json_flag
@click.pass_context
def usage(ctx: click.Context, team: str | None, since: str | None, until: str | None, as_csv: bool,
          as_json: bool) -> None:
    """Quota and usage of TEAM, or of every team (platform admins). With --since: GPU-, CPU- and
    memory-seconds and job counts per team per UTC day (TEAM, if given, picks its rows)."""
    as_json = use_json(ctx, as_json)
    if since is not None or until is not None or as_csv:
        cli_usage.accounting(_admin(ctx).admin, team, since, until, as_csv=as_csv, as_json=as_json)
        return
    reports = _admin(ctx).admin.usage(team)
    answer(as_json, reports, lambda console, found: print_usage(console, [found] if isinstance(found, dict) else found))


# -- keys ----------------------------------------------------------------------------------


@admin.group(cls=clikit.Group)
def keys() -> None:
    """API keys: your own team's (team admins), or any team's with --team (platform admins)."""


def _other_team(client: Client, team: str | None) -> bool:
    """Whether --team names a team other than the caller's, which takes the platform admin routes."""
    if team is None:
        return False
    me = client.whoami()
    if me["role"] == "platform_admin":
        return True
    if team != me["team"]:
        raise ClientError(f"only platform admins manage another team's keys (your team is {me['team']})")
    return False


@keys.command("list")
@click.option("--team", help="another team's keys (platform admins)")
@json_flag
@click.pass_context
def keys_list(ctx: click.Context, team: str | None, as_json: bool) -> None:
    """A team's keys (never their secrets)."""
    as_json = use_json(ctx, as_json)
    client = _admin(ctx)
    answer(as_json, client.admin.keys(team) if _other_team(client, team) else client.keys(), _print_keys)


@keys.command("create")
@click.argument("name")
@click.option("--team", help="another team (platform admins)")
@click.option("--role", type=click.Choice(["member", "team_admin", "platform_admin"]), default="member",
              show_default=True, help="no higher than your own")
@click.option("--expires-in", help="e.g. 90m, 12h, 30d; default: never")
@json_flag
@click.pass_context
def keys_create(ctx: click.Context, name: str, team: str | None, role: str, expires_in: str | None,
                as_json: bool) -> None:
    """Issue a key called NAME (who or what uses it); it is printed only this once."""
    as_json = use_json(ctx, as_json)
    client = _admin(ctx)
    expires = expires_at(expires_in)
    if _other_team(client, team):
        issued = client.admin.create_key(team, name, role, expires)  # type: ignore[arg-type]
    else:
        issued = client.create_key(name, role, expires)
    answer(as_json, issued, _print_issued)


@keys.command("revoke")
@click.argument("key_id")
@json_flag
@click.pass_context
def keys_revoke(ctx: click.Context, key_id: str, as_json: bool) -> None:
    """Revoke a key: your team's (team admins) or any (platform admins); effective at once."""
    as_json = use_json(ctx, as_json)
    client = _admin(ctx)
    platform = client.whoami()["role"] == "platform_admin"
    answer(as_json, client.admin.revoke_key(key_id) if platform else client.revoke_key(key_id), _print_revoked)


# -- audit ---------------------------------------------------------------------------------


@admin.command()
@click.option("--team", help="entries by or about this team")
@click.option("--since", help="only entries at or after this time (ISO-8601 time or unix seconds)")
@click.option("--until", help="only entries before this time (ISO-8601 time or unix seconds)")
@click.option("--limit", default=100, show_default=True, type=click.IntRange(1, 1000),
              help="most entries listed (with --all: per page)")
@click.option("--all", "every", is_flag=True, help="every matching entry, following the pages")
@json_flag
@click.pass_context
def audit(ctx: click.Context, team: str | None, since: str | None, until: str | None, limit: int, every: bool,
          as_json: bool) -> None:
    """Who changed what and when, newest first (platform admins)."""
    as_json = use_json(ctx, as_json)
    admin_api = _admin(ctx).admin
    page = admin_api.audit_page(team=team, since=since, until=until, limit=limit)
    entries = page["entries"]
    while every and page["next_cursor"]:
        page = admin_api.audit_page(team=team, since=since, until=until, limit=limit, cursor=page["next_cursor"])
        entries += page["entries"]
    if as_json:
        emit_json(entries)
        return
    console = out()
    if not entries:
        console.print("no audit entries")
        return
    table = clikit.table("time", "key", "team", "method", "route", "target", "status")
    for e in entries:
        style = "red" if e["status"] >= 400 else ""
        table.add_row(when(e["ts"]), e["key_id"] or "-", e["team"] or "-", e["method"], e["route"] or e["path"],
                      e["target"] or "-", Text(str(e["status"]), style=style))
    console.print(table)
    if page["next_cursor"] and not every:
        console.print(Text(f"more entries match: --all lists every one, --limit {limit} per page", style="dim"))
