"""Experiments through a real Trainer: its gRPC face, the MongoDB-wire store and the log store's metrics index.

The LCM is the scripted stand-in of the dispatcher tests, and the job
monitor's reports are made directly (as in test_trainer_halt_restart.py);
the trials' metric records are written into the real OpenSearch-compatible
server's metrics index exactly as a controller ships them, so the driver
reads what it would read in production.
"""

from __future__ import annotations

import datetime
import json
import threading

import grpc
import pytest

from tests.integration.test_trainer_dispatcher import ScriptedLcm
from tests.servers import wait_for
from trainforge_protos import trainer_pb2, trainer_pb2_grpc
from trainforge_services.common import rpc, rpcauth
from trainforge_services.common.adapters.logstore import LogLine, LogStore
from trainforge_services.common.contracts.experiments import ExperimentState
from trainforge_services.common.settings import TrainerSettings
from trainforge_services.common.states import JobState
from trainforge_services.trainer.experiments.slots import SLOT, behind_gate, holds_slot
from trainforge_services.trainer.resources import BackendSize, Quota, Usage
from trainforge_services.trainer.wiring import serve

GI = 2**30
TEAM = "vision"
RUNNING_EXP = ExperimentState.EXPERIMENT_RUNNING


class Env:
    """One Trainer (restartable on the same database) and what a test needs to play monitor and learner."""

    def __init__(self, mongo_server, osmem_server, unique, tmp_path):  # noqa: ANN001
        self.settings = TrainerSettings(state_dir=tmp_path, dev_mode=True, mongo_url=mongo_server.url,
                                        mongo_db=f"tf{unique}", trainer_address="127.0.0.1:0",
                                        logstore_url=osmem_server.url, logstore_index=f"tf-logs-{unique}",
                                        dispatch_interval=0.2, experiment_interval=0.2, lcm_timeout=5)
        self.lcm = ScriptedLcm(BackendSize(Usage(cpus=16, memory=64 * GI, learners=16)))
        self.collection = f"jobs_{unique}"
        self.metrics = LogStore(osmem_server.url, f"tf-logs-{unique}").metrics_store()
        self.seq: dict[str, int] = {}
        self.trainer = None
        self.channel = None
        self.start()

    def start(self) -> None:
        self.trainer = serve(self.settings, lcm=self.lcm, collection=self.collection,
                             experiment_collection=f"x_{self.collection}")
        self.channel = rpc.channel(self.trainer.address,
                                   authorization=rpcauth.service_authorization(self.settings))
        self.stub = trainer_pb2_grpc.TrainerStub(self.channel)

    def stop(self) -> None:
        self.channel.close()
        self.trainer.stop(grace=0)

    def close(self) -> None:
        self.stop()
        self.metrics.close()

    # -- the experiment RPCs -------------------------------------------------------

    def submit(self, recipe: dict) -> trainer_pb2.Experiment:
        return self.stub.SubmitExperiment(trainer_pb2.SubmitExperimentRequest(team=TEAM, recipe=json.dumps(recipe),
                                                                             submitted_by="user:k1"))

    def get(self, exp_id: str) -> trainer_pb2.Experiment:
        return self.stub.GetExperiment(trainer_pb2.GetExperimentRequest(team=TEAM, experiment_id=exp_id))

    # -- playing the learners and the monitor ------------------------------------------

    def job(self, job_id: str):  # noqa: ANN201
        return self.trainer.store.find(job_id)

    def deployed(self, job_id: str, attempt: int = 1) -> bool:
        job = self.job(job_id)
        return job is not None and job.attempt == attempt and job.state == JobState.DEPLOYING

    def run(self, job_id: str, attempt: int = 1) -> None:
        wait_for(lambda: self.deployed(job_id, attempt), 15, f"{job_id} attempt {attempt} to deploy")
        self.trainer.service.report(job_id, attempt, JobState.RUNNING, "all learners started", "monitor")

    def report_metric(self, job_id: str, record: dict, attempt: int = 1) -> None:
        key = f"{job_id}:{attempt}"
        self.seq[key] = self.seq.get(key, 0) + 1
        ts = datetime.datetime.now(datetime.UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
        self.metrics.write([LogLine(job_id, TEAM, 0, attempt, "metric", self.seq[key], ts, json.dumps(record))],
                           refresh=True)

    def storing(self, job_id: str, attempt: int = 1) -> None:
        self.trainer.service.report(job_id, attempt, JobState.STORING, "all learners exited 0", "monitor")

    def complete(self, job_id: str, attempt: int = 1) -> None:
        self.storing(job_id, attempt)
        self.trainer.service.report(job_id, attempt, JobState.COMPLETED, "all learners completed", "monitor",
                                    outputs_uri=f"store://jobs/{job_id}/outputs/")

    def fail(self, job_id: str, attempt: int = 1) -> None:
        self.trainer.service.report(job_id, attempt, JobState.FAILED, "learner 0 exited with 1", "monitor")


@pytest.fixture
def env(mongo_server, osmem_server, unique, tmp_path):
    e = Env(mongo_server, osmem_server, unique, tmp_path)
    yield e
    e.close()


def sweep(**extra) -> dict:
    """A 4-trial recipe; without prestart (the tests of prestarted trials ask for it)."""
    return {"kind": "experiment", "name": "sweep", "command": "python train.py --lr {{lr}}",
            "parameters": {"lr": [0.1, 0.2, 0.3, 0.4]}, "objective": {"metric": "loss", "goal": "minimize"},
            "prestart": 0, **extra}


def test_an_experiment_runs_its_trials_as_jobs_at_most_max_parallel_at_once_and_finds_the_best(env):
    exp = env.submit(sweep(max_parallel=2, mode="grid"))
    assert (exp.state, exp.trial_count, len(exp.trials)) == (RUNNING_EXP, 4, 4)
    assert exp.id.startswith("x-") and all(t.state == JobState.JOB_STATE_UNSPECIFIED for t in exp.trials)
    losses = {0: 0.9, 1: 0.3, 2: 0.5, 3: 0.7}
    busy_seen = []
    for index in range(4):
        job_id = f"{exp.id}-{index}"
        wait_for(lambda: env.job(job_id) is not None, 15, f"trial {index} to be submitted")  # noqa: B023
        trials = env.trainer.store.of_experiment(exp.id)
        busy_seen.append(sum(1 for j in trials if j.state in SLOT))
        job = env.job(job_id)
        manifest = job.spec()
        assert (job.experiment_id, job.trial) == (exp.id, index)
        assert manifest.rendered_command() == f"python train.py --lr {[0.1, 0.2, 0.3, 0.4][index]}"
        assert manifest.env["PARAM_LR"] == str([0.1, 0.2, 0.3, 0.4][index])
        env.run(job_id)
        env.report_metric(job_id, {"step": 1, "loss": losses[index] + 1})
        env.report_metric(job_id, {"step": 2, "loss": losses[index]})
        env.complete(job_id)
    assert max(busy_seen) <= 2
    done = wait_for(lambda: (x := env.get(exp.id)).state == ExperimentState.EXPERIMENT_COMPLETED and x, 15,
                    "the experiment to complete")
    assert done.best_trial == 1
    assert {t.index: round(t.objective, 6) for t in done.trials} == losses
    assert "4 of 4 trials completed" in done.reason and "best trial 1 (loss=0.3)" in done.reason
    # only ever one job per trial
    assert len(env.trainer.store.of_experiment(exp.id)) == 4
    listed = env.stub.ListExperiments(trainer_pb2.ListExperimentsRequest(team=TEAM)).experiments
    assert [e.id for e in listed] == [exp.id] and not listed[0].trials


def test_a_trial_storing_its_outputs_gives_its_slot_to_the_next_trial_and_each_trial_runs_once(env):
    exp = env.submit(sweep(max_parallel=2, mode="grid"))
    ids = [f"{exp.id}-{i}" for i in range(4)]
    env.run(ids[0])
    env.run(ids[1])
    env.storing(ids[0])  # its learners exited; its outputs are still uploading
    wait_for(lambda: env.job(ids[2]) is not None, 15, "the third trial while the first is storing")
    trials = env.trainer.store.of_experiment(exp.id)
    assert env.job(ids[0]).state == JobState.STORING and env.job(ids[3]) is None
    assert sum(1 for j in trials if j.state in SLOT) == 2  # trial 1 running, trial 2 submitted
    env.storing(ids[1])
    wait_for(lambda: env.job(ids[3]) is not None, 15, "the fourth trial while the second is storing")
    for index, job_id in enumerate(ids):
        if index >= 2:
            env.run(job_id)
        env.report_metric(job_id, {"step": 1, "loss": 1.0 - index / 10})
        if index >= 2:
            env.storing(job_id)
        env.trainer.service.report(job_id, 1, JobState.COMPLETED, "all learners completed", "monitor",
                                   outputs_uri=f"store://jobs/{job_id}/outputs/")
    done = wait_for(lambda: (x := env.get(exp.id)).state == ExperimentState.EXPERIMENT_COMPLETED and x, 15,
                    "the experiment to complete")
    assert "4 of 4 trials completed" in done.reason and done.best_trial == 3
    assert sorted(j.id for j in env.trainer.store.of_experiment(exp.id)) == sorted(ids)
    assert set(env.lcm.deploys) == {(i, 1) for i in ids}


def test_another_team_sees_no_experiment_and_bad_recipes_name_their_fields(env):
    exp = env.submit(sweep(mode="grid"))
    with pytest.raises(grpc.RpcError) as e:
        env.stub.GetExperiment(trainer_pb2.GetExperimentRequest(team="other", experiment_id=exp.id))
    assert e.value.code() == grpc.StatusCode.NOT_FOUND
    with pytest.raises(grpc.RpcError) as e:
        env.submit(sweep(max_parallel=0, objective={"metric": "loss", "goal": "up"}))
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "max_parallel" in e.value.details() and "objective.goal" in e.value.details()


def test_a_trainer_restart_mid_sweep_loses_no_trial_and_starts_none_twice(env):
    exp = env.submit(sweep(max_parallel=2, mode="grid"))
    wait_for(lambda: len(env.trainer.store.of_experiment(exp.id)) == 2, 15, "two trials submitted")
    first = f"{exp.id}-0"
    env.run(first)
    env.report_metric(first, {"step": 1, "loss": 0.25})
    env.stop()
    # while it is down, the running trial finishes (its monitor keeps reporting once the Trainer is back)
    env.start()
    env.complete(first)
    wait_for(lambda: len(env.trainer.store.of_experiment(exp.id)) == 3, 15, "the third trial after the restart")
    # a driver pass run again on a stale record (as after a crash between submit and anything else)
    stale = env.trainer.experiments.find(exp.id)
    threads = [threading.Thread(target=env.trainer.driver.advance, args=(stale,)) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for index in range(1, 4):
        job_id = f"{exp.id}-{index}"
        wait_for(lambda: env.job(job_id) is not None, 15, f"trial {index}")  # noqa: B023
        env.run(job_id)
        env.report_metric(job_id, {"step": 1, "loss": 0.5 + index})
        env.complete(job_id)
    done = wait_for(lambda: (x := env.get(exp.id)).state == ExperimentState.EXPERIMENT_COMPLETED and x, 15,
                    "the experiment to complete")
    ids = [j.id for j in env.trainer.store.of_experiment(exp.id)]
    assert sorted(ids) == sorted(f"{exp.id}-{i}" for i in range(4))
    # each trial ran as one attempt (a restart resends a DEPLOYING job's deploy: the LCM is idempotent per attempt)
    assert set(env.lcm.deploys) == {(i, 1) for i in ids}
    assert done.best_trial == 0


def test_asha_halts_the_trials_it_stops_and_resumes_the_one_it_promotes(env):
    recipe = sweep(max_parallel=3, mode="grid", parameters={"lr": [0.1, 0.2, 0.3]},
                   early_stopping={"asha": {"resource": "step", "min_resource": 1, "reduction_factor": 3,
                                            "max_resource": 9}})
    exp = env.submit(recipe)
    ids = [f"{exp.id}-{i}" for i in range(3)]
    for job_id in ids:
        env.run(job_id)
    # each trial reaches rung 0 (step 1) in turn: 0.9, 0.2, 0.5
    for job_id, loss in zip(ids, [0.9, 0.2, 0.5], strict=True):
        env.report_metric(job_id, {"step": 1, "loss": loss})
        wait_for(lambda: env.job(job_id).state == JobState.HALTING, 15, f"{job_id} to be stopped")  # noqa: B023
        env.trainer.service.report(job_id, 1, JobState.HALTED, "all learners halted at step 1", "monitor",
                                   checkpoint_step=1)
    # with three results at rung 0 the best (trial 1) is promoted: resumed as attempt 2 from its checkpoint
    wait_for(lambda: env.job(ids[1]).attempt == 2, 15, "trial 1 to be promoted")
    got = env.get(exp.id)
    assert [t.stopped_at_rung if t.HasField("stopped_at_rung") else None for t in got.trials] == [0, None, 0]
    assert dict(got.trials[1].rungs) == {0: pytest.approx(0.2)}
    env.run(ids[1], attempt=2)
    env.report_metric(ids[1], {"step": 2, "loss": 0.1}, attempt=2)
    env.complete(ids[1], attempt=2)
    done = wait_for(lambda: (x := env.get(exp.id)).state == ExperimentState.EXPERIMENT_COMPLETED and x, 15,
                    "the experiment to complete")
    assert done.best_trial == 1 and "2 stopped early" in done.reason
    assert [JobState(t.state) for t in done.trials] == [JobState.HALTED, JobState.COMPLETED, JobState.HALTED]


def test_halt_resume_and_cancel_reach_the_trials(env):
    env.trainer.service.set_quota(TEAM, Quota(jobs=1), "admin")  # so the second trial waits in the queue
    exp = env.submit(sweep(max_parallel=2, mode="grid"))
    ids = [f"{exp.id}-{i}" for i in range(4)]
    env.run(ids[0])
    wait_for(lambda: env.job(ids[1]) is not None and env.job(ids[1]).state == JobState.QUEUED, 15,
             "the second trial to wait in the queue")
    halted = env.stub.HaltExperiment(trainer_pb2.ExperimentAction(team=TEAM, experiment_id=exp.id, actor="user:k1"))
    assert halted.state == ExperimentState.EXPERIMENT_HALTED
    wait_for(lambda: env.job(ids[0]).state == JobState.HALTING, 15, "the running trial to halt")
    env.trainer.service.report(ids[0], 1, JobState.HALTED, "halted at step 3", "monitor", checkpoint_step=3)
    # the queued trial was cancelled and will be submitted again under a new generation
    wait_for(lambda: env.job(ids[1]).state == JobState.CANCELLED, 15, "the queued trial to be cancelled")
    resumed = env.stub.ResumeExperiment(trainer_pb2.ExperimentAction(team=TEAM, experiment_id=exp.id,
                                                                     actor="user:k1"))
    assert resumed.state == RUNNING_EXP
    wait_for(lambda: env.job(ids[0]).attempt == 2, 15, "the halted trial to resume")
    wait_for(lambda: env.job(f"{ids[1]}-1") is not None, 15, "the cancelled trial to be submitted again")
    cancelled = env.stub.CancelExperiment(trainer_pb2.ExperimentAction(team=TEAM, experiment_id=exp.id,
                                                                       actor="user:k1"))
    assert cancelled.state == ExperimentState.EXPERIMENT_CANCELLED
    wait_for(lambda: all(j.state == JobState.CANCELLED for j in env.trainer.store.of_experiment(exp.id)), 15,
             "every trial to be cancelled")
    with pytest.raises(grpc.RpcError) as e:
        env.stub.ResumeExperiment(trainer_pb2.ExperimentAction(team=TEAM, experiment_id=exp.id))
    assert e.value.code() == grpc.StatusCode.FAILED_PRECONDITION or e.value.code() == grpc.StatusCode.ABORTED


# -- prestarted trials (docs/EXPERIMENTS.md, "Prestarted trials") ---------------------------------------------


def slots_and_held(env: Env, exp_id: str) -> tuple[int, int]:
    trials = env.trainer.store.of_experiment(exp_id)
    return sum(1 for j in trials if holds_slot(j)), sum(1 for j in trials if behind_gate(j))


def test_a_prestarted_trial_deploys_gated_holds_no_slot_and_its_gate_opens_when_a_slot_frees(env):
    exp = env.submit(sweep(max_parallel=2, mode="grid", prestart=1))
    ids = [f"{exp.id}-{i}" for i in range(4)]
    wait_for(lambda: env.deployed(ids[2]), 15, "the third trial to deploy ahead of a slot")
    held = env.job(ids[2])
    assert (held.gate, env.job(ids[0]).gate, env.job(ids[1]).gate) == ("closed", "", "")
    wait_for(lambda: (ids[2], 1) in env.lcm.gated, 15, "the third trial's gated deploy")
    assert (ids[0], 1) not in env.lcm.gated and env.job(ids[3]) is None  # one held trial, no more
    assert slots_and_held(env, exp.id) == (2, 1)
    env.run(ids[0])
    env.run(ids[1])
    assert env.lcm.gates == []  # no slot is free: the held trial waits
    env.storing(ids[0])  # its learner exited: its slot goes to the held trial, whose gate opens at once
    wait_for(lambda: (ids[2], 1) in env.lcm.gates, 15, "the held trial's gate to open")
    assert env.job(ids[2]).gate == "open"
    wait_for(lambda: env.job(ids[3]) is not None and env.job(ids[3]).gate == "closed", 15,
             "the fourth trial to be prestarted in its place")
    assert slots_and_held(env, exp.id) == (2, 1)
    for index, job_id in enumerate(ids):
        if index >= 2:
            env.run(job_id)
        env.report_metric(job_id, {"step": 1, "loss": 1.0 - index / 10})
        env.complete(job_id)
        got = slots_and_held(env, exp.id)
        assert got[0] <= 2 and got[1] <= 1, got
    done = wait_for(lambda: (x := env.get(exp.id)).state == ExperimentState.EXPERIMENT_COMPLETED and x, 15,
                    "the experiment to complete")
    assert "4 of 4 trials completed" in done.reason and done.best_trial == 3
    assert set(env.lcm.deploys) == {(i, 1) for i in ids}
    assert {g for g, _ in env.lcm.gates} <= {ids[2], ids[3]}


def test_a_freed_slot_goes_to_the_held_trial_in_the_report_that_freed_it(env):
    """The hand-over (ExperimentDriver.hand_over): the held trial's gate is open once the predecessor's STORING
    report returns, not a driver pass later; a report that frees no slot opens nothing."""
    # without an objective no pass reads metrics, so none holds the decision for long (one that does, the
    # hand-over leaves the decision to: the unit tests)
    exp = env.submit(sweep(max_parallel=1, mode="grid", prestart=1, objective=None))
    ids = [f"{exp.id}-{i}" for i in range(4)]
    wait_for(lambda: env.deployed(ids[1]) and (ids[1], 1) in env.lcm.gated, 15, "trial 1 deployed gated")
    env.run(ids[0])
    assert env.job(ids[1]).gate == "closed" and slots_and_held(env, exp.id) == (1, 1)  # RUNNING frees no slot
    env.storing(ids[0])
    assert env.job(ids[1]).gate == "open"  # written in the STORING report's transition
    wait_for(lambda: (ids[1], 1) in env.lcm.gates, 15, "the LCM to hear of the opened gate")
    wait_for(lambda: env.job(ids[2]) is not None and env.job(ids[2]).gate == "closed", 15, "trial 2 prestarted")
    for index in (1, 2, 3):
        env.run(ids[index])
        env.complete(ids[index - 1])
        assert slots_and_held(env, exp.id)[0] <= 1
        env.storing(ids[index])
        if index < 3:
            assert env.job(ids[index + 1]).gate == "open"
        if index + 2 < 4:
            wait_for(lambda: env.job(ids[index + 2]) is not None, 15, f"trial {index + 2} prestarted")  # noqa: B023
    env.complete(ids[3])
    wait_for(lambda: env.get(exp.id).state == ExperimentState.EXPERIMENT_COMPLETED, 15, "the experiment to complete")
    # a gate opened while its trial still queued is deployed open instead: the LCM hears of no gate for it
    assert {g for g, _ in env.lcm.gates} <= set(ids[1:]) and all(a == 1 for _, a in env.lcm.deploys)


def test_an_opened_gate_reaches_the_lcm_after_a_trainer_restart(env):
    """The gate's opening is written first; a Trainer that stopped before the LCM heard of it tells it on restart."""
    exp = env.submit(sweep(max_parallel=1, mode="grid", prestart=1))
    ids = [f"{exp.id}-{i}" for i in range(4)]
    wait_for(lambda: env.deployed(ids[1]) and (ids[1], 1) in env.lcm.gated, 15, "trial 1 deployed gated")
    env.lcm.gate_error = True  # the LCM is away: OpenGate is retried
    env.run(ids[0])
    env.storing(ids[0])
    wait_for(lambda: env.job(ids[1]).gate == "open" and env.lcm.gate_tries > 0, 15, "the gate opened in the store")
    env.stop()
    env.lcm.gate_error = False
    assert env.lcm.gates == []
    env.start()  # its reconcile resends the DEPLOYING trial's deploy, which opens the gate again
    wait_for(lambda: (ids[1], 1) in env.lcm.gates, 15, "the gate to reach the LCM after the restart")
    wait_for(lambda: env.job(ids[2]) is not None and env.job(ids[2]).gate == "closed", 15, "trial 2 prestarted")
    assert slots_and_held(env, exp.id) == (1, 1)  # trial 0 storing, trial 1 in the slot, trial 2 held
    env.complete(ids[0])
    for job_id in ids[1:]:
        wait_for(lambda: env.job(job_id) is not None and env.job(job_id).gate == "open", 15,  # noqa: B023
                 f"{job_id}'s gate to open")
        env.run(job_id)
        env.complete(job_id)
    wait_for(lambda: env.get(exp.id).state == ExperimentState.EXPERIMENT_COMPLETED, 15, "the experiment to complete")
    assert sorted(j.id for j in env.trainer.store.of_experiment(exp.id)) == sorted(ids)
    assert all(a == 1 for _, a in env.lcm.deploys)  # nothing deployed twice as another attempt


def test_halting_an_experiment_cancels_its_held_trial_and_resume_prestarts_it_again(env):
    exp = env.submit(sweep(max_parallel=1, mode="grid", prestart=1))
    ids = [f"{exp.id}-{i}" for i in range(4)]
    wait_for(lambda: env.deployed(ids[1]), 15, "trial 1 deployed, held")
    env.run(ids[0])
    env.stub.HaltExperiment(trainer_pb2.ExperimentAction(team=TEAM, experiment_id=exp.id, actor="user:k1"))
    wait_for(lambda: env.job(ids[1]).state == JobState.CANCELLED, 15, "the held trial to be cancelled")
    wait_for(lambda: env.job(ids[0]).state == JobState.HALTING, 15, "the running trial to halt")
    env.trainer.service.report(ids[0], 1, JobState.HALTED, "halted at step 3", "monitor", checkpoint_step=3)
    wait_for(lambda: env.get(exp.id).state == ExperimentState.EXPERIMENT_HALTED, 15, "the experiment halted")
    env.stub.ResumeExperiment(trainer_pb2.ExperimentAction(team=TEAM, experiment_id=exp.id, actor="user:k1"))
    wait_for(lambda: env.job(ids[0]).attempt == 2, 15, "the halted trial to resume")
    # the cancelled held trial comes back under a new generation, prestarted again behind the resumed one
    wait_for(lambda: env.job(f"{ids[1]}-1") is not None, 15, "trial 1 submitted again")
    assert env.job(f"{ids[1]}-1").gate == "closed"
    env.stub.CancelExperiment(trainer_pb2.ExperimentAction(team=TEAM, experiment_id=exp.id, actor="user:k1"))
    wait_for(lambda: all(j.state == JobState.CANCELLED for j in env.trainer.store.of_experiment(exp.id)), 15,
             "every trial, the held one too, to be cancelled")
    assert not any(g == f"{ids[1]}-1" for g, _ in env.lcm.gates)  # its learner was never let start
