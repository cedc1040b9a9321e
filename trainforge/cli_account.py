"""`trainforge login`, `trainforge completion` and the shell completion of job ids.

`login` checks a key against the API (whoami) before it saves it, so a
typo is refused at once rather than at the next command; with `--profile`
it saves a named profile instead of the default entry. Completion is
click's own (`_TRAINFORGE_COMPLETE=bash_source trainforge`);
`trainforge completion SHELL` prints the script to source, and job ids are
completed by asking the API for the team's newest jobs - quickly and
silently: a completion that cannot reach the API offers nothing.
"""

from __future__ import annotations

import click
from click.shell_completion import CompletionItem, get_completion_class

from trainforge import clikit, config
from trainforge.sdk import Client, ClientError

# How long a completion may wait for the API, and how many jobs it offers.
COMPLETE_TIMEOUT = 2.0
COMPLETE_LIMIT = 100


def complete_job_id(ctx: click.Context, _param: click.Parameter, incomplete: str) -> list[CompletionItem]:
    """The team's job ids starting with `incomplete`, newest first, each with its name and state."""
    try:
        cfg = config.load(config.state_dir(), profile=(ctx.find_root().params or {}).get("profile"))
        with Client(cfg.api_url, cfg.api_key, timeout=COMPLETE_TIMEOUT, retry_seconds=0) as client:
            jobs = client.list(limit=COMPLETE_LIMIT)
    except (ClientError, config.UnknownProfile, OSError):
        return []
    return [CompletionItem(j["id"], help=f"{j['name']} {j['state']}") for j in jobs
            if j["id"].startswith(incomplete)]


@click.command()
@click.option("--url", required=True, help="the API's base URL, e.g. https://trainforge.example.com")
@click.option("--key", prompt="API key", hide_input=True, help="an API key (asked for when left out)")
@click.option("--profile", "profile_name", help="save as this named profile instead of the default")
@clikit.json_flag
@click.pass_context
def login(ctx: click.Context, url: str, key: str, profile_name: str | None, as_json: bool) -> None:
    """Check an API key against a platform and save it (in $TF_STATE_DIR/config.json, owner-only)."""
    as_json = clikit.use_json(ctx, as_json)
    with Client(url, key.strip()) as client:
        me = client.whoami()
    state = config.state_dir()
    cfg = config.load_file(state)
    entry = {"api_url": url.rstrip("/"), "api_key": key.strip(), "team": me["team"]}
    if profile_name:
        cfg.profiles[profile_name] = entry
    else:
        cfg.api_url, cfg.api_key, cfg.team = entry["api_url"], entry["api_key"], entry["team"]
    path = config.save(state, cfg)
    if as_json:
        clikit.emit_json({"api_url": entry["api_url"], "team": me["team"], "key_id": me["key_id"],
                          "role": me["role"], "profile": profile_name or "", "config": str(path)})
        return
    where = f"profile {profile_name!r}" if profile_name else "the default profile"
    clikit.out().print(f"logged in to {entry['api_url']} as team {me['team']} (key {me['key_id']}, "
                       f"{me['role']}); saved as {where} in {path}")


@click.command()
@click.argument("shell", type=click.Choice(["bash", "zsh", "fish"]))
@click.pass_context
def completion(ctx: click.Context, shell: str) -> None:
    """Print the completion script for SHELL, e.g. `eval "$(trainforge completion bash)"` in ~/.bashrc."""
    root = ctx.find_root().command
    cls = get_completion_class(shell)
    if cls is None:  # click.Choice already refused anything else
        raise click.UsageError(f"no completion for {shell}")
    click.echo(cls(root, {}, "trainforge", "_TRAINFORGE_COMPLETE").source())
