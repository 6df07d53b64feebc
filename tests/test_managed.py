"""backend.managed=true: the managed job's task, its cost before launch, the budget, and `summrl.sweep`.

SkyPilot builds and validates every task offline against the fixture RunPod catalog (tests/fixtures/sky_catalog,
whose H100 spot price differs from its on-demand one, so a test sees which is used). Only SkyPilot's network calls
(sky.jobs.launch, queue_v2, cancel and their request stream) are replaced, by a recorder; S3 is the loopback endpoint.
"""

from __future__ import annotations

import json
import logging
import os
import shlex
import subprocess
import sys
from types import SimpleNamespace

import pytest

from tests import test_cloud  # first: it points SkyPilot at the fixture catalog before anything imports sky
from tests.conftest import ROOT, s3, said
from tests.test_cloud import PLANTED, SKY_RUNTIME, cloud_env, default_config  # noqa: F401  (cloud_env: a fixture)

import sky  # noqa: E402

from summrl.cloud import launch, pricing  # noqa: E402
from summrl.cloud import sweep as sweep_cli  # noqa: E402
from summrl.cloud.launch import PreflightError, build_task, run_on_cluster  # noqa: E402
from summrl import cost  # noqa: E402
from summrl.cost import token_price  # noqa: E402
from summrl.job import RunRecord  # noqa: E402
from summrl.prompt import SummaryPrompt  # noqa: E402

MANAGED = ["backend.managed=true", "storage.bucket=runs"]


class FakeJobs:
    """Records SkyPilot's managed-job calls; submitted jobs get ids 41, 42, ..."""

    def __init__(self, monkeypatch):
        self.calls, self.records = [], {}
        monkeypatch.setattr(sky.jobs, "launch", self.launch)
        monkeypatch.setattr(sky.jobs, "queue_v2", lambda refresh, job_ids=None, **kw: ("queue", refresh, job_ids))
        monkeypatch.setattr(sky.jobs, "cancel", lambda job_ids=None, **kw: ("cancel", job_ids))
        monkeypatch.setattr(sky.jobs, "tail_logs", lambda **kw: self.calls.append(("jobs.tail_logs", kw)) or 0)
        monkeypatch.setattr(sky, "stream_and_get", self.answer)
        monkeypatch.setattr(sky, "get", self.answer)
        for name in ("launch", "tail_logs", "down"):  # the cluster path must not be taken
            monkeypatch.setattr(sky, name, lambda *a, _n=name, **k: self.calls.append((_n,)))
        # its jobs run on this machine: S3 on its loopback (moto, s3_endpoint) reaches them
        monkeypatch.setattr(launch, "on_this_machine_only", lambda host: False)

    def launch(self, task, name=None, **kwargs):
        self.calls.append(("jobs.launch", task, name))
        return ("launch", 41 + len([c for c in self.calls if c[0] == "jobs.launch"]) - 1)

    def answer(self, request):
        kind = request[0]
        self.calls.append((f"get {kind}", request))
        if kind == "launch":
            return [request[1]], None
        if kind == "queue":
            return [self.records[i] for i in request[2] if i in self.records], len(request[2]), {}, len(request[2])
        return None

    def launched(self):
        return [c for c in self.calls if c[0] == "jobs.launch"]


def managed_config(*overrides, **env):
    return default_config(*MANAGED, *overrides)


# --------------------------------------------------------------------------- the task


def test_managed_spot_task_with_fallback_and_recovery_validates_offline(cloud_env):
    config = managed_config("backend.use_spot=true", "backend.spot_fallback=true",
                            "backend.job_recovery.strategy=FAILOVER", "backend.job_recovery.max_restarts_on_errors=3",
                            "backend.job_recovery.recover_on_exit_codes=[33]")
    task = build_task(config, [], "summrl-job")
    task.validate()
    resources = sorted(task.resources, key=lambda r: r.use_spot)
    assert [(str(r.cloud), r.accelerators, r.use_spot) for r in resources] == [
        ("RunPod", {"H100": 1}, False), ("RunPod", {"H100": 1}, True)]
    for r in resources:
        assert r.job_recovery == {"strategy": "FAILOVER", "max_restarts_on_errors": 3, "recover_on_exit_codes": [33]}
    spec = task.to_yaml_config(use_user_specified_yaml=True)["resources"]
    # any_of: SkyPilot takes the cheapest, spot, and the same machine on demand when there is no spot capacity.
    assert sorted(c["use_spot"] for c in spec["any_of"]) == [False, True]
    # The remote job is the same command: it resumes from S3 by its run name (no backend.managed there).
    assert "run.name=summary-rl backend=local_gpu" in task.run and "managed" not in task.run


def test_candidates_become_ordered_or_any_of_and_unoffered_ones_are_named(cloud_env, monkeypatch):
    candidates = ('backend.candidates=[{infra: runpod, accelerators: "H100-SXM:1"}, '
                  '{infra: runpod, accelerators: "A100-80GB:1", use_spot: true}]')
    for failover, key in (("ordered", "ordered"), ("cheapest", "any_of")):
        config = managed_config(candidates, f"backend.failover={failover}")
        task = build_task(config, [], "summrl-job")
        task.validate()
        spec = task.to_yaml_config(use_user_specified_yaml=True)["resources"][key]
        machines = [(c["accelerators"], c["use_spot"]) for c in spec]
        if key == "any_of":  # a set: SkyPilot's optimizer picks the cheapest
            machines = sorted(machines, key=str, reverse=True)
        assert machines == [({"H100-SXM": 1}, False), ({"A100-80GB": 1}, True)]
        assert all(c["job_recovery"]["strategy"] == "EAGER_NEXT_REGION" for c in spec)
    assert isinstance(task.resources, set) and len(task.resources) == 2
    fake = FakeJobs(monkeypatch)
    with pytest.raises(PreflightError, match=r"backend.candidates: H200:1 is not offered on runpod"):
        run_on_cluster(managed_config('backend.candidates=[{infra: runpod, accelerators: "H200:1"}]',
                                      "backend.dry_run=true"), [], None)
    assert not fake.launched()


