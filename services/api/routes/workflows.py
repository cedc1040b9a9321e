"""A team's workflows over HTTP: DAGs of experiments (`kind: workflow`, or Hyper's `experiments:` shape).

Scoped like jobs and experiments: another team's workflow is a 404 exactly
like a missing one. Each node's experiment is read at /v1/experiments/{id}.
The routes are a run's (routes/runs.py); a workflow's one action is cancel.
"""

from __future__ import annotations

from pydantic import BaseModel, Field

from trainforge_services.api.routes.runs import RunRoutes, run_model


class Node(BaseModel):
    name: str
    depends_on: list[str]
    take: str = Field(description="best or all: which upstream trials' outputs this node's trials receive")
    experiment_id: str | None = Field(description="the node's experiment; null until it starts")
    state: str = Field(description="waiting, skipped, or its experiment's state")
    reason: str
    best_trial: int | None


Workflow = run_model("Workflow", states="running, completed, failed, cancelled",
                     nodes=(list[Node], Field(description="in a topological order")))

routes = RunRoutes("workflow", "workflows", model=Workflow, example="w-1a2b3c4d5e6f")
router = routes.router
routes.submit(summary="Submit a workflow (a DAG of experiments)", recipe="the workflow recipe, YAML or JSON",
              doc="""Validate the DAG (no cycles; unknown names and bad fields named), store the code once for every node,
and hand it to the Trainer, which starts each experiment once those it depends on completed.""")
routes.listing(summary="The team's workflows, newest first")
routes.one(summary="One workflow and its nodes")
routes.action("cancel", summary="Cancel a workflow and the experiment it runs", conflict="the workflow already ended")
