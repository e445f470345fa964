"""``autofusion calibrate``: measure this machine with small onnxruntime runs (CPU) and
write a target profile (YAML) for the cost model.

- memory bandwidth: ``Add(x, 1)`` over a tensor far larger than the caches; bytes read
  plus bytes written, divided by the median time;
- launch overhead: a chain of many Adds on one element, against a chain of one; the
  time per extra node;
- peak FLOP/s: a square MatMul, ``2 n^3`` FLOPs over the median time.

Inputs and outputs are bound once (IOBinding) so allocation is not timed; graph
optimizations are off so onnxruntime runs the nodes as written. Cache sizes and memory
come from the operating system. ``--quick`` uses small sizes and few repetitions (a
few seconds; the numbers are rougher).

``--from-report R.json`` does not measure: it learns how the fused kernels run against
the roofline from profiled reports and adds those kernel factors to ``--base``
(``app/cli/_calibrate_kernels.py``). ``--from-verdicts V.json`` does the same from a
verdicts export (``autofusion verdicts export``): what measured selection measured, per
group of fusions, against what the cost model predicted for it. It assumes the base
profile's roofline prices the replaced (unfused) nodes right; the fitted correction
multiplies the factor each verdict was predicted with (its own record of it, else the
base profile's), per ``kernel_factors`` key.

Exit codes: 0 measured and written, 2 usage or option error, a report or verdicts file
that is missing or invalid or holds nothing usable, or the file cannot be written.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import platform
import re
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
import onnx.helper as oh
import onnxruntime as ort

from autofusion.app.cli._calibrate_kernels import (
    run_from_reports,
    run_from_verdicts,
    write_profile,
)
from autofusion.app.cli._exit import EXIT_OK, EXIT_USAGE
from autofusion.fusion_core.cost import (
    PROFILE_NAME_PATTERN,
    Calibration,
    TargetProfile,
)
from autofusion.fusion_core.profiling.cpus import usable_cpus

__all__ = ["Measurement", "Sizes", "add_parser", "measure", "run"]

DEFAULT_OUTPUT = "target_profile.yaml"
FALLBACK_L1 = 32 * 1024
FALLBACK_L2 = 1024 * 1024
OPSET = 17


@dataclass(frozen=True)
class Sizes:
    """How big and how often: ``copy_elements`` float32s, a ``chain``-node chain, an
    ``n x n`` MatMul, each timed ``repeats`` times after ``warmup`` runs."""

    copy_elements: int
    chain: int
    matmul_n: int
    repeats: int
    warmup: int

    @classmethod
    def for_mode(cls, quick: bool) -> Sizes:
        if quick:
            return cls(copy_elements=1 << 23, chain=100, matmul_n=384, repeats=5, warmup=1)
        return cls(copy_elements=1 << 26, chain=400, matmul_n=1024, repeats=15, warmup=3)


@dataclass(frozen=True)
class Measurement:
    memory_bandwidth_bytes_per_s: float
    launch_overhead_s: float
    peak_flops_per_s: float


def add_parser(commands: argparse._SubParsersAction) -> None:
    p = commands.add_parser("calibrate")
    p.add_argument(
        "--output", "-o", default=DEFAULT_OUTPUT, help=f"YAML file to write ({DEFAULT_OUTPUT})"
    )
    p.add_argument(
        "--threads",
        type=int,
        default=usable_cpus(),
        help="onnxruntime intra-op threads (default: every CPU this process may use)",
    )
    p.add_argument("--name", default="calibrated", help="the profile's name (calibrated)")
    p.add_argument("--quick", action="store_true", help="small sizes, few runs: a few seconds")
    p.add_argument(
        "--from-report",
        action="append",
        default=[],
        metavar="REPORT",
        help="learn kernel factors from profiled reports (optimize --profile --report) "
        "instead of measuring; repeat for several",
    )
    p.add_argument(
        "--from-verdicts",
        action="append",
        default=[],
        metavar="FILE",
        help="fit kernel factors from a verdicts export (`autofusion verdicts export`) "
        "instead of measuring: per kernel_factors key (the one that priced the group, "
        "else its rewriter), the factor that makes the cost model's predicted saving "
        "match the measured one (median over the verdicts, each clamped to 0.05..20). "
        "Assumes the --base profile prices the replaced nodes right; repeat for several "
        "files",
    )
    p.add_argument(
        "--machine-key",
        default=None,
        metavar="KEY",
        help="with --from-verdicts: only the verdicts of this machine class (their machine_key)",
    )
    p.add_argument(
        "--base",
        default="cpu",
        help="with --from-report or --from-verdicts: the profile the factors are added to "
        "(default cpu)",
    )
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    if args.threads < 1:
        sys.stderr.write("autofusion: error: --threads must be at least 1\n")
        return EXIT_USAGE
    if not re.fullmatch(PROFILE_NAME_PATTERN, args.name):
        sys.stderr.write(
            f"autofusion: error: --name {args.name!r} is not a profile name "
            "(letters, digits, '_', '.', '-')\n"
        )
        return EXIT_USAGE
    if args.from_report and args.from_verdicts:
        sys.stderr.write(
            "autofusion: error: --from-report and --from-verdicts fit the same factors: "
            "give one of them\n"
        )
        return EXIT_USAGE
    if args.from_report:
        return run_from_reports(args)
    if args.from_verdicts:
        return run_from_verdicts(args)
    sizes = Sizes.for_mode(args.quick)
    measured = measure(sizes, threads=args.threads)
    profile = _profile(args.name, measured, sizes, threads=args.threads, quick=args.quick)
    header = (
        f"Measured by `autofusion calibrate{' --quick' if args.quick else ''}` "
        f"with {args.threads} thread(s) on {platform.machine()}."
    )
    path = Path(args.output)
    if not write_profile(path, profile, header):
        return EXIT_USAGE
    print(_summary(profile, sizes, path))
    return EXIT_OK


def measure(sizes: Sizes, *, threads: int) -> Measurement:
    """Bandwidth, launch overhead and peak FLOP/s of onnxruntime's CPU provider here."""
    return Measurement(
        memory_bandwidth_bytes_per_s=_bandwidth(sizes, threads),
        launch_overhead_s=_launch_overhead(sizes, threads),
        peak_flops_per_s=_peak_flops(sizes, threads),
    )


