"""Inputs the user supplies instead of random ones, checked against the model.

Two layouts are read:

- an ONNX test-data folder: ``input_0.pb``, ``input_1.pb``, ... (serialized
  ``TensorProto``; ``output_*.pb`` beside them are ignored) is one sample; a folder of
  ``test_data_set_0/``, ``test_data_set_1/``, ... folders is one sample per folder.
  A tensor is named by ``TensorProto.name``, or, when that is empty, by its file's
  number as the position among the model's non-initializer inputs.
- a ``.npz`` file (``numpy.savez``): one sample, keys are input names.

Every sample must give each input exactly once, with the model's element type and rank
and with its fixed dimensions; anything else is a ConfigError that says what to change.
"""

from __future__ import annotations

import os
import re
import zipfile
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import onnx
from google.protobuf.message import DecodeError

from autofusion.fusion_core.errors import ConfigError
from autofusion.fusion_core.validate._inputs import InputSpec, describe_inputs

__all__ = ["check_feeds", "load_inputs"]

_INPUT_FILE = re.compile(r"input_(\d+)\.pb")
_DATA_SET = re.compile(r"test_data_set_(\d+)")
_LAYOUTS = (
    "give a .npz file (numpy.savez, keys = input names), a folder with input_0.pb, "
    "input_1.pb, ... or a folder of test_data_set_0/, test_data_set_1/, ... folders"
)


def load_inputs(path: str | os.PathLike, model: onnx.ModelProto) -> list[dict[str, np.ndarray]]:
    """The samples stored at ``path``, each checked with ``check_feeds``."""
    path = Path(path)
    specs = describe_inputs(model)
    if path.is_file() and path.suffix == ".npz":
        samples = [_read_npz(path)]
    elif path.is_dir():
        samples = [_read_pb_folder(folder, specs) for folder in _sample_folders(path)]
    elif not path.exists():
        raise ConfigError(f"inputs {str(path)!r} do not exist", hint=_LAYOUTS)
    else:
        raise ConfigError(f"cannot read inputs from {str(path)!r}", hint=_LAYOUTS)
    for index, sample in enumerate(samples):
        check_feeds(sample, model, where=f"sample {index} ({path})")
    return samples


def check_feeds(
    feeds: Mapping[str, np.ndarray], model: onnx.ModelProto, *, where: str = "inputs"
) -> None:
    """Raise ConfigError unless ``feeds`` gives every model input once, rightly typed."""
    specs = {s.name: s for s in describe_inputs(model)}
    unknown = sorted(set(feeds) - set(specs))
    if unknown:
        raise ConfigError(
            f"{where}: {unknown} are not inputs of the model",
            hint=f"the model's inputs are {sorted(specs)}; rename or drop the others",
        )
    missing = sorted(set(specs) - set(feeds))
    if missing:
        raise ConfigError(
            f"{where}: no value for input(s) {missing}",
            hint="every sample must give every model input",
        )
    for name, value in feeds.items():
        _check_value(name, np.asarray(value), specs[name], where)


def _check_value(name: str, value: np.ndarray, spec: InputSpec, where: str) -> None:
    if value.dtype != spec.dtype:
        raise ConfigError(
            f"{where}: input {name!r} is {value.dtype}, the model expects {spec.dtype}",
            hint=f"convert it, e.g. numpy.asarray(value, dtype=numpy.{spec.dtype})",
        )
    expected = ["?" if not isinstance(d, int) else d for d in spec.shape]
    if value.ndim != len(spec.shape):
        raise ConfigError(
            f"{where}: input {name!r} has rank {value.ndim} (shape {list(value.shape)}), "
            f"the model expects rank {len(spec.shape)} (shape {expected})",
            hint="reshape it to the model's input shape",
        )
    for axis, (got, want) in enumerate(zip(value.shape, spec.shape, strict=True)):
        if isinstance(want, int) and got != want:
            raise ConfigError(
                f"{where}: input {name!r} has shape {list(value.shape)}, the model "
                f"expects {expected} (dimension {axis} is fixed at {want})",
                hint="give it the model's fixed dimensions",
            )


def _read_npz(path: Path) -> dict[str, np.ndarray]:
    try:
        with np.load(path, allow_pickle=False) as data:
            return {key: data[key] for key in data.files}
    except (OSError, ValueError, zipfile.BadZipFile) as exc:
        raise ConfigError(
            f"cannot read {str(path)!r} as a .npz file: {exc}",
            hint="write it with numpy.savez(path, **{input_name: array}) (no pickled objects)",
        ) from exc


def _sample_folders(path: Path) -> list[Path]:
    if any(_INPUT_FILE.fullmatch(p.name) for p in path.iterdir()):
        return [path]
    sets = [p for p in path.iterdir() if p.is_dir() and _DATA_SET.fullmatch(p.name)]
    if not sets:
        raise ConfigError(f"{str(path)!r} holds no input_N.pb files", hint=_LAYOUTS)
    return sorted(sets, key=lambda p: int(_DATA_SET.fullmatch(p.name).group(1)))


def _read_pb_folder(folder: Path, specs: list[InputSpec]) -> dict[str, np.ndarray]:
    files = sorted(
        (int(m.group(1)), p)
        for p in folder.iterdir()
        if (m := _INPUT_FILE.fullmatch(p.name)) is not None
    )
    if not files:
        raise ConfigError(f"{str(folder)!r} holds no input_N.pb files", hint=_LAYOUTS)
    sample: dict[str, np.ndarray] = {}
    for position, file in files:
        tensor = _read_tensor(file)
        name = tensor.name or _positional_name(position, specs, file)
        if name in sample:
            raise ConfigError(
                f"{str(file)!r} gives input {name!r} a second time in {str(folder)!r}",
                hint="each input_N.pb must hold a different input",
            )
        sample[name] = onnx.numpy_helper.to_array(tensor)
    return sample


def _read_tensor(file: Path) -> onnx.TensorProto:
    tensor = onnx.TensorProto()
    try:
        tensor.ParseFromString(file.read_bytes())
    except (OSError, DecodeError) as exc:
        raise ConfigError(
            f"cannot read {str(file)!r} as an ONNX TensorProto: {exc}",
            hint="write it with onnx.numpy_helper.from_array(array, name).SerializeToString()",
        ) from exc
    if not tensor.HasField("data_type") or tensor.data_type == onnx.TensorProto.UNDEFINED:
        raise ConfigError(
            f"{str(file)!r} is not an ONNX TensorProto (it has no data type)",
            hint="write it with onnx.numpy_helper.from_array(array, name).SerializeToString()",
        )
    return tensor


def _positional_name(position: int, specs: list[InputSpec], file: Path) -> str:
    if position >= len(specs):
        raise ConfigError(
            f"{str(file)!r} has no name and its number {position} is past the model's "
            f"{len(specs)} inputs",
            hint=f"name the tensor after one of {[s.name for s in specs]}",
        )
    return specs[position].name