def test_a_gpu_with_no_spot_offer_launches_on_demand_when_spot_fallback_is_on(cloud_env, monkeypatch, caplog):
    """The fixture catalog's L40S has an on-demand price and no spot one (as some RunPod GPUs do)."""
    fake = FakeJobs(monkeypatch)
    l40s = ("backend.accelerators=L40S:1", "backend.use_spot=true", "backend.dry_run=true")
    with pytest.raises(PreflightError, match=r"backend.accelerators=L40S:1 is not offered on runpod"):
        run_on_cluster(managed_config(*l40s), [], None)
    with caplog.at_level(logging.INFO, logger="summrl"):
        run_on_cluster(managed_config(*l40s, "backend.spot_fallback=true"), [], None)
    assert "runpod has no spot L40S:1 (SkyPilot's catalog): backend.spot_fallback=true launches it on demand" \
        in caplog.text
    assert "$0.86/h" in caplog.text  # priced as the machine it will get, not as unknown
    assert not fake.launched()  # a dry run



def test_managed_without_storage_and_spot_without_managed_are_refused_in_one_line():
    from summrl.errors import ConfigError

    with pytest.raises(ConfigError, match=r"^backend.managed: .* set storage.enabled=true"):
        default_config("backend.managed=true", "storage.enabled=false")
    with pytest.raises(ConfigError, match=r"^backend.use_spot: .* add backend.managed=true"):
        default_config("backend.use_spot=true")
    with pytest.raises(ConfigError, match=r"^backend.job_recovery.recover_on_exit_codes: lists an exit code twice"):
        default_config(*MANAGED, "backend.job_recovery.recover_on_exit_codes=[137,137]")
    # every recovery would start again from step 0, paying again for the steps S3 holds (found by an audit)
    with pytest.raises(ConfigError, match=r"^storage.restore: false would start every recovery of this managed job "
                                          r"again from step 0"):
        default_config(*MANAGED, "storage.restore=false")
    # SkyPilot refused the name at launch with a bare ValueError
    with pytest.raises(ConfigError, match=r"^run.name: 'my run' can't be part of a managed job's name \('summrl-my run'"):
        default_config(*MANAGED, "run.name='my run'")
    default_config(*MANAGED, "run.name=summary-rl_v2.1")


# --------------------------------------------------------------------------- the cost before launch


def test_estimate_is_catalog_price_times_hours_plus_judge_calls(cloud_env):
    config = managed_config("backend.use_spot=true", "trainer.max_steps=10", "trainer.eval_every=5",
                            "backend.setup_minutes=30")
    e = pricing.estimate_run(config)
    assert e.price.source == "SkyPilot's catalog" and e.price.usd_per_hour == 1.25  # the fixture's spot price
    assert e.hours == pytest.approx((30 + 10 * 5.6) / 60)  # qwen2_5_3b declares 5.6 min a step
    assert e.gpu_usd == pytest.approx(1.25 * (30 + 56) / 60)
    # QA: one answering call per summary and one grading call per document, every train step and val pass
    # (steps 0, 5 and 10 here), plus one full-document answering call (percent_full) the first time each document
    # is scored; priced by litellm's cost map for the judge's model.
    t = config.trainer
    train, val = 10 * t.groups_per_step, 91
    assert e.judge.calls == train * (t.rollouts_per_group + 1) + train + 3 * val * (t.val_rollouts_per_doc + 1) + val
    assert e.judge_parts == [f"train {train * (t.rollouts_per_group + 2):,} (qa)",
                             f"val {3 * val * (t.val_rollouts_per_doc + 1) + val:,} (qa, 3 passes)"]
    assert e.judge_usd == pytest.approx(token_price("gemini/gemini-2.5-flash", e.judge.input_tokens,
                                                    e.judge.output_tokens))
    assert e.total_usd == pytest.approx(e.gpu_usd + e.judge_usd)
    on_demand = pricing.estimate_run(managed_config("trainer.max_steps=10", "trainer.eval_every=5",
                                                    "backend.setup_minutes=30"))
    assert on_demand.price.usd_per_hour == 2.39
    ruler = pricing.estimate_run(managed_config("reward=ruler", "trainer.max_steps=10", "trainer.eval_every=5"))
    # RULER: one ranking call per train group; val ranks each document's summaries and grades their QA too.
    assert ruler.judge.calls == train + 3 * val * (t.val_rollouts_per_doc + 1 + 1) + val
    text = pricing.describe(e, config)
    assert text.startswith(f"summrl: estimated cost of run summary-rl: ${e.total_usd:,.2f} = GPU ${e.gpu_usd:,.2f} + "
                           f"judge ${e.judge_usd:,.2f}\n")
    assert "H100:1 on runpod (spot) at $1.25/h from SkyPilot's catalog" in text and "10 steps x 5.6 min" in text


def estimate(*overrides):
    return pricing.estimate_run(managed_config("trainer.max_steps=10", "trainer.eval_every=5", *overrides))


