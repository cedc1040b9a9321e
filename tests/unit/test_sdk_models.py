"""The SDK's typed models say what the served OpenAPI schema says."""

from __future__ import annotations

import pytest

from tests.fakes.trainer_memory import InMemoryTrainer
from trainforge import models
from trainforge_services.api.app import create_app
from trainforge_services.common.settings import ApiSettings
from trainforge_services.common.states import JobState as ServerJobState


@pytest.fixture(scope="module")
def components() -> dict:
    placeholder = object()
    app = create_app(ApiSettings(dev_mode=True), trainer=InMemoryTrainer(), identity=placeholder, logs=placeholder,
                     objects=placeholder, audit=placeholder)  # type: ignore[arg-type]
    return app.openapi()["components"]["schemas"]


@pytest.mark.parametrize("model", [models.Job, models.Learner, models.HistoryEvent, models.LogLine, models.LogPage,
                                   models.Whoami])
def test_each_model_has_the_schemas_fields(components, model):
    schema = components[model.__name__]
    names = {f.alias or name for name, f in model.model_fields.items()}
    assert names == set(schema["properties"])
    # What the server always sends, the model requires or defaults; nothing the server may omit is required.
    required = {f.alias or name for name, f in model.model_fields.items() if f.is_required()}
    assert required <= set(schema.get("required", []))


def test_the_state_enum_is_the_servers():
    assert {s.value for s in models.JobState} == {s.name.lower() for s in ServerJobState if s.value}


def test_typed_results():
    job = models.Job.model_validate({
        "id": "j-1", "team": "a", "name": "n", "state": "failed", "reason": "boom", "queue_position": 0,
        "attempt": 1, "created_at": 1.0, "updated_at": 2.0, "manifest": {}, "outputs_uri": "", "future": "ignored",
        "learners": [{"rank": 0, "state": "failed", "exit_code": 3, "attempt": 1, "message": "m"}],
        "history": [{"from": "running", "to": "failed", "reason": "boom", "actor": "monitor", "timestamp": 2.0}]})
    assert job.state is models.JobState.FAILED and job.ended and job.learners[0].exit_code == 3
    assert job.history[0].from_ == "running"
