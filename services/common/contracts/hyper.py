"""Hyper's recipe shape, translated into trainforge's experiments.

Hyper (Fig. 1 of its paper) writes a workflow as
`experiments: {name: {framework, parameters, samples, workers, hardware,
command, depends_on}}`. Each entry becomes a `kind: experiment` mapping
(services/common/contracts/experiments.py): `framework` pytorch/torch ->
torch, anything else -> custom (a plain command); `workers` (Hyper's
parallel workers) -> `max_parallel`; `hardware` as `cpu`, `gpu`, `<n>xgpu`,
`<n>x<gpu type>` or `{gpus, cpus, memory, gpu_type}` -> `resources`. Fields
trainforge's experiments take as they are pass through; anything else is
refused, naming `experiments.<name>.<field>` and what to write instead. The
notes say what was translated, so the user sees it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from trainforge_services.common.errors import InvalidArgument

_GPUS = re.compile(r"^\s*(\d+)\s*x\s*([a-z0-9-]+)\s*$", re.IGNORECASE)
_TORCH = {"pytorch", "torch"}
# taken as they are: the experiment's own fields and the job manifest's
_NATIVE = {"command", "parameters", "samples", "mode", "max_parallel", "prestart", "objective", "early_stopping", "retries",
           "seed", "env", "params", "code", "data", "outputs", "restart", "checkpoint", "priority", "image",
           "requirements", "labels", "timeout", "notify", "learners", "resources", "depends_on", "take", "kind"}
_NO_EQUIVALENT = {
    "credentials": "the platform stores data and code itself; use team secrets (env: {VAR: {secret: name}})",
    "region": "the platform runs where it is deployed",
    "instance": "give hardware as {gpus, cpus, memory}",
    "spot": "trials run on the platform's own capacity",
}


@dataclass(frozen=True)
class Translation:
    experiments: dict[str, dict[str, Any]]
    notes: list[str] = field(default_factory=list)

    def single(self) -> dict[str, Any]:
        """The one experiment of a single-experiment recipe."""
        if len(self.experiments) != 1:
            raise InvalidArgument("the recipe holds several experiments; submit it as a workflow",
                                  details=[{"field": "experiments", "message": "more than one experiment"}])
        return next(iter(self.experiments.values()))


def _hardware(value: Any, where: str, notes: list[str]) -> dict[str, Any]:
    if isinstance(value, dict):
        return value
    text = str(value).strip().lower()
    if text == "cpu":
        return {}
    if text == "gpu":
        return {"gpus": 1}
    m = _GPUS.match(text)
    if m:
        n, kind = int(m.group(1)), m.group(2)
        notes.append(f"{where}: {value!r} -> resources.gpus: {n}" + ("" if kind == "gpu" else f", gpu_type: {kind}"))
        return {"gpus": n} if kind == "gpu" else {"gpus": n, "gpu_type": kind}
    raise InvalidArgument(f"{where}: {value!r} has no equivalent; write cpu, gpu, <n>xgpu, <n>x<gpu type> or "
                          "{gpus, cpus, memory}",
                          details=[{"field": where, "message": "no equivalent; use cpu, gpu, <n>x<type> or a mapping"}])


def translate(recipe: dict[str, Any]) -> Translation:
    """Hyper's `experiments:` mapping -> one `kind: experiment` mapping per experiment, by name."""
    experiments = recipe.get("experiments")
    if not isinstance(experiments, dict) or not experiments:
        raise InvalidArgument("experiments must map each experiment's name to its fields",
                              details=[{"field": "experiments", "message": "must be a non-empty mapping"}])
    details: list[dict] = [{"field": k, "message": "unknown field beside experiments"}
                           for k in recipe if k not in ("experiments", "kind", "name")]
    notes: list[str] = []
    out: dict[str, dict[str, Any]] = {}
    for name, body in experiments.items():
        where = f"experiments.{name}"
        if not isinstance(body, dict):
            details.append({"field": where, "message": "must be a mapping of fields"})
            continue
        data: dict[str, Any] = {"name": str(name)}
        for key, value in body.items():
            path = f"{where}.{key}"
            if key == "framework":
                torch = str(value).lower() in _TORCH
                data["framework"] = "torch" if torch else "custom"
                if not torch:
                    notes.append(f"{path}: {value!r} runs as a plain command (framework custom)")
            elif key == "workers":
                data["max_parallel"] = value
                notes.append(f"{path}: {value} -> max_parallel: {value} (trials at once)")
            elif key == "hardware":
                try:
                    data["resources"] = _hardware(value, path, notes)
                except InvalidArgument as e:
                    details += e.details
            elif key in _NATIVE:
                data[key] = value
            elif key in _NO_EQUIVALENT:
                details.append({"field": path, "message": f"no equivalent: {_NO_EQUIVALENT[key]}"})
            else:
                details.append({"field": path, "message": "unknown field"})
        out[str(name)] = data
    if details:
        summary = "; ".join(f"{d['field']}: {d['message']}" for d in details)
        raise InvalidArgument(f"invalid recipe: {summary}", details=details)
    return Translation(out, notes)
