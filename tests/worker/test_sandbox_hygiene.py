"""The job sandbox's hygiene (issue 15, item 6): the child ``worker.supervise.run_child``
starts sees none of the worker's credentials, writes private files (umask 077) and runs
in a session of its own, whose whole process group goes when the run ends."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import numpy as np
import onnx
import onnx.parser
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper
from onnx.external_data_helper import uses_external_data

from autofusion.worker.execute import Outcome, execute_job
from autofusion.worker.sandbox import INPUT_DIR, JOB_FILE, OUTPUT_DIR, PATTERNS_FILE, TEST_CRASH_ENV
from autofusion.worker.supervise import run_child
from tests.worker.worker_testing import WorkerEnv

SECRETS = {
    "DATABASE_URL": "postgresql://autofusion:hunter2@db/autofusion",
    "REDIS_URL": "redis://:hunter2@redis:6379/0",
    "PGPASSWORD": "hunter2",
    "AWS_SECRET_ACCESS_KEY": "hunter2",
    "AUTOFUSION_DATABASE_URL": "postgresql://autofusion:hunter2@db/autofusion",
}


def job_folder(tmp_path: Path) -> Path:
    """A folder as the worker prepares it: job.json, patterns.json, input/model.onnx."""
    folder = tmp_path / "job"
    (folder / INPUT_DIR).mkdir(parents=True)
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"])],
        "relu",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.save(model, folder / INPUT_DIR / "model.onnx")
    job = {"model": "model.onnx", "config": {}, "memory_limit_mb": 4096, "parent_pid": os.getpid()}
    (folder / JOB_FILE).write_text(json.dumps(job))
    (folder / PATTERNS_FILE).write_text("[]")
    return folder


def sandbox_pids(folder: Path) -> list[int]:
    pids = []
    for entry in Path("/proc").iterdir():
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0") if entry.name.isdigit() else []
        except OSError:
            continue
        if b"autofusion.worker.sandbox" in argv and str(folder).encode() in argv:
            pids.append(int(entry.name))
    return pids


def test_the_sandbox_sees_no_secrets_and_runs_in_its_own_session(tmp_path, monkeypatch):
    for name, value in SECRETS.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv(TEST_CRASH_ENV, "sleep:60")  # hold the child while we look at it
    folder = job_folder(tmp_path)
    seen: dict = {}

    def report(stage: str, progress: float) -> bool:
        pids = sandbox_pids(folder)
        if not pids:
            return True
        pid = pids[0]
        proc = Path(f"/proc/{pid}")
        seen["environ"] = dict(
            item.split("=", 1) for item in (proc / "environ").read_text().split("\0") if "=" in item
        )
        seen["status"] = (proc / "status").read_text()
        seen["pid"], seen["sid"], seen["pgid"] = pid, os.getsid(pid), os.getpgid(pid)
        return False  # abandon the run: the child's group is killed

    run = run_child(folder, time_limit_s=60, heartbeat_s=0.1, report=report)

    assert run.status == "abandoned", run
    environ = seen["environ"]
    assert "hunter2" not in "".join(environ.values())
    assert not set(SECRETS) & set(environ)
    assert not [k for k in environ if k.startswith("AUTOFUSION_") and k != TEST_CRASH_ENV]
    assert environ["HOME"] == str(folder)
    assert environ[TEST_CRASH_ENV] == "sleep:60"  # the test hook, and only it, passes
    assert "Umask:\t0077" in seen["status"]
    assert seen["sid"] == seen["pgid"] == seen["pid"]
    assert sandbox_pids(folder) == []  # killed with its group, not left sleeping


def test_what_the_sandbox_writes_is_private(tmp_path, monkeypatch):
    monkeypatch.delenv(TEST_CRASH_ENV, raising=False)
    folder = job_folder(tmp_path)

    run = run_child(folder, time_limit_s=300, heartbeat_s=5, report=lambda *_: True)

    assert (run.status, run.returncode) == ("exited", 0), run.log_tail
    written = sorted((folder / OUTPUT_DIR).iterdir())
    assert {p.name for p in written} >= {"fused.onnx", "report.json", "report.html"}
    modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in written}
    assert set(modes.values()) == {0o600}, modes


FUNCTION_MODEL = """\
<ir_version: 8, opset_import: ["" : 17, "local" : 1]>
g (float[4] x) => (float[4] y) { y = local.AddW (x) }
<domain: "local", opset_import: ["" : 17]>
AddW (x) => (y) {
    w = Constant <value = float[4] {0, 0, 0, 0}> ()
    y = Add (x, w)
}
"""


def test_a_fused_model_with_external_data_in_a_function_body_loads_on_its_own(
    env: WorkerEnv, tmp_path
):
    """The weight of a Constant inside a model-local function lives in ``w.bin``: the
    downloaded fused model must not keep ``location: w.bin``."""
    upload = tmp_path / "upload"
    upload.mkdir()
    weight = np.array([1, 2, 3, 4], np.float32)
    model = onnx.parser.parse_model(FUNCTION_MODEL)
    tensor = numpy_helper.from_array(weight, "w")
    (upload / "w.bin").write_bytes(tensor.raw_data)
    tensor.ClearField("raw_data")
    tensor.data_location = TensorProto.EXTERNAL
    tensor.external_data.append(onnx.StringStringEntryProto(key="location", value="w.bin"))
    model.functions[0].node[0].attribute[0].t.CopyFrom(tensor)
    onnx.save(model, upload / "model.onnx")
    job_id = env.submit(
        upload / "model.onnx", model_name="model.onnx", data_files=(upload / "w.bin",)
    )

    assert execute_job(env.settings, job_id, "w1", env.store) == Outcome.succeeded
    job = env.job(job_id)
    downloaded = tmp_path / "download"
    downloaded.mkdir()
    fused = env.store.fetch(job.fused_digest, downloaded / "fused.onnx")

    proto = onnx.load(fused, load_external_data=False)
    attrs = [a for f in proto.functions for n in f.node for a in n.attribute if a.type == a.TENSOR]
    assert attrs and not any(uses_external_data(a.t) for a in attrs)
    session = ort.InferenceSession(str(fused), providers=["CPUExecutionProvider"])
    x = np.array([0.5, 1.5, 2.5, 3.5], np.float32)
    np.testing.assert_array_equal(session.run(None, {"x": x})[0], x + weight)
