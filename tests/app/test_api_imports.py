"""What the API process imports: no worker, no runtime, no pipeline. The API never does
model work (docs/architecture.md), so serving a request loads none of the code that does:
it publishes jobs by task name (``app.core.queue``). Checked in a fresh interpreter's
``sys.modules`` after ``create_app`` has started (its lifespan) and answered a request.

Not even ``onnx``: the registry syncs and compiles the built-in patterns at start, and the
pattern engine reads onnx's operator schemas only when it matches a node. An upload's
structural checks run in a sandboxed child (``app.services.model_work``), never here.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import onnx
from onnx import TensorProto, helper

REPO = Path(__file__).resolve().parents[2]
# Modules of model work: the runtime, the optimizer, the engine's running stages, the worker.
MODEL_WORK = (
    "onnx",
    "onnxruntime",
    "onnxscript",
    "autofusion.fusion_core.pipeline",
    "autofusion.fusion_core.prepasses",
    "autofusion.fusion_core.validate",
    "autofusion.worker",
)

_PROBE = """
import json, sys
from pathlib import Path
from fastapi.testclient import TestClient
from autofusion.app.core.config import Settings
from autofusion.app.main import create_app
settings = Settings(data_dir=Path(sys.argv[1]), embedded_worker=False)
with TestClient(create_app(settings)) as client:
    code = client.get("/v1/strategies").status_code
    files = {"model": ("model.onnx", Path(sys.argv[2]).read_bytes(), "application/octet-stream")}
    accepted = client.post("/v1/optimize", files=files).status_code
    # verdicts are read, combined and imported without the pipeline (fusion_core.profiling.verdicts)
    pattern = client.get("/v1/patterns").json()["data"][0]["name"]
    empty = {"format": "autofusion-verdicts/1", "verdicts": []}
    verdicts = [
        client.get("/v1/verdicts").status_code,
        client.get("/v1/verdicts/export").status_code,
        client.post("/v1/verdicts/import", json=empty).status_code,
        client.get(f"/v1/patterns/{pattern}/verdicts").status_code,
    ]
result = {"code": code, "accepted": accepted, "verdicts": verdicts}
print("\\n" + json.dumps({**result, "modules": sorted(sys.modules)}))
"""


def test_the_api_process_loads_no_worker_and_no_runtime(tmp_path: Path) -> None:
    """Not even once it has checked an upload: the check parses in a sandbox."""
    model = tmp_path / "model.onnx"
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"])],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])],
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), model)
    done = subprocess.run(
        [sys.executable, "-c", _PROBE, str(tmp_path / "data"), str(model)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO), "HOME": str(tmp_path)},
    )
    assert done.returncode == 0, done.stderr[-4000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert (result["code"], result["accepted"]) == (200, 202)
    assert result["verdicts"] == [200, 200, 200, 200]
    loaded = sorted(
        name
        for name in result["modules"]
        if any(name == heavy or name.startswith(heavy + ".") for heavy in MODEL_WORK)
    )
    assert loaded == [], f"the API process imported {loaded}"
