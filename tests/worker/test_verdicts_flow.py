"""Measured jobs through the worker (``execute_job``, real sandboxes, real timings) and the
verdict store: the first job's verdicts are stored with its id; a second job on the same
model decides its groups from them (its report names the first job), reaches the same
decisions and measures at least 5 times faster; another tenant's job reuses them too but
never sees the first job's id. On SQLite and PostgreSQL."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper
from sqlalchemy import select

from autofusion.app.core.models import Job, Verdict
from autofusion.fusion_core.profiling.verdicts import (
    VERDICTS_FORMAT,
    measuring_machine,
    read_verdicts,
)
from autofusion.worker.execute import Outcome, execute_job
from autofusion.worker.job_verdicts import JobVerdicts
from autofusion.worker.sandbox import OUTPUT_DIR, VERDICTS_FILE
from tests.app.verdicts_testing import record
from tests.worker.worker_testing import WorkerEnv


def conv_model(channels: int = 32, size: int = 64, blocks: int = 3) -> bytes:
    """Conv-BN-Relu blocks, one with a residual Add, and a last Conv-BN: three groups of
    fusions (conv_bn_relu, conv_bn_add_relu, conv_bn), a few milliseconds a run, so
    that timing them, not building the models, is most of measured selection's time."""
    rng = np.random.default_rng(0)
    nodes, weights = [], []

    def conv_bn(x: str, name: str) -> str:
        w = rng.standard_normal((channels, channels, 3, 3)).astype(np.float32) * 0.1
        weights.append(numpy_helper.from_array(w, f"{name}_w"))
        for part, center in (("scale", 1.0), ("bias", 0.0), ("mean", 0.0), ("var", 1.0)):
            values = rng.standard_normal(channels).astype(np.float32) * 0.1 + center
            weights.append(numpy_helper.from_array(np.abs(values), f"{name}_{part}"))
        nodes.append(helper.make_node("Conv", [x, f"{name}_w"], [f"{name}_c"], pads=[1] * 4))
        parts = [f"{name}_{p}" for p in ("c", "scale", "bias", "mean", "var")]
        nodes.append(helper.make_node("BatchNormalization", parts, [f"{name}_bn"]))
        return f"{name}_bn"

    x = "x"
    for i in range(blocks):
        nodes.append(helper.make_node("Relu", [conv_bn(x, f"a{i}")], [f"a{i}_r"]))
        x = f"a{i}_r"
    nodes.append(helper.make_node("Add", [conv_bn(x, "b"), x], ["b_sum"]))
    nodes.append(helper.make_node("Relu", ["b_sum"], ["b_r"]))
    nodes.append(helper.make_node("Identity", [conv_bn("b_r", "c")], ["y"]))
    shape = [1, channels, size, size]
    graph = helper.make_graph(
        nodes,
        "convs",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, shape)],
        weights,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.checker.check_model(model, full_check=True)
    return model.SerializeToString()


MODEL = conv_model()


def _config(budget_s: float) -> dict[str, Any]:
    options = {"budget_s": budget_s, "min_runs": 6}
    return {"target": "onnxruntime", "selection": "measured", "measure_options": options}


def _run(env: WorkerEnv, budget_s: float, tenant: str = "acme") -> tuple[str, dict, dict]:
    job_id = env.submit(MODEL, model_name="convs.onnx", config=_config(budget_s), tenant=tenant)
    assert execute_job(env.settings, job_id, "w1", env.store) == Outcome.succeeded
    job = env.job(job_id)
    return job_id, json.loads(env.store.read_bytes(job.report_digest)), job.summary


