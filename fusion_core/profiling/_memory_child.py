"""The child process ``fusion_core.profiling.footprint.measure_memory`` starts, one per model:
``python -P _memory_child.py REQUEST_JSON``; it prints one JSON line.

It imports the standard library, numpy and onnxruntime only, never ``fusion_core``
(whose imports take seconds and would sit in the baseline), and is run by its path
with ``-P`` so that this folder's modules (``profile.py``...) cannot shadow the
standard library's.

What it measures, in bytes:

* ``baseline_bytes``: the resident memory (VmRSS) once Python, numpy, onnxruntime and
  the inputs are loaded, just before the session;
* ``session_bytes``: the peak resident memory (VmHWM) while the session is created,
  less the baseline: the model read, weights copied and pre-packed, the arena;
* ``peak_bytes``: the peak over session creation and ``runs`` runs, less the baseline;
* ``resident_bytes``: what is still resident after the runs, less the baseline (what a
  server holds while the session lives).

On Linux the peak is reset to the current resident memory just before the session
(``/proc/self/clear_refs``), so an import's transient peak does not hide the session's.
Where that is not possible the peak comes from ``getrusage``'s ``ru_maxrss``, which
cannot be reset: the increase over the peak so far is a lower bound (``method`` says
which).
"""

from __future__ import annotations

import json
import re
import resource
import sys
from pathlib import Path

_STATUS = Path("/proc/self/status")
_CLEAR_REFS = Path("/proc/self/clear_refs")


def main(argv: list[str]) -> int:
    try:
        request = json.loads(argv[1])
        result = measure(**request)
    except Exception as exc:  # reported to the parent as data; it decides what to say
        print(json.dumps({"error": f"{type(exc).__name__}: {exc}"}), flush=True)
        return 1
    print(json.dumps(result), flush=True)
    return 0


def measure(
    *,
    model: str,
    feeds: dict[str, str],
    level: str,
    threads: int,
    providers: list[str],
    runs: int,
) -> dict:
    import numpy as np
    import onnxruntime as ort

    inputs = {name: np.load(path, allow_pickle=False) for name, path in feeds.items()}
    options = ort.SessionOptions()
    options.graph_optimization_level = getattr(ort.GraphOptimizationLevel, level)
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    options.log_severity_level = 3
    exact = _reset_peak()
    baseline = _status_bytes("VmRSS") if exact else _maxrss_bytes()
    session = ort.InferenceSession(model, options, providers=providers)
    created = _peak_bytes(exact)
    feed = {i.name: inputs[i.name] for i in session.get_inputs() if i.name in inputs}
    for _ in range(runs):
        session.run(None, feed)
    peak = _peak_bytes(exact)
    resident = _status_bytes("VmRSS") if _STATUS.exists() else None
    return {
        "method": "VmHWM" if exact else "ru_maxrss",
        "baseline_bytes": baseline,
        "session_bytes": max(created - baseline, 0),
        "peak_bytes": max(peak - baseline, 0),
        "resident_bytes": max(resident - baseline, 0) if resident is not None else None,
    }


def _reset_peak() -> bool:
    """Reset VmHWM to the current VmRSS (Linux 4.0+); False where that is not possible."""
    try:
        _CLEAR_REFS.write_text("5")
        _status_bytes("VmHWM")
    except (OSError, ValueError):
        return False
    return True


def _peak_bytes(exact: bool) -> int:
    return _status_bytes("VmHWM") if exact else _maxrss_bytes()


def _status_bytes(field: str) -> int:
    found = re.search(rf"^{field}:\s+(\d+) kB", _STATUS.read_text(), re.MULTILINE)
    if found is None:
        raise ValueError(f"no {field} in {_STATUS}")
    return int(found.group(1)) * 1024


def _maxrss_bytes() -> int:
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024  # kB everywhere but macOS


if __name__ == "__main__":
    sys.exit(main(sys.argv))