def _bandwidth(sizes: Sizes, threads: int) -> float:
    n = sizes.copy_elements
    model = _model([oh.make_node("Add", ["x", "one"], ["y"])], {"x": [n]}, {"y": [n]}, one=1.0)
    seconds = _median_run(model, {"x": np.ones(n, np.float32)}, {"y": [n]}, sizes, threads)
    return 2 * n * 4 / seconds  # read x, write y


def _launch_overhead(sizes: Sizes, threads: int) -> float:
    def chain(length: int) -> float:
        names = ["x"] + [f"t{k}" for k in range(1, length)] + ["y"]
        nodes = [oh.make_node("Add", [names[k], "one"], [names[k + 1]]) for k in range(length)]
        model = _model(nodes, {"x": [1]}, {"y": [1]}, one=1.0)
        return _median_run(model, {"x": np.ones(1, np.float32)}, {"y": [1]}, sizes, threads)

    long, short = chain(sizes.chain), chain(1)
    # A clock tick can make the difference vanish on a fast machine: keep it positive.
    return max((long - short) / (sizes.chain - 1), 1e-9)


def _peak_flops(sizes: Sizes, threads: int) -> float:
    n = sizes.matmul_n
    model = _model([oh.make_node("MatMul", ["a", "b"], ["y"])], {"a": [n, n]}, {"y": [n, n]})
    model.graph.input.append(oh.make_tensor_value_info("b", onnx.TensorProto.FLOAT, [n, n]))
    rng = np.random.default_rng(0)
    feeds = {k: rng.standard_normal((n, n)).astype(np.float32) for k in ("a", "b")}
    seconds = _median_run(model, feeds, {"y": [n, n]}, sizes, threads)
    return 2 * n**3 / seconds


def _model(
    nodes: list[onnx.NodeProto],
    inputs: dict[str, list[int]],
    outputs: dict[str, list[int]],
    **scalars: float,
) -> onnx.ModelProto:
    float32 = onnx.TensorProto.FLOAT
    graph = oh.make_graph(
        nodes,
        "calibrate",
        [oh.make_tensor_value_info(k, float32, s) for k, s in inputs.items()],
        [oh.make_tensor_value_info(k, float32, s) for k, s in outputs.items()],
        [oh.make_tensor(k, float32, [], [v]) for k, v in scalars.items()],
    )
    return oh.make_model(graph, opset_imports=[oh.make_opsetid("", OPSET)])


