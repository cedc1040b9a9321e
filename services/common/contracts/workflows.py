"""The workflow recipe: a DAG of experiments whose upstream outputs become downstream `data:`.

    kind: workflow
    name: tune-and-train
    experiments:
      sweep:  {command: ..., parameters: ..., objective: ...}
      train:  {command: ..., depends_on: [sweep], take: best}
      evaluate: {command: ..., depends_on: [train]}

Each node is an experiment recipe (Hyper's shape is translated the same way,
services/common/contracts/hyper.py) plus `depends_on` and `take` (`best`:
the upstream's best trial's outputs — its only trial's when it has no
objective — or `all`: every completed trial's). Upstream `u`'s outputs land
in the node's trials at `inputs/<u>/` (`inputs/<u>/<trial>/` with `take:
all`), each learner rank's outputs under its rank. Validated at submit:
every node as an experiment (errors named `experiments.<node>.<field>`),
unknown names in `depends_on`, and cycles, each named by field.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any

from trainforge_services.common.contracts.experiments import ExperimentSpec, parse_experiment
from trainforge_services.common.contracts.hyper import translate
from trainforge_services.common.contracts.sampling import plan_trials
from trainforge_services.common.contracts.storekeys import outputs_root, uri_for_prefix
from trainforge_services.common.errors import InvalidArgument
from trainforge_services.common.manifest import DataSource

MAX_NODES = 50


class Take(enum.StrEnum):
    BEST = "best"
    ALL = "all"


@dataclass(frozen=True)
class Node:
    name: str
    recipe: dict[str, Any]  # the node's experiment recipe, translated, without depends_on/take
    depends_on: tuple[str, ...]
    take: Take


@dataclass(frozen=True)
class WorkflowSpec:
    name: str
    nodes: tuple[Node, ...]  # in a topological order (every node after what it depends on)
    notes: tuple[str, ...] = ()


def _fail(details: list[dict]) -> InvalidArgument:
    summary = "; ".join(f"{d['field']}: {d['message']}" for d in details)
    return InvalidArgument(f"invalid workflow: {summary}", details=details)


def _order(nodes: dict[str, tuple[str, ...]]) -> tuple[list[str], list[str]]:
    """Kahn's order, and the nodes left on a cycle (empty when there is none)."""
    indegree = {n: len(deps) for n, deps in nodes.items()}
    order = [n for n in nodes if indegree[n] == 0]
    for n in order:
        for m, deps in nodes.items():
            if n in deps:
                indegree[m] -= 1
                if indegree[m] == 0:
                    order.append(m)
    return order, [n for n in nodes if n not in order]


def _cycle(nodes: dict[str, tuple[str, ...]], left: list[str]) -> list[str]:
    """One cycle among `left`, as a path that ends where it starts."""
    path, at = [left[0]], left[0]
    while True:
        at = next(d for d in nodes[at] if d in left)
        if at in path:
            return [*path[path.index(at):], at]
        path.append(at)


def parse_workflow(data: dict) -> WorkflowSpec:
    """A loaded `kind: workflow` recipe -> WorkflowSpec; InvalidArgument naming every bad field."""
    experiments = data.get("experiments")
    if isinstance(experiments, dict) and len(experiments) > MAX_NODES:
        raise _fail([{"field": "experiments", "message": f"at most {MAX_NODES} experiments"}])
    translation = translate({k: v for k, v in data.items() if k in ("experiments", "kind", "name")})
    # `code:` names the folder the CLI uploads once for every experiment
    details: list[dict] = [{"field": k, "message": "unknown field beside experiments"}
                           for k in data if k not in ("experiments", "kind", "name", "code")]
    deps: dict[str, tuple[str, ...]] = {}
    takes: dict[str, Take] = {}
    recipes: dict[str, dict] = {}
    for name, body in translation.experiments.items():
        where = f"experiments.{name}"
        raw_deps = body.pop("depends_on", [])
        if isinstance(raw_deps, str):
            raw_deps = [raw_deps]
        if not isinstance(raw_deps, list) or not all(isinstance(d, str) for d in raw_deps):
            details.append({"field": f"{where}.depends_on", "message": "must be a list of experiment names"})
            raw_deps = []
        unknown = [d for d in raw_deps if d not in translation.experiments]
        details += [{"field": f"{where}.depends_on", "message": f"unknown experiment {d!r}"} for d in unknown]
        deps[name] = tuple(d for d in raw_deps if d not in unknown)
        take = body.pop("take", "best")
        try:
            takes[name] = Take(str(take))
        except ValueError:
            details.append({"field": f"{where}.take", "message": "must be best or all"})
            takes[name] = Take.BEST
        if "parameters" not in body:
            body["parameters"] = {}
        try:
            plan_trials(parse_experiment(body))
        except InvalidArgument as e:
            details += [{"field": f"{where}.{d['field']}", "message": d["message"]} for d in e.details]
        recipes[name] = body
    order, left = _order(deps)
    if left:
        cycle = _cycle(deps, left)
        details.append({"field": f"experiments.{cycle[0]}.depends_on",
                        "message": f"cycle: {' -> '.join(cycle)}"})
    if details:
        raise _fail(details)
    name = data.get("name") or (order[0] if order else "workflow")
    nodes = tuple(Node(n, recipes[n], deps[n], takes[n]) for n in order)
    return WorkflowSpec(str(name), nodes, tuple(translation.notes))


def inputs_for(upstream: str, take: Take, jobs: list[tuple[int, str]]) -> list[DataSource]:
    """The `data:` entries that bring an upstream experiment's chosen trials' outputs into a node's trials."""
    if take == Take.BEST:
        return [DataSource(source=uri_for_prefix(outputs_root(job_id)), path=f"inputs/{upstream}/")
                for _, job_id in jobs[:1]]
    return [DataSource(source=uri_for_prefix(outputs_root(job_id)), path=f"inputs/{upstream}/{index}/")
            for index, job_id in jobs]


def with_inputs(spec: ExperimentSpec, data: list[DataSource]) -> ExperimentSpec:
    template = spec.template.model_copy(update={"data": [*spec.template.data, *data]})
    return spec.model_copy(update={"template": template})