def test_every_reward_is_priced_by_the_judge_calls_it_makes(cloud_env):
    """rubric, qa_rubric, weighted (each term) and length_penalized: the calls each makes per group and per document,
    summed over the run; a reward that calls no judge costs $0 and says so."""
    t = managed_config().trainer
    train, val, passes = 10 * t.groups_per_step, 91, 3
    qa, rubric = estimate(), estimate("reward=rubric")
    # rubric: one scoring call per group (every rubric, every summary) and one writing call per document; val adds
    # QA's metrics (answering, grading, the baseline).
    assert rubric.judge.calls == (train + train) + passes * val * (1 + t.val_rollouts_per_doc + 1) + val * (1 + 1)
    # Its tokens, on the sample's documents: 10 more steps (val unchanged: passes at 0 and the end) add 100 groups,
    # each scored in one call reading up to 2 x max_rubrics rubrics and the group's summaries, and 100 documents
    # whose rubrics are written from the document.
    sized = pricing.sized_documents(SummaryPrompt.of(t))
    r, s, n = 2 * 8, t.max_summary_tokens, t.rollouts_per_group
    score_in = cost.RUBRIC_SCORE_PROMPT + r * cost.RUBRIC_TOKENS + n * (s + 10)
    score_out = n * (cost.RUBRIC_SCORE_TOKENS * r + 2) + 10
    write_in = sum(d.text for d in sized) / len(sized) + cost.RUBRIC_WRITE_PROMPT
    write_out = 2 * 8 * cost.RUBRIC_TOKENS + 20
    short, long = (pricing.estimate_run(managed_config("reward=rubric", f"trainer.max_steps={steps}",
                                                      "trainer.eval_every=100")).judge for steps in (10, 20))
    assert long.calls - short.calls == train + train
    assert long.input_tokens - short.input_tokens == pytest.approx(train * (score_in + write_in), abs=2)
    assert long.output_tokens - short.output_tokens == pytest.approx(train * (score_out + write_out), abs=2)
    assert rubric.judge_usd == pytest.approx(token_price("gemini/gemini-2.5-flash", rubric.judge.input_tokens,
                                                         rubric.judge.output_tokens))
    assert any("upper bound" in note for note in rubric.notes)

    # qa_rubric (qa + 0.2 x rubric) trains on both terms' calls; its val is QA's and the rubric's, as rubric's is.
    both = estimate("reward=qa_rubric")
    train_calls = [int(p.split()[1].replace(",", "")) for p in (qa.judge_parts[0], rubric.judge_parts[0])]
    assert both.judge_parts[0] == f"train {sum(train_calls):,} (qa + rubric)"
    assert both.judge.calls == sum(train_calls) + int(rubric.judge_parts[1].split()[1].replace(",", ""))

    # length_penalized = qa + a length term, which calls no judge: QA's calls and $ exactly.
    penalized = estimate("reward=length_penalized")
    assert (penalized.judge.calls, penalized.judge.input_tokens, penalized.judge.output_tokens) == \
        (qa.judge.calls, qa.judge.input_tokens, qa.judge.output_tokens)
    assert penalized.judge_usd == qa.judge_usd
    # weighted with a RULER term and a weight-0 QA term: every term scores every group.
    weighted = estimate("reward=weighted", "+reward.terms.ruler.kind=ruler", "+reward.terms.ruler.weight=1",
                        "reward.terms.qa.weight=0")
    assert weighted.judge.calls == qa.judge.calls + train + passes * val  # + one RULER call per group

    # A train reward that calls no judge: $0 for training, said so; val's QA metrics are still paid for.
    length = estimate("reward=weighted", "~reward.terms.qa", "+reward.terms.length.kind=length",
                      "+reward.terms.length.weight=1")
    assert length.judge_parts == ["train 0 (length calls no judge: $0)",
                                  f"val {passes * val * (t.val_rollouts_per_doc + 1) + val:,} "
                                  f"(length + qa metrics, {passes} passes)"]
    assert "train 0 (length calls no judge: $0)" in pricing.describe(length, managed_config())


def test_what_cant_be_known_is_unknown_never_zero(cloud_env):
    config = managed_config("dataset.train_size=0.8", "dataset.val_size=0.1")  # 3500 + 0.1 of 3591 is refused
    fraction = pricing.estimate_run(config)
    assert fraction.judge_usd is None and fraction.total_usd is None and fraction.judge.calls > 0
    text = pricing.describe(fraction, config)
    assert text.startswith("summrl: estimated cost of run summary-rl: unknown = GPU $")
    assert "judge $ unknown: dataset.val_size=0.1: the val documents are counted only once they load" in text
    assert "val unknown (qa, 41 passes)" in text
    # an SFT stage's val pass after it (before SFT, after it, then the GRPO steps'): it was left out
    with_sft = pricing.describe(pricing.estimate_run(managed_config("dataset.train_size=0.8", "dataset.val_size=0.1",
                                                                    "sft=best_of_n")), config)
    assert "val unknown (qa, 42 passes)" in with_sft
    assert "can't be estimated" in pricing.budget_problem([fraction], 100)
    # A judge model litellm can't price.
    config = managed_config("judge=openai_compatible")
    unpriced = pricing.estimate_run(config)
    assert unpriced.judge_usd is None and unpriced.total_usd is None
    assert "is not in litellm's cost map" in pricing.describe(unpriced, config)
    # sft: its scoring calls are the reward's; distill's teacher is priced too, unknown when it can't be counted.
    best = estimate("sft=best_of_n", "sft.max_docs=20")
    assert best.judge_parts[1] == f"sft {20 * (best_of_n_samples() + 1):,} (qa)"
    assert any("the SFT stage's GPU time is not in the hours" in note for note in best.notes)
    own = estimate("dataset=documents", "dataset.path=tests", "dataset.questions.confirm=false")
    assert own.judge_usd is None  # dataset=documents splits by fraction by default: counted once they load
    assert any("sized on Repliqa's documents" in note and "dataset.questions.max_cost_usd" in note
               for note in own.notes)
    distill = estimate("sft=distill", "sft.confirm=false", "sft.teacher.model=gemini/gemini-2.5-pro", "sft.max_docs=20")
    assert distill.teacher.calls == 20 * distill_config().sft.samples_per_doc
    assert distill.teacher_usd == pytest.approx(token_price("gemini/gemini-2.5-pro", distill.teacher.input_tokens,
                                                            distill.teacher.output_tokens))
    assert distill.total_usd == pytest.approx(distill.gpu_usd + distill.judge_usd + distill.teacher_usd)
    assert distill.teacher_usd > 0
    everything = estimate("sft=distill", "sft.confirm=false", "sft.teacher.model=gemini/gemini-2.5-pro",
                          "dataset.train_size=0.9")
    assert everything.teacher_usd is None and everything.total_usd is None


def best_of_n_samples():
    return managed_config("sft=best_of_n").sft.samples_per_doc


def distill_config():
    return managed_config("sft=distill", "sft.confirm=false", "sft.teacher.model=gemini/gemini-2.5-pro")


def test_without_the_catalog_the_dated_snapshot_prices_the_gpu(cloud_env):
    # Lambda's catalog is not in the fixture and can't be downloaded here: SkyPilot raises a network error.
    price = pricing.hourly_price("lambda", "H100:1", False)
    snapshot = json.loads((ROOT / "summrl" / "cloud" / "prices.json").read_text())
    assert price.source == f"the price snapshot of {snapshot['date']}"
    assert price.usd_per_hour == next(r["on_demand"] for r in snapshot["usd_per_hour"]
                                      if (r["cloud"], r["accelerator"], r["count"]) == ("lambda", "H100", 1))
    # A candidate on any infra is priced at the snapshot's cheapest offer of that GPU.
    assert pricing.hourly_price(None, "A100-80GB:1", False).usd_per_hour == 1.39