def _median_run(
    model: onnx.ModelProto,
    feeds: dict[str, np.ndarray],
    outputs: dict[str, list[int]],
    sizes: Sizes,
    threads: int,
) -> float:
    """Median seconds of one run, inputs and outputs bound once."""
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(
        model.SerializeToString(), options, providers=["CPUExecutionProvider"]
    )
    binding = session.io_binding()
    for name, array in feeds.items():
        binding.bind_ortvalue_input(name, ort.OrtValue.ortvalue_from_numpy(array))
    for name, shape in outputs.items():
        binding.bind_ortvalue_output(
            name, ort.OrtValue.ortvalue_from_shape_and_type(shape, np.float32)
        )
    return _median(lambda: session.run_with_iobinding(binding), sizes)


def _median(call: Callable[[], object], sizes: Sizes) -> float:
    for _ in range(sizes.warmup):
        call()
    times = []
    for _ in range(sizes.repeats):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def _profile(
    name: str, measured: Measurement, sizes: Sizes, *, threads: int, quick: bool
) -> TargetProfile:
    l1, l2 = _cache_sizes()
    return TargetProfile(
        name=name,
        description=f"measured on this machine ({usable_cpus()} CPU(s), onnxruntime CPU)",
        memory_bandwidth_bytes_per_s=measured.memory_bandwidth_bytes_per_s,
        launch_overhead_s=measured.launch_overhead_s,
        peak_flops_per_s=measured.peak_flops_per_s,
        l1_cache_bytes=l1,
        l2_cache_bytes=l2,
        fusion_buffer_bytes=l2,  # a fused CPU kernel streams well while it stays in L2
        memory_pool_bytes=_memory_bytes(),
        # onnxruntime's CPU provider, as the shipped cpu profile: it forms slower kernels
        # from declared intermediate shapes (docs/cost.md, "What the written model declares")
        value_info="none",
        calibration=Calibration(
            threads=threads,
            repeats=sizes.repeats,
            quick=quick,
            onnxruntime=ort.__version__,
            measured_at=dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        ),
    )


def _cache_sizes() -> tuple[int, int]:
    """L1 data and L2 bytes per core, from sysconf, else sysfs, else typical values."""
    l1 = _sysconf("SC_LEVEL1_DCACHE_SIZE") or _sysfs_cache(1, "Data") or FALLBACK_L1
    l2 = _sysconf("SC_LEVEL2_CACHE_SIZE") or _sysfs_cache(2, "Unified") or FALLBACK_L2
    return l1, l2


def _sysconf(name: str) -> int | None:
    try:
        value = os.sysconf(name)
    except (ValueError, OSError):
        return None
    return value if value > 0 else None


def _sysfs_cache(level: int, kind: str) -> int | None:
    for index in sorted(Path("/sys/devices/system/cpu/cpu0/cache").glob("index*")):
        try:
            if int((index / "level").read_text()) != level:
                continue
            if (index / "type").read_text().strip() != kind:
                continue
            text = (index / "size").read_text().strip()
        except (OSError, ValueError):
            continue
        units = {"K": 1024, "M": 1024**2, "G": 1024**3}
        if text[-1:] in units and text[:-1].isdigit():
            return int(text[:-1]) * units[text[-1]]
        if text.isdigit():
            return int(text)
    return None


def _memory_bytes() -> int:
    pages, page_size = _sysconf("SC_PHYS_PAGES"), _sysconf("SC_PAGE_SIZE")
    return pages * page_size if pages and page_size else 4 * 1024**3


def _summary(profile: TargetProfile, sizes: Sizes, path: Path) -> str:
    p = profile
    return "\n".join(
        [
            f"autofusion calibrate: wrote {path}",
            f"  memory bandwidth  {p.memory_bandwidth_bytes_per_s / 1e9:10.2f} GB/s   "
            f"(Add over {sizes.copy_elements * 4 / 2**20:.0f} MiB, median of {sizes.repeats})",
            f"  launch overhead   {p.launch_overhead_s * 1e6:10.3f} us     "
            f"(per node, chain of {sizes.chain} Adds)",
            f"  peak compute      {p.peak_flops_per_s / 1e9:10.2f} GFLOP/s "
            f"(MatMul {sizes.matmul_n}x{sizes.matmul_n})",
            f"  L1 / L2 cache     {p.l1_cache_bytes // 1024} KiB / {p.l2_cache_bytes // 1024} KiB",
            f"  memory            {p.memory_pool_bytes / 2**30:.1f} GiB",
        ]
    )
