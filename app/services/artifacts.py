"""Content-addressed artifact store: models, fused models, reports, traces by sha256.

``LocalStore`` keeps files under a directory (embedded mode, or a shared volume);
``S3Store`` uses any S3-compatible service (endpoint URL configurable) for a cluster.
Both store each blob once, however many jobs refer to it.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import tempfile
from pathlib import Path
from typing import Protocol
from urllib.parse import quote

from autofusion.app.core.config import Settings

__all__ = [
    "ArtifactStore",
    "LocalStore",
    "S3Store",
    "download_headers",
    "file_digest",
    "make_store",
    "safe_filename",
]

_CHUNK = 1 << 20
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")
_MAX_FILENAME = 150


def safe_filename(name: str, default: str = "download") -> str:
    """``name`` reduced to ``[A-Za-z0-9._-]`` (runs of anything else become ``_``), no
    leading dot, at most 150 characters: safe unquoted in a header, on any disk."""
    cleaned = _UNSAFE.sub("_", name).lstrip(".")[-_MAX_FILENAME:].strip("_") or default
    return cleaned


def download_headers(filename: str) -> dict[str, str]:
    """Headers of every stored file sent to a client: a download (``attachment``, so a
    browser never renders a job's HTML in the service's origin), never content-sniffed.
    ``filename`` (the user's file name, any characters) is sanitized for the plain
    parameter and percent-encoded (RFC 6266 / 8187) for ``filename*``."""
    plain = safe_filename(filename)
    encoded = quote("".join(c for c in filename if c.isprintable())[-_MAX_FILENAME:], safe="")
    disposition = f'attachment; filename="{plain}"'
    if encoded and encoded != plain:
        disposition += f"; filename*=UTF-8''{encoded}"
    return {"Content-Disposition": disposition, "X-Content-Type-Options": "nosniff"}


def file_digest(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


class ArtifactStore(Protocol):
    def put_file(self, path: Path) -> str:
        """Store a file, return its sha256."""

    def put_bytes(self, data: bytes) -> str: ...

    def fetch(self, digest: str, destination: Path) -> Path:
        """Copy the blob to ``destination`` and return it."""

    def read_bytes(self, digest: str) -> bytes: ...

    def size(self, digest: str) -> int:
        """The blob's length in bytes (a ``HEAD`` answers it without reading the blob)."""

    def exists(self, digest: str) -> bool: ...


def _check_digest(digest: str) -> str:
    if len(digest) != 64 or any(c not in "0123456789abcdef" for c in digest):
        raise ValueError(f"{digest!r} is not a sha256 digest")
    return digest


class LocalStore:
    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)

    def _path(self, digest: str) -> Path:
        _check_digest(digest)
        return self.root / digest[:2] / digest

    def put_file(self, path: Path) -> str:
        digest = file_digest(path)
        target = self._path(digest)
        if not target.exists():
            target.parent.mkdir(parents=True, exist_ok=True)
            # Copy to a temporary name, then rename: readers never see half a blob.
            fd, tmp = tempfile.mkstemp(dir=target.parent)
            os.close(fd)
            shutil.copyfile(path, tmp)
            os.replace(tmp, target)
        return digest

    def put_bytes(self, data: bytes) -> str:
        with tempfile.NamedTemporaryFile(dir=self.root, delete=False) as f:
            f.write(data)
        try:
            return self.put_file(Path(f.name))
        finally:
            os.unlink(f.name)

    def fetch(self, digest: str, destination: Path) -> Path:
        destination.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(self._path(digest), destination)
        return destination

    def read_bytes(self, digest: str) -> bytes:
        return self._path(digest).read_bytes()

    def size(self, digest: str) -> int:
        return self._path(digest).stat().st_size

    def exists(self, digest: str) -> bool:
        return self._path(digest).exists()


class S3Store:
    def __init__(
        self, bucket: str, endpoint_url: str | None, region: str | None, **credentials: str
    ) -> None:
        import boto3  # only a cluster needs it at run time

        self.bucket = bucket
        self.client = boto3.client(
            "s3", endpoint_url=endpoint_url, region_name=region, **credentials
        )

    @staticmethod
    def _key(digest: str) -> str:
        return f"sha256/{_check_digest(digest)}"

    def put_file(self, path: Path) -> str:
        digest = file_digest(path)
        if not self.exists(digest):
            self.client.upload_file(str(path), self.bucket, self._key(digest))
        return digest

    def put_bytes(self, data: bytes) -> str:
        digest = hashlib.sha256(data).hexdigest()
        if not self.exists(digest):
            self.client.put_object(Bucket=self.bucket, Key=self._key(digest), Body=data)
        return digest

    def fetch(self, digest: str, destination: Path) -> Path:
        destination.parent.mkdir(parents=True, exist_ok=True)
        self.client.download_file(self.bucket, self._key(digest), str(destination))
        return destination

    def read_bytes(self, digest: str) -> bytes:
        return self.client.get_object(Bucket=self.bucket, Key=self._key(digest))["Body"].read()

    def size(self, digest: str) -> int:
        head = self.client.head_object(Bucket=self.bucket, Key=self._key(digest))
        return int(head["ContentLength"])

    def exists(self, digest: str) -> bool:
        try:
            self.client.head_object(Bucket=self.bucket, Key=self._key(digest))
        except self.client.exceptions.ClientError:
            return False
        return True


def make_store(settings: Settings) -> ArtifactStore:
    if settings.artifact_store == "s3":
        options = settings.s3_client_options()
        return S3Store(
            settings.s3_bucket, options.pop("endpoint_url"), options.pop("region_name"), **options
        )
    return LocalStore(settings.artifacts_dir)