def test_over_budget_is_refused_by_the_preflight_with_the_figures_and_nothing_is_launched(cloud_env, monkeypatch):
    fake = FakeJobs(monkeypatch)
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")  # a second problem: both are listed together
    with pytest.raises(PreflightError) as e:
        run_on_cluster(managed_config("backend.max_cost_usd=5"), [], None)
    message = str(e.value)
    estimate = pricing.estimate_run(managed_config())
    assert (f"backend.max_cost_usd=5: the estimated cost of this run is ${estimate.total_usd:,.2f} (GPU "
            f"${estimate.gpu_usd:,.2f} + judge ${estimate.judge_usd:,.2f}), over the budget of $5.00") in message
    assert "AWS_SECRET_ACCESS_KEY" in message
    assert fake.launched() == [] and fake.calls == []
    # In a dry run too, beside the task.
    with pytest.raises(PreflightError, match="backend.max_cost_usd=5: the estimated cost"):
        run_on_cluster(managed_config("backend.max_cost_usd=5", "backend.dry_run=true"), [], None)


# --------------------------------------------------------------------------- submitting, and summrl.sweep


def submit_sweep(tmp_path, fake, seeds=(1, 2, 3)):
    """What `-m backend.managed=true seed=1,2,3` leaves: one job folder per job with its submission record."""
    folder = tmp_path / "multirun" / "2026-11-23" / "10-00-00"
    for num, seed in enumerate(seeds):
        config = managed_config(f"seed={seed}", f"storage.endpoint_url={fake.endpoint}")
        config.run.name, config.run.dir = f"abl-{num}", str(folder / str(num))
        record = RunRecord(config.run.dir)
        record.job.overrides, record.job.sweep, record.job.num = [f"seed={seed}"], "2026-11-23_10-00-00", num
        run_on_cluster(config, [f"seed={seed}"], num, record)
    return folder


def test_a_sweep_rerun_in_its_folder_submits_again_only_the_jobs_that_ended(cloud_env, monkeypatch, tmp_path,
                                                                              s3_endpoint):
    """The same managed sweep command rerun with its hydra.sweep.dir submitted every job a second time (six billed
    jobs, two per run, backing up to one S3 folder), and each job folder's record kept only the new id, so summrl.sweep
    could no longer see or cancel the first three."""
    from sky.jobs.state import ManagedJobStatus
    from sky.schemas.api.responses import ManagedJobRecord

    from summrl.errors import ConfigError

    fake = FakeJobs(monkeypatch)
    fake.endpoint = s3_endpoint
    s3(s3_endpoint).create_bucket(Bucket="runs")
    folder = submit_sweep(tmp_path, fake)
    fake.records = {41: ManagedJobRecord(job_id=41, status=ManagedJobStatus.RUNNING, recovery_count=0, job_duration=9.0),
                    42: ManagedJobRecord(job_id=42, status=ManagedJobStatus.FAILED, recovery_count=0, job_duration=9.0)}
    with pytest.raises(ConfigError, match=r"run abl-0: managed job 41 \(summrl-abl-0\), submitted from .*, is RUNNING: "
                                          r"submitting it again would start a second billed job"):
        submit_sweep(tmp_path, fake, seeds=(1,))
    assert len(fake.launched()) == 3
    assert json.loads((folder / "0" / "result.json").read_text())["managed_job"]["id"] == 41  # its record kept

    for num, seed in ((1, 2), (2, 3)):  # 42 failed, and 43 is no longer in SkyPilot's queue: both ended
        config = managed_config(f"seed={seed}", f"storage.endpoint_url={fake.endpoint}")
        config.run.name, config.run.dir = f"abl-{num}", str(folder / str(num))
        record = RunRecord(config.run.dir)
        record.job.overrides, record.job.sweep, record.job.num = [f"seed={seed}"], "2026-11-23_10-00-00", num
        run_on_cluster(config, [f"seed={seed}"], num, record)
    assert [c[2] for c in fake.launched()][3:] == ["summrl-abl-1", "summrl-abl-2"]


