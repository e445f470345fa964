"""onnxruntime sessions of the models the check compares: a proto or a file on disk,
read where it lies (its external data too), with onnxruntime's own optimizations off."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path

import onnx
import onnxruntime as ort

from autofusion.fusion_core.ir import PROTOBUF_LIMIT_BYTES
from autofusion.fusion_core.validate._floor import external_folder

__all__ = ["ModelFile", "ModelSource", "edited_session", "make_session"]


@dataclass(frozen=True)
class ModelFile:
    """A model on disk, handed to onnxruntime by its path: its external data is read
    where it lies, never as a serialized copy in memory. ``graph`` is the model without
    its weights' bytes (``fusion_core.ir.weightless_proto``), for what reads only the
    graph (the inputs to generate, the outputs to compare); None: read from the file.

    onnxruntime follows the file's external-data locations: give only a file this
    process wrote or one ``fusion_core.ir.load_model`` accepted.
    """

    path: Path
    graph: onnx.ModelProto | None = field(default=None, compare=False, repr=False)

    def graph_proto(self) -> onnx.ModelProto:
        if self.graph is not None:
            return self.graph
        return onnx.load(str(self.path), load_external_data=False)


ModelSource = onnx.ModelProto | ModelFile


def make_session(
    model: ModelSource | str | os.PathLike,
    *,
    optimized: bool = False,
    threads: int = 1,
    data_folder: str | None = None,
) -> ort.InferenceSession:
    """A CPU session of ``model``: a proto (serialized, or saved to a scratch folder past
    2 GB) or a file, read from where it lies. ``data_folder``: where a proto's external
    data lies (a graph read from a file without its weights)."""
    options = ort.SessionOptions()
    if data_folder is not None:
        options.add_session_config_entry(_DATA_FOLDER_KEY, data_folder)
    options.graph_optimization_level = (
        ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        if optimized
        else ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    )
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.log_severity_level = 3
    if isinstance(model, (str, os.PathLike, ModelFile)):
        path = model.path if isinstance(model, ModelFile) else model
        return ort.InferenceSession(os.fspath(path), options, providers=["CPUExecutionProvider"])
    if model.ByteSize() <= PROTOBUF_LIMIT_BYTES:
        return ort.InferenceSession(
            model.SerializeToString(), options, providers=["CPUExecutionProvider"]
        )
    # Over 2 GB a model cannot be one protobuf: hand onnxruntime a file with its
    # weights beside it, in a folder that lives as long as the session.
    folder = tempfile.TemporaryDirectory(prefix="autofusion-")
    path = Path(folder.name) / "model.onnx"
    copy = onnx.ModelProto()
    copy.CopyFrom(model)  # saving with external data strips the tensors it writes out
    onnx.save_model(copy, path, save_as_external_data=True, location="model.onnx.data")
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    session._autofusion_folder = folder  # keeps the weights alive
    return session


# onnxruntime's session option: where the external data of a model given as bytes lies
_DATA_FOLDER_KEY = "session.model_external_initializers_file_folder_path"


def edited_session(
    source: ModelSource, edit: Callable[[onnx.ModelProto], AbstractContextManager]
) -> ort.InferenceSession:
    """A session of ``source`` with its graph edited by ``edit`` (a context manager that
    puts the graph back): a proto edited in place, or a file's graph read without its
    weights, which onnxruntime then reads from beside the file (nothing copied or written)."""
    if not isinstance(source, ModelFile):
        with edit(source):
            return make_session(source)
    graph = onnx.load(str(source.path), load_external_data=False)
    with edit(graph):
        return make_session(graph, data_folder=external_folder(source.path))
