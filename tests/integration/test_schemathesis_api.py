"""Property-based tests of the whole REST API from its own OpenAPI spec (schemathesis).

Every operation gets up to 25 generated requests, valid and invalid,
authenticated as a platform admin (the role that reaches every route) over
real HTTP. Each answer must not be a 5xx, must have a status the operation
declares, and its body and headers must match the declared schema — the
routes declare their response models and error bodies, so this checks the
shapes clients rely on.

Two more phases check that the schema tells the truth: the negative phase
sends only requests the schema forbids (a state it does not enumerate, a
job id that breaks its pattern, a size over its bound, a `code` that is not
a file) and each must be refused with a 4xx; the stateful phase follows the
schema's OpenAPI links from a submitted job to get, logs, halt, resume and
cancel it.
"""

from __future__ import annotations

import json
import uuid
from types import SimpleNamespace

import hypothesis
import pytest
import schemathesis
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    negative_data_rejection,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from tests.fakes.trainer_memory import InMemoryTrainer
from tests.integration.test_trainer_dispatcher import ScriptedLcm
from tests.servers import serve_app
from trainforge_services.api.app import create_app
from trainforge_services.api.experiments import ExperimentCalls
from trainforge_services.api.identity import IdentityStore, Role
from trainforge_services.common import rpcauth
from trainforge_services.common.adapters.logstore import LogStore
from trainforge_services.common.adapters.mongo import connect
from trainforge_services.common.adapters.objectstore import LocalStore
from trainforge_services.common.settings import ApiSettings, TrainerSettings
from trainforge_services.trainer.resources import BackendSize, Usage
from trainforge_services.trainer.wiring import serve

# Not among the checks: positive_data_acceptance (a valid-looking request may
# rightly be refused, e.g. 404 for a generated id or 409 for a state) and
# negative_data_rejection (its "invalid" cases include unknown query
# parameters, which HTTP APIs ignore, and a missing Authorization header,
# which the fixed header above always supplies). Invalid values of declared
# parameters still get 422, which status_code_conformance checks is declared.
CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance,
          response_headers_conformance]


@pytest.fixture(scope="module")
def served(mongo_server, osmem_server, tmp_path_factory):
    unique = uuid.uuid4().hex[:10]
    db = connect(mongo_server.url, f"tfst{unique}")
    logs = LogStore(osmem_server.url, index=f"tf-logs-st-{unique}")
    identity = IdentityStore(db)
    for team in ("alpha", "beta", "ops"):
        identity.create_team(team)
    key = identity.issue_key("ops", "schemathesis", Role.PLATFORM_ADMIN)
    identity.issue_key("alpha", "someone", Role.MEMBER)
    trainer = InMemoryTrainer()
    trainer.submit_job(team="ops", manifest_json=json.dumps({"name": "x"}), code_uri="", submitted_by="x",
                       job_id="j-000000000001")
    # experiments go to a real Trainer (scripted LCM: nothing is deployed) on the same MongoDB-wire server
    real_settings = TrainerSettings(state_dir=tmp_path_factory.mktemp("trainer"), dev_mode=True,
                                    mongo_url=mongo_server.url, mongo_db=f"tfst{unique}", trainer_address="127.0.0.1:0",
                                    logstore_url=osmem_server.url, logstore_index=f"tf-logs-st-{unique}")
    real = serve(real_settings, lcm=ScriptedLcm(BackendSize(Usage(cpus=8, memory=32 * 2**30, learners=8))))
    experiments = ExperimentCalls(real.address, authorization=rpcauth.service_authorization(real_settings))
    settings = ApiSettings(dev_mode=True, rate_limit_per_second=0, max_upload_bytes=4096)
    app = create_app(settings, trainer=trainer, identity=identity, logs=logs,
                     objects=LocalStore(tmp_path_factory.mktemp("objects")), experiments=experiments)
    try:
        with serve_app(app) as url:
            yield SimpleNamespace(url=url, key=key, app=app)
    finally:
        experiments.close()
        real.stop(grace=0)
    logs.close()
    db.client.close()


