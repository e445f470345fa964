"""Measuring on onnxruntime: latency, paired ratios, traces, per-node times, memory.

``latency.py`` times and profiles the original and the fused model; ``stats.py`` the
paired ratio and its verdict; ``_paired.py`` the paired timer that measured selection
decides with; ``_trace.py`` sessions and onnxruntime's profiler trace;
``footprint.py`` file size and peak memory (in a child process, ``_memory_child.py``);
``cpus.py`` how many CPUs this process may use (its affinity and its cgroup's
quota); ``verdicts.py`` what measured selection learned: a region's paired ratio on a machine
class, its file format and how measurements combine.

The names load on first use (``lazy_loader``): ``stats`` (the verdicts a report
reader names) and ``verdicts`` (which the service's API reads) need no onnxruntime.
"""

import lazy_loader

__getattr__, __dir__, __all__ = lazy_loader.attach(
    __name__,
    submod_attrs={
        "_paired": ["PairedTimer"],
        "cpus": ["usable_cpus"],
        "_trace": ["inputs_for", "make_session", "prepare_model", "session_options"],
        "footprint": [
            "MEMORY_LEVEL",
            "MEMORY_RUNS",
            "MemoryComparison",
            "ModelSize",
            "ProcessMemory",
            "measure_memory",
            "model_size",
            "serialized_size",
        ],
        "latency": [
            "LEVELS",
            "LatencyComparison",
            "MemoryStats",
            "NodeProfile",
            "NodeTime",
            "OpTypeTime",
            "PatternTime",
            "ProfileOptions",
            "ProfileReport",
            "RegionTime",
            "SessionLatency",
            "interleaved_ms",
            "measure_latency",
            "parse_trace",
            "pattern_times",
            "profile_models",
            "profile_nodes",
            "read_trace",
            "region_times",
            "write_trace",
        ],
        "stats": [
            "CONFIDENCE",
            "FASTER",
            "MARGIN",
            "NO_CHANGE",
            "SLOWER",
            "VERDICTS",
            "PairedRatio",
            "paired_ratio",
            "verdict_of",
        ],
    },
)