def test_sweep_status_pull_cancel_then_report(cloud_env, monkeypatch, tmp_path, s3_endpoint, capsys):
    from sky.jobs.state import ManagedJobStatus
    from sky.schemas.api.responses import ManagedJobRecord

    fake = FakeJobs(monkeypatch)
    fake.endpoint = s3_endpoint
    s3(s3_endpoint).create_bucket(Bucket="runs")
    folder = submit_sweep(tmp_path / "my sweeps", fake)  # a space: the printed commands must still paste
    assert [c[2] for c in fake.launched()] == ["summrl-abl-0", "summrl-abl-1", "summrl-abl-2"]
    assert [c[1].name for c in fake.launched()] == [c[2] for c in fake.launched()]  # each task is named as its job
    assert not [c for c in fake.calls if c[0] == "jobs.tail_logs"]  # a sweep submits and returns
    records = [json.loads((folder / str(n) / "result.json").read_text()) for n in range(3)]
    assert [(r["status"], r["managed_job"]["id"]) for r in records] == [("submitted", 41), ("submitted", 42),
                                                                          ("submitted", 43)]
    assert records[0]["managed_job"]["usd_per_hour"] == 2.39 and records[0]["overrides"] == ["seed=1"]
    for value in PLANTED.values():  # the bucket named by BACKUP_BUCKET is not written down either
        assert value not in json.dumps(records)

    # What the jobs left in S3: job 41 finished 2 steps after a recovery, 42 is at step 1, 43 has not started.
    history = [{"training_step": 0, "val/reward": 0.40, "val/qa_accuracy": 0.40},
               {"training_step": 1, "train/reward": 0.5}, {"training_step": 1, "val/reward": 0.45},
               {"training_step": 2, "train/reward": 0.6}, {"training_step": 2, "val/reward": 0.55,
                                                           "val/qa_accuracy": 0.5}]
    remote = {"status": "completed", "steps": 2, "final_val_score": 0.55, "best_val_score": 0.55,
              "overrides": ["seed=1"], "seed": 1, "wall_s": 600.0, "recoveries": 1, "managed_job_id": "41",
              "val_history": [{"step": 0, "val_reward": 0.40, "val_qa_accuracy": 0.40},
                              {"step": 2, "val_reward": 0.55, "val_qa_accuracy": 0.5}],
              "attempts": [{"attempt": 1, "start_step": 0, "end_step": 1}, {"attempt": 2, "start_step": 1,
                                                                           "end_step": 2}]}
    client = s3(s3_endpoint)
    client.put_object(Bucket="runs", Key="summrl/summrl/abl-0/history.jsonl",
                      Body="\n".join(json.dumps(h) for h in history).encode())
    client.put_object(Bucket="runs", Key="summrl/summrl/abl-0/result.json", Body=json.dumps(remote).encode())
    client.put_object(Bucket="runs", Key="summrl/summrl/abl-1/history.jsonl",
                      Body=json.dumps({"training_step": 1, "val/reward": 0.31}).encode())
    client.put_object(Bucket="runs", Key="summrl/summrl/abl-1/result.json",
                      Body=json.dumps({"status": "running", "overrides": ["seed=2"], "seed": 2}).encode())
    fake.records = {
        41: ManagedJobRecord(job_id=41, status=ManagedJobStatus.SUCCEEDED, recovery_count=1, job_duration=3600.0),
        42: ManagedJobRecord(job_id=42, status=ManagedJobStatus.RECOVERING, recovery_count=2, job_duration=7200.0),
        43: ManagedJobRecord(job_id=43, status=ManagedJobStatus.PENDING, recovery_count=0, job_duration=0.0)}

    assert sweep_cli.main(["status", str(folder)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["job", "run", "managed", "job", "state", "step", "last", "val", "recoveries", "$",
                                "so", "far"]
    assert lines[1].split() == ["0", "abl-0", "41", "SUCCEEDED", "2", "0.550", "1", "$2.39"]  # 1 h run x $2.39/h
    assert lines[2].split() == ["1", "abl-1", "42", "RECOVERING", "1", "0.310", "2", "$4.78"]
    assert lines[3].split() == ["2", "abl-2", "43", "PENDING", "-", "-", "0", "$0.00"]
    assert lines[4] == "total so far: $7.17"
    assert ("get queue", ("queue", False, [41, 42, 43])) in fake.calls  # the controller is not woken up

    assert sweep_cli.main(["pull", str(folder)]) == 0
    out, err = capsys.readouterr()
    assert "2: no result.json in the backup yet" in err and "pulled 2 runs" in out
    assert shlex.split(out.strip().rsplit("; ", 1)[1]) == ["python", "-m", "summrl.report", str(folder)]
    pulled = json.loads((folder / "0" / "result.json").read_text())
    assert pulled["final_val_score"] == 0.55 and pulled["attempts"] == remote["attempts"]
    assert pulled["managed_job"]["id"] == 41  # status still finds the job after a pull
    assert (folder / "0" / "art" / "summrl" / "models" / "abl-0" / "history.jsonl").is_file()

    from summrl import report

    table, curves, *_ = report.collect(folder)
    assert list(table["status"]) == ["completed", "running", "submitted"]
    assert list(table["final_val_score"])[0] == 0.55
    assert curves["0"]["reward"] == [(0, 0.40), (1, 0.45), (2, 0.55)]

    assert sweep_cli.main(["cancel", str(folder)]) == 0
    assert ("get cancel", ("cancel", [42, 43])) in fake.calls  # 41 had ended: SkyPilot would skip it
    assert "cancelled managed jobs 42, 43; already ended (or not in SkyPilot's queue): 41" in capsys.readouterr().out

    # 10 idle minutes after the last job, the controller stops, and SkyPilot's queue and cancel raise (a traceback
    # lost the whole table): the S3 columns still show, and there is nothing left to cancel.
    def stopped(*args, **kwargs):
        raise sky.exceptions.ClusterNotUpError("No in-progress managed jobs.")

    monkeypatch.setattr(sky.jobs, "queue_v2", stopped)
    monkeypatch.setattr(sky.jobs, "cancel", stopped)
    assert sweep_cli.main(["status", str(folder)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[1].split() == ["0", "abl-0", "41", "ENDED", "(controller", "stopped)", "2", "0.550", "-", "-"]
    assert out[4] == "total so far: unknown" and "jobs controller has stopped" in out[5]
    assert sweep_cli.main(["cancel", str(folder)]) == 0
    assert "nothing to cancel; already ended (or not in SkyPilot's queue): 41, 42, 43" in capsys.readouterr().out


# Runs summrl.train with a clock that moves a second each time Hydra's ${now} is resolved: every composition of a
# job (its own, and an earlier job's composition of it for the sweep's estimate) gets another default run.name.
TICKING_TRAIN = """
import datetime, runpy, sys
import hydra.core.utils

class Ticking(datetime.datetime):
    at = datetime.datetime(2026, 11, 24, 10, 0, 0)

    @classmethod
    def now(cls, tz=None):
        cls.at += datetime.timedelta(seconds=1)
        return cls.at

hydra.core.utils.datetime = Ticking
sys.argv[0] = "summrl.train"
runpy.run_module("summrl.train", run_name="__main__")
"""


def test_pull_swaps_a_history_in_whole_by_a_rename(cloud_env, monkeypatch, tmp_path, s3_endpoint):
    """A pull killed while writing history.jsonl in place left it cut, and the report read fewer steps. The history is
    written beside it and renamed over it: the file is the old one or the new one, whole. A reader that opened the
    old one (here, the cut file an earlier pull left) goes on reading it; in place, it read the file being rewritten."""
    fake = FakeJobs(monkeypatch)
    fake.endpoint = s3_endpoint
    s3(s3_endpoint).create_bucket(Bucket="runs")
    folder = submit_sweep(tmp_path, fake, seeds=(1,))
    history = b"".join(json.dumps({"training_step": s, "val/reward": 0.1 * s}).encode() + b"\n" for s in range(4))
    s3(s3_endpoint).put_object(Bucket="runs", Key="summrl/summrl/abl-0/history.jsonl", Body=history)
    target = folder / "0" / "art" / "summrl" / "models" / "abl-0" / "history.jsonl"
    target.parent.mkdir(parents=True)
    target.write_bytes(history[:30])  # what a killed pull left

    with target.open("rb") as reader:
        sweep_cli.pull(folder)  # (the session's S3 may hold a result.json of abl-0 from another test)
        assert reader.read() == history[:30]
    assert target.read_bytes() == history and [p.name for p in target.parent.iterdir()] == ["history.jsonl"]


def test_the_dry_run_of_a_managed_spot_sweep_prints_both_tasks_and_their_cost_offline(cloud_env, tmp_path):
    """The issue's command, with no network: the tasks, each job's estimate and the sweep's total; each job's name
    (the default: the sweep folder's, with the job's number) the same in its task, its command and its estimate."""
    import re

    env = {**os.environ, "SKY_RUNTIME_DIR": str(SKY_RUNTIME), "PYTHONUNBUFFERED": "1"}
    result = subprocess.run(
        # -cn train: a flag's value was parsed as an override, and the sweep's total fell back to each job's own
        [sys.executable, "-c", TICKING_TRAIN, "-m", "-cn", "train", "backend.managed=true", "backend.use_spot=true",
         "reward=qa,ruler",
         "backend.dry_run=true", f"hydra.sweep.dir={tmp_path / 'multirun'}"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=180)
    assert result.returncode == 0, result.stderr[-3000:]
    out = result.stdout
    assert out.count("use_spot: true") == 2 and out.count("strategy: EAGER_NEXT_REGION") == 2
    names = re.findall(r"summrl: dry run: managed job summrl-(\S+), H100:1 on runpod", out)
    # named for the sweep's folder, not the clock as each job started (no one run.name resumed them all)
    assert names == [f"{tmp_path.name}_multirun-0", f"{tmp_path.name}_multirun-1"]
    for name, reward in zip(names, ("qa", "ruler")):
        assert f"name: summrl-{name}\n" in out
        assert f"python -m summrl.train reward={reward} " in out and f" run.name={name} backend=local_gpu" in out
        assert f"summrl: estimated cost of run {name}: $" in out  # was the earlier job's composition of it
    assert "H100:1 on runpod (spot) at $1.25/h from SkyPilot's catalog" in out
    assert out.count("summrl: estimated cost of the sweep of 2 jobs: $") == 1
    assert out.count("the task is valid; nothing was launched") == 2
    assert "file_mounts" not in out and "volumes" not in out  # SkyPilot's empty mappings
    assert not result.stderr.strip() and "warning" not in out.lower()  # one clean screen
    for value in PLANTED.values():
        assert value not in out + result.stderr
    assert not list((tmp_path / "multirun").glob("*/result.json"))  # nothing was submitted


def test_a_qwen3_8b_managed_run_composes_and_is_priced_at_its_step_time(cloud_env):
    config = managed_config("model=qwen3_8b")
    task = build_task(config, ["model=qwen3_8b"], "summrl-job")
    task.validate()
    assert "python -m summrl.train model=qwen3_8b " in task.run  # the remote job composes the same preset
    e = pricing.estimate_run(config)
    assert config.model.step_minutes == 12.5 and e.hours == pytest.approx((15 + 40 * 12.5) / 60)


# ------------------------------------------------------------------ a single managed run, and a sweep's preflight


def test_a_single_managed_run_streams_its_logs_and_returns_its_val_score(cloud_env, monkeypatch, s3_endpoint, tmp_path,
                                                                         caplog):
    caplog.set_level(logging.INFO, logger="summrl")
    fake = FakeJobs(monkeypatch)
    s3(s3_endpoint).create_bucket(Bucket="runs")
    remote = {"status": "completed", "steps": 40, "final_val_score": 0.71, "managed_job_id": "41", "recoveries": 1}

    def tail_logs(name=None, job_id=None, follow=True, **kwargs):  # the job runs (and recovers) while it is watched
        fake.calls.append(("jobs.tail_logs", job_id, follow, kwargs))
        s3(s3_endpoint).put_object(Bucket="runs", Key="summrl/summrl/summary-rl/result.json",
                                   Body=json.dumps(remote).encode())
        return 0

    monkeypatch.setattr(sky.jobs, "tail_logs", tail_logs)
    config = managed_config(f"storage.endpoint_url={s3_endpoint}")
    config.run.dir = str(tmp_path / "run")
    assert run_on_cluster(config, [], None) == 0.71
    (launched,) = fake.launched()
    assert launched[1].name == launched[2] == "summrl-summary-rl"  # the task's name is the managed job's
    assert [c[:3] for c in fake.calls if c[0] == "jobs.tail_logs"] == [("jobs.tail_logs", 41, True)]
    assert not [c for c in fake.calls if c[0] in ("launch", "tail_logs", "down")]  # not the cluster path
    record = json.loads((tmp_path / "run" / "result.json").read_text())
    assert record["final_val_score"] == 0.71 and record["recoveries"] == 1
    assert record["managed_job"]["id"] == 41  # summrl.sweep status still finds the job
    assert "streaming the logs of managed job 41" in said(caplog, logging.INFO)


def test_ctrl_c_while_a_managed_job_is_submitted_cancels_the_request_and_says_how_to_find_the_job(
        cloud_env, monkeypatch, tmp_path, caplog):
    """SkyPilot's API server carries a submission on without the terminal that sent it: Ctrl-C left a job running
    and billed, recorded nowhere, and nothing said so."""
    fake = FakeJobs(monkeypatch)

    def interrupted(request):
        if request[0] == "launch":
            raise KeyboardInterrupt
        return fake.answer(request)

    monkeypatch.setattr(sky, "stream_and_get", interrupted)
    monkeypatch.setattr(sky, "api_cancel", lambda request, silent=False: ("api_cancel", request))
    config = managed_config()
    config.run.dir = str(tmp_path / "run")
    with pytest.raises(KeyboardInterrupt):
        run_on_cluster(config, [], None)
    assert ("get api_cancel", ("api_cancel", ("launch", 41))) in fake.calls
    err = said(caplog, logging.ERROR)
    assert "cancelled the submission of managed job summrl-summary-rl" in err
    assert "sky jobs queue" in err and "sky jobs cancel -n summrl-summary-rl" in err
    assert not (tmp_path / "run" / "result.json").exists() or "managed_job" not in json.loads(
        (tmp_path / "run" / "result.json").read_text())


def test_a_failed_managed_run_exits_as_the_job_did_and_ctrl_c_only_stops_watching(cloud_env, monkeypatch, caplog,
                                                                                   tmp_path):
    import requests

    fake = FakeJobs(monkeypatch)
    monkeypatch.setattr(sky.jobs, "tail_logs", lambda **kw: 100)
    with pytest.raises(launch.RemoteJobFailed, match=r"managed job 41 \(summrl-summary-rl\) ended with exit code 100: "
                                                     r"see its logs with `sky jobs logs 41`"):
        run_on_cluster(managed_config(), [], None)
    config = managed_config()
    config.run.dir = str(tmp_path / "run")
    with pytest.raises(SystemExit) as exit_:  # python -m summrl.train exits with the job's code
        launch.run_from_hydra(config, RunRecord(tmp_path / "run"))
    assert exit_.value.code == 100
    # recorded as a sweep's failed job is: the record said "submitted" for good (found by an audit)
    record = json.loads((tmp_path / "run" / "result.json").read_text())
    assert (record["status"], record["error_kind"], record["exit_code"]) == ("failed", "remote", 100)
    assert record["error"] == "remote job failed: the managed job 42 (summrl-summary-rl) ended with exit code 100: " \
                              "see its logs with `sky jobs logs 42`"
    assert record["managed_job"]["id"] == 42  # summrl.sweep status still finds the job

    def interrupted(**kw):
        raise KeyboardInterrupt

    monkeypatch.setattr(sky.jobs, "tail_logs", interrupted)
    # only the watching stops: no interruption of the run ("run the same command to start again" would submit a
    # second, billed job), and its record stays "submitted" (found by an audit)
    assert run_on_cluster(managed_config(), [], None) is None
    assert not [c for c in fake.calls if "cancel" in c[0]]  # the job goes on
    err = said(caplog, logging.WARNING)
    assert "stopped watching managed job 43" in err and "sky jobs cancel 43" in err

    def offline(**kw):
        raise requests.exceptions.ConnectionError("Failed to resolve 'api.example'")

    monkeypatch.setattr(sky.jobs, "tail_logs", offline)
    assert run_on_cluster(managed_config(), [], None) is None  # submitted; only the watching failed
    assert "the job goes on: sky jobs logs 44" in said(caplog, logging.WARNING)
    # SkyPilot's 101 (NOT_FINISHED: the stream ended first) read as the job's failure (found by an audit)
    monkeypatch.setattr(sky.jobs, "tail_logs", lambda **kw: 101)
    assert run_on_cluster(managed_config(), [], None) is None
    assert "stopped streaming before it ended; it goes on: sky jobs logs 45" in said(caplog, logging.WARNING)
    assert len(fake.launched()) == 5  # one submission each, none again


def test_a_sweep_whose_first_job_cant_launch_stops_there_with_one_listing(cloud_env, monkeypatch, caplog, tmp_path):
    import copy

    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode
    from omegaconf import read_write

    fake = FakeJobs(monkeypatch)
    monkeypatch.delenv("GEMINI_API_KEY")
    config = managed_config()
    sweep = copy.deepcopy(HydraConfig.instance().cfg)
    with read_write(sweep.hydra):
        sweep.hydra.mode, sweep.hydra.job.num = RunMode.MULTIRUN, 0
    monkeypatch.setattr(HydraConfig.instance(), "cfg", sweep)
    record = RunRecord(tmp_path / "0")
    with pytest.raises(SystemExit) as exit_:
        launch.run_from_hydra(config, record)
    assert exit_.value.code == 3  # a preflight error's
    err = said(caplog, logging.ERROR)
    assert err.count("GEMINI_API_KEY (the judge's key) is not set") == 1
    assert err.endswith("summrl: the sweep stopped at its first job: nothing was submitted")
    assert json.loads((tmp_path / "0" / "result.json").read_text())["status"] == "failed"
    assert fake.launched() == []
    with read_write(sweep.hydra):  # a later job's own problem fails that job only: Hydra records it and goes on
        sweep.hydra.job.num = 1
    with pytest.raises(PreflightError):
        launch.run_from_hydra(config, RunRecord(tmp_path / "1"))


# --------------------------------------------------------------------------- a simulated preemption

PREEMPT_ARGS = ["experiment=local", "backend=skypilot", "backend.managed=true", "judge=lexical", "trainer.max_steps=4",
                "trainer.eval_every=100", "trainer.max_summary_tokens=8", "trainer.groups_per_step=1",
                "trainer.rollouts_per_group=2", "trainer.val_rollouts_per_doc=1", "dataset.val_size=1",
                "dataset.train_size=4", "storage.enabled=true",
                "storage.bucket=preempt"]


def local_command(task_run: str, run_dir, weights: str) -> list[str]:
    """The managed job's own command (its task's last line), with the GPU backend it asks for swapped for the
    embedded one and ``weights`` (``model.weights=...``) for the hub's: this machine has no GPU and no network.
    Everything else (run name, data, trainer, storage) is the job's."""
    import shlex

    args = shlex.split(task_run.splitlines()[-1])
    assert args[:3] == ["python", "-m", "summrl.train"] and "backend=local_gpu" in args
    kept = [a for a in args[3:] if a != "backend=local_gpu" and not a.startswith(("backend.", "++backend.",
                                                                                  "model.weights="))]
    return [sys.executable, "-m", "summrl.train", *kept, "backend=embedded", weights, f"hydra.run.dir={run_dir}"]


def test_a_preempted_managed_job_resumes_from_s3_with_no_step_repeated_or_lost(cloud_env, tmp_path, s3_endpoint,
                                                                               tiny_weights, monkeypatch):
    import shutil
    import signal
    import time

    from summrl.testing import FakeLLM
    from tests.conftest import CREDENTIALS, keys

    overrides = [*PREEMPT_ARGS, "model.weights=null", f"storage.endpoint_url={s3_endpoint}"]  # a GPU loads the hub's
    config = default_config(*overrides)
    command = local_command(build_task(config, overrides, "summrl-preempt").run, tmp_path / "run", tiny_weights)
    # The job's environment on a recovered machine: the same secrets, and SkyPilot's managed job id.
    env = {**os.environ, **CREDENTIALS, "SKYPILOT_MANAGED_JOB_ID": "41", "PYTHONUNBUFFERED": "1"}
    prefix = "summrl/summrl/summary-rl/"
    s3(s3_endpoint).create_bucket(Bucket="preempt")

    with FakeLLM() as judge:  # a judge that counts its calls: the run's spend must survive the kill
        # (its lexical judge swapped for it, after the job's own overrides)
        command = [*command, "judge=openai_compatible", "judge.model=openai/fake-judge", "judge.cache_dir=null",
                   f"judge.api_base={judge.base_url}"]
        first = subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        deadline = time.time() + 120
        while f"{prefix}checkpoints/0002.complete" not in keys(s3_endpoint, "preempt", prefix):
            assert first.poll() is None and time.time() < deadline, first.stderr.read().decode()[-3000:]
            time.sleep(0.2)
        first.send_signal(signal.SIGKILL)  # a spot pod: gone without notice, mid-run
        first.wait()
        done = sorted(int(k[len(prefix) + 12:-9]) for k in keys(s3_endpoint, "preempt", prefix)
                      if k.endswith(".complete"))
        assert done[-1] < 4, "the run finished before it was killed: it was not preempted mid-run"

        shutil.rmtree(tmp_path / "run")  # a fresh machine: only the S3 backup is left
        asked_before = len(judge.requests)
        second = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
        asked_after = len(judge.requests) - asked_before
    assert second.returncode == 0, second.stderr[-3000:]
    assert f"restored step {done[-1]}" in second.stdout

    result = json.loads((tmp_path / "run" / "result.json").read_text())
    assert result["status"] == "completed" and result["steps"] == 4
    # The killed attempt's spend and rollouts are the run's too (its record, saved at each step, carries them; only
    # the calls since its last step are lost): a recovered run recorded only its last attempt's.
    assert asked_after < result["judge_calls"] <= asked_before + asked_after
    assert result["rollouts"]["scored"] >= 4 * 2  # every step's 2 rollouts, the killed attempt's steps too
    assert (result["managed_job_id"], result["recoveries"]) == ("41", 1)
    first_attempt, second_attempt = result["attempts"]
    assert (first_attempt["start_step"], first_attempt["end_step"]) == (0, done[-1])
    assert (second_attempt["start_step"], second_attempt["end_step"]) == (done[-1], 4)
    assert first_attempt["steps_trained"] + second_attempt["steps_trained"] == 4
    history = tmp_path / "run" / "art" / "summrl" / "models" / "summary-rl" / "history.jsonl"
    trained = [row["training_step"] for row in map(json.loads, history.read_text().splitlines())
               if any(k.startswith("train/") for k in row)]
    assert trained == [1, 2, 3, 4]  # each step trained once: none repeated, none lost


def test_sweep_status_without_the_bucket_or_with_one_s3_refuses_says_so_in_one_line(cloud_env, monkeypatch, tmp_path,
                                                                                    s3_endpoint, capsys):
    """The bucket named by $BACKUP_BUCKET is not written down: unset, every run read as "not trained a step yet";
    a bucket S3 refuses was a traceback."""
    fake = FakeJobs(monkeypatch)
    fake.endpoint = s3_endpoint
    s3(s3_endpoint).create_bucket(Bucket="runs")
    folder = submit_sweep(tmp_path, fake, seeds=(1,))
    record = json.loads((folder / "0" / "result.json").read_text())
    record["managed_job"]["backup"]["bucket"] = None  # as a job submitted with BACKUP_BUCKET records it
    (folder / "0" / "result.json").write_text(json.dumps(record))
    monkeypatch.delenv("BACKUP_BUCKET", raising=False)
    monkeypatch.setattr("dotenv.load_dotenv", lambda *a, **k: False)
    assert sweep_cli.main(["status", str(folder)]) == 2
    assert "export BACKUP_BUCKET=<that bucket>" in capsys.readouterr().err
    monkeypatch.setenv("BACKUP_BUCKET", "no-such-bucket")
    with pytest.raises(SystemExit) as ended:
        sweep_cli.main(["status", str(folder)])
    assert ended.value.code == 6  # summrl's S3 error, one line


def test_a_sweep_read_back_from_no_command_line_is_priced_as_its_jobs_so_far(monkeypatch, caplog):
    """Another sweeper's jobs (Optuna's) can't be read back: the warning said each job was checked on its own, where
    the jobs so far are priced as this one and the budget held against their total (found by an audit)."""
    from types import SimpleNamespace

    from hydra.core.hydra_config import HydraConfig

    from summrl.cloud import plan

    config = managed_config()
    monkeypatch.setattr(HydraConfig, "get", staticmethod(lambda: SimpleNamespace(sweeper={"params": None})))
    monkeypatch.setattr(sys, "argv", ["summrl.train", "-m", "hydra/sweeper=optuna", "seed=choice(1,2,3)"])
    with caplog.at_level(logging.WARNING, logger="summrl"):
        found = plan.estimates(config, ["seed=2"], 2)
    assert found == [pricing.estimate_run(config)] * 3
    assert "the sweep so far is priced as 3 jobs of this one's estimate" in caplog.text


def test_a_job_record_that_is_not_a_submission_is_passed_over_by_the_sweep_commands(tmp_path):
    """A job's result.json that is valid JSON but no record ([1]), or a managed_job without its backup, ended
    summrl.sweep status in a traceback (AttributeError, KeyError) (found by this stop's CLI audit)."""
    from summrl.cloud.sweep import submitted
    from summrl.job import read_result

    for num, record in enumerate(([1], {"managed_job": {"id": 3}}, {"managed_job": {"id": 4, "backup": {}}})):
        (tmp_path / str(num)).mkdir()
        (tmp_path / str(num) / "result.json").write_text(json.dumps(record))
    assert read_result(tmp_path / "0") is None
    assert [(job.name, managed["id"]) for job, managed in submitted(tmp_path)] == [("2", 4)]
