"""A decoder past 2 GiB through the service as a CI pipeline sends it (issue 29).

``autofusion submit decoder.onnx --data decoder.onnx.data --wait -o ...`` against a live
``autofusion serve`` (embedded: SQLite, the worker thread, the local store): the data
file (2 GiB of fp32 weights, ``bench/_big_models.py``, built in seconds) goes through
``/v1/uploads`` in resumable chunks, the job optimizes it with the check on, and the
fused model comes back with its data file beside it. The test asserts the job
succeeded with its check passed, the two files came back under the names the model
gives, the fused logits equal the original's on a short left-padded batch (rtol = atol =
1e-4, onnxruntime reading each from its files, one session at a time), and that the
service process (the API and the worker's supervisor; the optimize runs in a sandboxed
child) never held the weights: its peak resident memory stays under 1 GiB while 2 GiB
went in and 2 GiB came out. In the corpus tier: about three minutes, 14 GB of disk
(upload parts, the store, the attempt folder, the downloads), all removed after.
"""

from __future__ import annotations

import re
import shutil
import sys
from pathlib import Path

import httpx
import numpy as np
import onnx
import pytest
from corpus_tier import REPO, decoder_logits

from tests.app.cli_server import FAST_POLL, Server, start_cli, stop_process

sys.path.insert(0, str(REPO / "bench"))
import _big_models  # bench/ is not a package

GIB = 1 << 30
SIZE = 2.05 * GIB
TOL = dict(rtol=1e-4, atol=1e-4)
SERVICE_PEAK = 1 * GIB  # the service process streams: never a copy of the weights
TIMEOUT = 1200


def _peak_rss(pid: int) -> int:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(re.search(r"VmHWM:\s+(\d+) kB", status).group(1)) * 1024


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    folder = tmp_path_factory.mktemp("big-service")
    env = dict(FAST_POLL)  # the default memory limit (8 GiB of address space)
    server = Server(folder / "data", env=env)
    try:
        server.wait_healthy()
        info = _big_models.make_decoder(folder / "model", _big_models.shape_for_size(SIZE))
        model = Path(info["path"])
        out = folder / "out" / "fused.onnx"
        args = ["submit", model, "--data", model.with_name(model.name + ".data"), "--wait",
                "-o", out, "--server", server.url, "--timeout", str(TIMEOUT)]  # fmt: skip
        log = folder / "submit.log"
        submit = start_cli([str(a) for a in args], log)
        try:
            code = submit.wait(TIMEOUT + 60)
        finally:
            stop_process(submit)
        yield {
            "code": code,
            "log": log.read_text(errors="replace"),
            "model": model,
            "out": out,
            "info": info,
            "server": server,
            "service_peak": _peak_rss(server.process.pid),
        }
    finally:
        server.stop()
        shutil.rmtree(folder, ignore_errors=True)  # GBs of weights: never left behind


def test_the_job_succeeds_and_the_fused_model_comes_back_with_its_data(served) -> None:
    assert served["info"]["model_bytes"] > 2 * GIB
    assert served["code"] == 0, served["log"][-3000:]
    out = served["out"]
    data = out.parent / "decoder.fused.onnx.data"
    assert f"its data:           {data}" in served["log"]
    graph = onnx.load(out, load_external_data=False).graph
    places = {e.value for t in graph.initializer for e in t.external_data if e.key == "location"}
    assert places == {data.name} and data.stat().st_size > GIB
    job_id = re.search(r"job:\s+(\S+) succeeded", served["log"]).group(1)
    job = httpx.get(f"{served['server'].url}/v1/jobs/{job_id}").json()
    assert job["summary"]["check"]["passed"] is True
    assert [f["name"] for f in job["data_files"]] == ["decoder.onnx.data"]
    # sent through /v1/uploads in chunks (a 2 GiB body would pass max_upload_bytes)
    assert re.search(r"uploading decoder\.onnx\.data: (2\.\d\d GiB) of \1 \(100%\)", served["log"])
    assert list(job["links"]["model_data"]) == [data.name]


def _logits(path: Path) -> np.ndarray:
    return decoder_logits(path, length=5, padded=1, seed=1)


def test_the_fused_model_computes_what_the_original_does(served) -> None:
    assert served["code"] == 0, served["log"][-3000:]
    original = _logits(served["model"])
    np.testing.assert_allclose(_logits(served["out"]), original, **TOL)


def test_the_service_process_never_held_the_weights(served) -> None:
    peak = served["service_peak"]
    assert peak < SERVICE_PEAK, f"the service process peaked at {peak / GIB:.2f} GiB"


def test_nothing_is_left_in_the_upload_folders(served) -> None:
    uploads = served["server"].log.parent / "data" / "uploads"
    left = [p for p in uploads.rglob("*") if p.is_file()] if uploads.exists() else []
    assert left == [], left
