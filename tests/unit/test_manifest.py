"""Manifest validation: every problem reported, each naming its field."""

import pytest

from trainforge_services.common.errors import InvalidArgument
from trainforge_services.common.manifest import Priority, parse_manifest
from trainforge_services.common.quantities import parse_duration, parse_memory
from trainforge_services.trainer.admission import demand


def test_valid_manifest_is_normalised():
    m = parse_manifest("""
name: mnist-ddp
learners: 2
resources: {gpus: 1, cpus: 2, memory: 4Gi}
command: python train.py --lr {{lr}}
params: {lr: 0.01}
restart: {max_restarts: 3, backoff: 10s}
priority: high
""")
    assert m.resources.memory == 4 * 2**30
    assert m.restart.backoff == 10.0
    assert m.priority is Priority.HIGH
    assert m.rendered_command() == "python train.py --lr 0.01"
    assert demand(m).gpus == 2  # per learner times learners
    again = parse_manifest(m.model_dump_json())
    assert again == m


def test_every_bad_field_is_listed_by_name():
    with pytest.raises(InvalidArgument) as exc:
        parse_manifest("""
name: Bad_Name
learners: 0
resources: {memory: lots, gpus: -1}
outputs: ../escape
priority: urgent
bogus: 1
""")
    fields = {d["field"] for d in exc.value.details}
    assert fields == {"name", "learners", "resources.memory", "resources.gpus", "outputs", "priority", "bogus",
                      "command"}
    assert "resources.memory" in exc.value.message


def test_undefined_placeholder_is_rejected():
    with pytest.raises(InvalidArgument, match=r"params does not define: lr"):
        parse_manifest("name: a\ncommand: python t.py --lr {{lr}}\n")


@pytest.mark.parametrize("text", ["[1, 2]", "just a string", "{unclosed"])
def test_non_mapping_or_broken_yaml(text):
    with pytest.raises(InvalidArgument) as exc:
        parse_manifest(text)
    assert exc.value.details[0]["field"] == "manifest"


@pytest.mark.parametrize(("value", "expected"), [("512Mi", 512 * 2**20), ("2G", 2 * 10**9), (1024, 1024),
                                                 ("1.5Gi", int(1.5 * 2**30))])
def test_memory_sizes(value, expected):
    assert parse_memory(value) == expected


@pytest.mark.parametrize("value", ["lots", "-1Gi", 0, True])
def test_bad_memory_sizes(value):
    with pytest.raises(ValueError):
        parse_memory(value)


@pytest.mark.parametrize(("value", "expected"), [("10s", 10), ("2m", 120), ("500ms", 0.5), (3, 3.0)])
def test_durations(value, expected):
    assert parse_duration(value) == expected


YAML_TEXT = """
name: mnist
resources: {cpus: 0.5, memory: 64Mi}
command: python train.py --lr {{lr}}
params: {lr: 0.01, note: "a: b"}
"""


def test_json_text_yaml_text_and_a_yaml_flow_mapping_give_the_same_manifest():
    from_yaml = parse_manifest(YAML_TEXT)
    json_text = from_yaml.model_dump_json()
    assert parse_manifest(json_text) == from_yaml
    assert parse_manifest(json_text.encode()) == from_yaml
    assert parse_manifest("  \n" + json_text) == from_yaml
    # starts with "{" but is YAML, not JSON: read by the YAML parser
    flow = ('{name: mnist, resources: {cpus: 0.5, memory: 64Mi}, command: "python train.py --lr {{lr}}", '
            'params: {lr: 0.01, note: "a: b"}}')
    assert parse_manifest(flow) == from_yaml


def test_non_json_constants_mean_what_yaml_says():
    # NaN is not JSON; YAML 1.1 reads it as a string, so the param is the text "NaN", as before
    m = parse_manifest('{"name": "x", "command": "run {{v}}", "params": {"v": NaN}}')
    assert m.params == {"v": "NaN"}


def test_a_broken_document_still_names_where_it_broke():
    for text in ('{"name": "x", "command": ', "name: x\ncommand: [unclosed\n"):
        with pytest.raises(InvalidArgument) as e:
            parse_manifest(text)
        assert "not valid YAML or JSON" in e.value.message
        assert "line" in e.value.message