def _spec() -> dict:
    """The app's spec; building the app touches nothing, so no server is needed to read it."""
    placeholder = object()
    app = create_app(ApiSettings(dev_mode=True), trainer=InMemoryTrainer(), identity=placeholder, logs=placeholder,
                     objects=placeholder, audit=placeholder)  # type: ignore[arg-type]
    return app.openapi()


def _workflow_spec() -> dict:
    """The spec cut to the job workflow its links describe (submit, get, logs, halt, resume, cancel): with every
    job route in, the generated sequences spread over reads and may never reach a state change."""
    spec = _spec()
    keep = {"/v1/jobs", "/v1/jobs/{job_id}", *(f"/v1/jobs/{{job_id}}/{op}" for op in ("logs", "halt", "resume", "cancel"))}
    spec["paths"] = {path: ops for path, ops in spec["paths"].items() if path in keep}
    return spec


schema = schemathesis.openapi.from_dict(_spec())
# Only requests the schema forbids; unknown query parameters (which HTTP APIs ignore) and a negated
# Authorization header (the fixed header always supplies one) are left out of what counts as forbidden.
negative = schemathesis.openapi.from_dict(_spec())
negative.config.generation.update(modes=[GenerationMode.NEGATIVE], allow_extra_parameters=False,
                                  with_security_parameters=False)
SETTINGS = dict(deadline=None, derandomize=True, database=None,
                suppress_health_check=[hypothesis.HealthCheck.too_slow, hypothesis.HealthCheck.filter_too_much,
                                       hypothesis.HealthCheck.data_too_large])


def test_the_spec_under_test_is_the_served_apps(served):
    assert schema.raw_schema == served.app.openapi()


@schema.parametrize()
@hypothesis.settings(max_examples=25, deadline=None, derandomize=True, database=None,
                     suppress_health_check=[hypothesis.HealthCheck.too_slow, hypothesis.HealthCheck.filter_too_much,
                                            hypothesis.HealthCheck.data_too_large])
def test_api_conforms_to_its_spec(case, served):
    case.call_and_validate(base_url=served.url, headers={"Authorization": f"Bearer {served.key}"}, checks=CHECKS,
                           timeout=30)


@negative.parametrize()
@hypothesis.settings(max_examples=15, **SETTINGS)
def test_api_refuses_what_its_spec_forbids(case, served):
    case.call_and_validate(base_url=served.url, headers={"Authorization": f"Bearer {served.key}"},
                           checks=[not_a_server_error, negative_data_rejection], timeout=30)


def test_job_workflows_through_the_specs_links(served):
    """Submit, then get/logs/halt/resume/cancel the job the answer names, in generated orders."""
    machine = schemathesis.openapi.from_dict(_workflow_spec()).as_state_machine()
    calls: list[tuple[str, str, int]] = []

    class Workflow(machine):  # type: ignore[misc, valid-type]
        def call(self, case, **kwargs):
            if case.operation.path == "/v1/jobs" and case.method == "POST":
                # A job to follow the links from: the stateless tests already fuzz the manifest itself.
                case.body = {"manifest": "name: linked\nframework: custom\ncommand: 'true'\n"}
                case.headers = {k: v for k, v in (case.headers or {}).items() if k.lower() != "idempotency-key"}
            response = super().call(case, **kwargs)
            calls.append((case.method, case.operation.path, response.status_code))
            return response

        def get_call_kwargs(self, case):
            return {"base_url": served.url, "headers": {"Authorization": f"Bearer {served.key}"}, "timeout": 30}

        def validate_response(self, response, case, additional_checks=None, **kwargs):
            case.validate_response(response, checks=CHECKS)

    Workflow.run(settings=hypothesis.settings(max_examples=15, stateful_step_count=6, **SETTINGS))
    followed = {(method, path) for method, path, status in calls if status in (200, 409) and "{job_id}" in path}
    assert ("POST", "/v1/jobs") in {(m, p) for m, p, st in calls if st == 201}, calls
    # Jobs the links led to were found and acted on (200, or 409 for a halt of a queued job): which operations
    # the generated sequences reach varies with the schema, so at least one change and one more.
    changes = {("POST", f"/v1/jobs/{{job_id}}/{verb}") for verb in ("cancel", "halt", "resume")}
    assert followed & changes and len(followed) >= 2, sorted(followed)