def _groups(report: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {g["group"]: g for g in report["measurement"]["groups"]}


def _stored(env: WorkerEnv) -> dict[str, tuple]:
    with env.db() as session:
        rows = session.scalars(select(Verdict)).all()
        return {r.group_key: (r.job_id, r.tenant_id, r.source) for r in rows}


def _flow(env: WorkerEnv, budget_s: float) -> tuple[dict, dict]:
    """Three jobs on one model: acme's (stores), acme's again (reuses, names the first),
    globex's (reuses, sees no job id); the first two reports."""
    first, report, summary = _run(env, budget_s)
    options = report["config"]["measure_options"]
    attempt = (env.settings.jobs_dir / first / "attempt-1").resolve()
    assert options["cache_dir"] is None
    assert options["verdicts_file"] == str(attempt / VERDICTS_FILE)
    assert not (env.settings.data_dir / "measured").exists()  # the old shared folder
    timed = {k: g for k, g in _groups(report).items() if g["source"] == "measured"}
    assert len(timed) == 3, report["measurement"]
    assert _stored(env) == {key: (first, "acme", "measured") for key in timed}
    assert summary["verdicts"] == {"reused": 0, "measured": 3, "stored": 3}

    _, again, summary = _run(env, budget_s)
    groups = _groups(again)
    for key in timed:
        assert groups[key]["source"] == "store", groups[key]
        assert groups[key]["combined"]["jobs"] == [first]  # the tenant's own job, named
        assert groups[key]["kept"] == timed[key]["kept"]  # the same decisions
    assert summary["verdicts"] == {"reused": 3, "measured": 0, "stored": 0}
    assert again["fusions"] == report["fusions"]

    _, theirs, _ = _run(env, budget_s, tenant="globex")  # verdicts shared, jobs not
    for key in timed:
        group = _groups(theirs)[key]
        assert group["source"] == "store" and group["combined"]["jobs"] == []
    assert first not in json.dumps(theirs)
    assert len(_stored(env)) == 3  # nothing measured again, nothing stored again
    return report, again


def test_a_second_job_decides_from_the_first_ones_verdicts_5_times_faster(make_env):
    # A generous budget: the first job times three groups for most of it, the second
    # only the final comparison (a twentieth of it) and builds its models.
    first, second = _flow(make_env(), budget_s=12)
    seconds = (first["measurement"]["seconds"], second["measurement"]["seconds"])
    assert seconds[0] >= 5 * seconds[1], seconds


def test_the_flow_on_postgresql(make_env, postgres_url):
    _flow(make_env(database_url=postgres_url), budget_s=2)


def test_the_sandboxs_output_is_read_as_untrusted(env: WorkerEnv, tmp_path, monkeypatch, caplog):
    folder = tmp_path / "attempt-1"
    (folder / OUTPUT_DIR).mkdir(parents=True)
    options = {
        "verdicts_file": str(folder / VERDICTS_FILE),
        "level": "ORT_ENABLE_ALL",
        "threads": 1,
    }
    here = measuring_machine("ORT_ENABLE_ALL", 1)
    job = Job(id="job-1", tenant_id="acme")
    verdicts = JobVerdicts(env.settings, job, {"measure_options": options}, folder)
    assert verdicts.measured and verdicts.write_reusable() == 0  # an empty store
    assert read_verdicts(folder / VERDICTS_FILE) == ([], [])
    output = folder / OUTPUT_DIR / VERDICTS_FILE
    good, elsewhere = record(1, machine=here), record(2)  # record(2): another machine class
    bad = {**record(3, machine=here), "signature": "not hex"}
    output.write_text(json.dumps({"format": VERDICTS_FORMAT, "verdicts": [good, elsewhere, bad]}))
    summary: dict[str, Any] = {"verdicts": {"reused": 0, "measured": 2, "stored": 0}}
    verdicts.collect(summary)
    assert summary["verdicts"]["stored"] == 1 and len(verdicts.records) == 2
    assert verdicts.store() == 1
    assert _stored(env) == {good["group"]: ("job-1", "acme", "measured")}
    assert "invalid verdicts dropped" in caplog.text
    output.unlink()
    output.symlink_to(folder / VERDICTS_FILE)  # the worker's own input, or any file
    verdicts.collect(summary)
    assert verdicts.records == [] and "not a regular file" in caplog.text
    output.unlink()
    output.write_text("{not json")
    verdicts.collect(summary)
    assert verdicts.records == [] and summary["verdicts"]["stored"] == 0
    output.write_text(json.dumps({"format": VERDICTS_FORMAT, "verdicts": [good]}))
    verdicts.collect(summary)

    def broken(*args, **kwargs):
        raise RuntimeError("the database is gone")

    monkeypatch.setattr("autofusion.worker.job_verdicts.record_job_verdicts", broken)
    assert verdicts.store() == 0 and "could not store its verdicts" in caplog.text
