"""The fused model as files: the model and, when its weights went to a data file (it
came with one, or it is over 2 GB), each data file beside it under the name the model's
external-data entries give (the job's ``links.model_data``: name -> URL). The typed
client's ``download``/``model_files`` and the CLI's ``submit -o`` and ``jobs download``
write them through ``download_model_files``."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from autofusion.app.client._errors import AutofusionError

__all__ = ["download_model_files", "model_data_links"]


def model_data_links(job: Mapping[str, Any]) -> dict[str, str]:
    """The job resource's ``links.model_data`` (empty from a server that has none)."""
    links = job.get("links") if isinstance(job.get("links"), Mapping) else {}
    data = links.get("model_data") if isinstance(links.get("model_data"), Mapping) else {}
    return {str(name): str(url) for name, url in data.items()}


def download_model_files(
    download: Callable[[str, Path], None],
    model_url: str,
    model_data: Mapping[str, str],
    destination: Path,
) -> list[Path]:
    """Write the model to ``destination`` and its data files beside it (``download``
    writes one URL to one path, whole or not at all); returns the files written. A data
    file's name is a plain file name: one the server gave otherwise is refused before
    anything is written."""
    for name in model_data:
        if not name or name in (".", "..") or Path(name).name != name or "\\" in name:
            raise AutofusionError(
                f"the server named a data file {name!r}, not a plain file name: refusing to "
                "write outside the model's folder"
            )
    download(model_url, destination)
    written = [destination]
    for name, url in sorted(model_data.items()):
        download(url, destination.parent / name)
        written.append(destination.parent / name)
    return written
