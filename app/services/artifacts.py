"""Content-addressed artifact store: models, fused models, reports, traces by sha256.

``LocalStore`` keeps files under a directory (embedded mode, or a shared volume);
``S3Store`` uses any S3-compatible service (endpoint URL configurable) for a cluster.
Both store each blob once, however many jobs refer to it.

Retention (``app/services/retention.py``) removes a blob once no job refers to it and it
was last stored ``scratch_max_age_s`` ago: storing a blob that is already there
refreshes its time (``put_file``), so a blob an upload or a finishing attempt is about
to refer to again is never taken from under it.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Protocol
from urllib.parse import quote

from autofusion.app.core.config import Settings

__all__ = [
    "ArtifactStore",
    "StoredBlob",
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


def download_headers(filename: str, disposition: str = "attachment") -> dict[str, str]:
    """Headers of every stored file sent to a client: a download (``attachment``, so a
    browser never renders a job's HTML in the service's origin), never content-sniffed.
    Only the report page is ``inline``, under a CSP that sandboxes it (job_files.py).
    ``filename`` (the user's file name, any characters) is sanitized for the plain
    parameter and percent-encoded (RFC 6266 / 8187) for ``filename*``."""
    plain = safe_filename(filename)
    encoded = quote("".join(c for c in filename if c.isprintable())[-_MAX_FILENAME:], safe="")
    disposition = f'{disposition}; filename="{plain}"'
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

    def fetch_for_reading(self, digest: str, destination: Path) -> Path:
        """The blob at ``destination``, to be read and removed, never written (a
        download's temporary file): where it can be, without a copy."""

    def read_bytes(self, digest: str) -> bytes: ...

    def size(self, digest: str) -> int:
        """The blob's length in bytes (a ``HEAD`` answers it without reading the blob)."""

    def exists(self, digest: str) -> bool: ...

    def blobs(self) -> Iterator[StoredBlob]:
        """Every blob in the store, with when it was last stored."""

    def delete(self, digest: str, *, stored_before: float) -> bool:
        """Remove the blob if it was last stored before ``stored_before`` (epoch
        seconds); whether it was removed."""


class StoredBlob:
    """A blob in a store: its digest, size, and when it was last stored (epoch seconds)."""

    __slots__ = ("digest", "size", "stored_at")

    def __init__(self, digest: str, size: int, stored_at: float) -> None:
        self.digest, self.size, self.stored_at = digest, size, stored_at


_DIGEST_CHARS = frozenset("0123456789abcdef")


def _is_digest(name: str) -> bool:
    return len(name) == 64 and not set(name) - _DIGEST_CHARS


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
        try:
            os.utime(target)  # stored again: retention leaves a fresh blob alone
            return digest
        except FileNotFoundError:
            pass
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

    def fetch_for_reading(self, digest: str, destination: Path) -> Path:
        """A hard link to the blob where ``destination`` is on the store's file system
        (a blob is never written once stored, and the link keeps its bytes while a
        download reads them, even if retention removes the blob meanwhile): a 10 GB
        data file's download starts at once, with no copy on disk. A copy elsewhere."""
        destination.parent.mkdir(parents=True, exist_ok=True)
        linked = destination.with_name(destination.name + ".link")
        try:
            os.link(self._path(digest), linked)
        except OSError:  # another file system, or links not allowed: a copy
            linked.unlink(missing_ok=True)
            return self.fetch(digest, destination)
        os.replace(linked, destination)
        return destination

    def read_bytes(self, digest: str) -> bytes:
        return self._path(digest).read_bytes()

    def size(self, digest: str) -> int:
        return self._path(digest).stat().st_size

    def exists(self, digest: str) -> bool:
        return self._path(digest).exists()

    def blobs(self) -> Iterator[StoredBlob]:
        for folder in sorted(self.root.iterdir()):
            if not folder.is_dir() or len(folder.name) != 2:
                continue
            for entry in os.scandir(folder):
                if not _is_digest(entry.name) or not entry.is_file(follow_symlinks=False):
                    continue  # a temporary file of a put in progress, or not ours
                try:
                    stat = entry.stat(follow_symlinks=False)
                except FileNotFoundError:  # removed meanwhile
                    continue
                yield StoredBlob(entry.name, stat.st_size, stat.st_mtime)

    def delete(self, digest: str, *, stored_before: float) -> bool:
        # Moved aside first, then judged: a put that refreshed the blob a moment before
        # the move shows in the moved file's time (and the blob goes back); a put after
        # the move finds no blob and stores it anew.
        path = self._path(digest)
        aside = path.with_name(f"tmp-delete-{digest}-{os.getpid()}")
        try:
            os.replace(path, aside)
        except FileNotFoundError:
            return False
        if aside.stat().st_mtime >= stored_before:
            os.replace(aside, path)
            return False
        aside.unlink()
        return True


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
        if not self._refresh(digest):
            self.client.upload_file(str(path), self.bucket, self._key(digest))
        return digest

    def put_bytes(self, data: bytes) -> str:
        digest = hashlib.sha256(data).hexdigest()
        if not self._refresh(digest):
            self.client.put_object(Bucket=self.bucket, Key=self._key(digest), Body=data)
        return digest

    def _refresh(self, digest: str) -> bool:
        """Whether the blob is there; if it is, its LastModified becomes now (a copy onto
        itself), so that retention leaves a blob stored again alone. False when it is
        not there, or cannot be refreshed (over S3's 5 GB copy limit): then the caller
        uploads it, which refreshes it as well."""
        if not self.exists(digest):
            return False
        key = self._key(digest)
        try:
            self.client.copy_object(
                Bucket=self.bucket,
                Key=key,
                CopySource={"Bucket": self.bucket, "Key": key},
                MetadataDirective="REPLACE",
            )
        except self.client.exceptions.ClientError:
            return False
        return True

    def fetch(self, digest: str, destination: Path) -> Path:
        destination.parent.mkdir(parents=True, exist_ok=True)
        self.client.download_file(self.bucket, self._key(digest), str(destination))
        return destination

    def fetch_for_reading(self, digest: str, destination: Path) -> Path:
        return self.fetch(digest, destination)

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

    def blobs(self) -> Iterator[StoredBlob]:
        pages = self.client.get_paginator("list_objects_v2")
        for page in pages.paginate(Bucket=self.bucket, Prefix="sha256/"):
            for item in page.get("Contents", []):
                digest = item["Key"].removeprefix("sha256/")
                if _is_digest(digest):
                    stored_at = item["LastModified"].timestamp()
                    yield StoredBlob(digest, int(item["Size"]), stored_at)

    def delete(self, digest: str, *, stored_before: float) -> bool:
        key = self._key(digest)
        try:  # asked again just before: a put since the listing refreshed it
            head = self.client.head_object(Bucket=self.bucket, Key=key)
        except self.client.exceptions.ClientError:
            return False
        if head["LastModified"].timestamp() >= stored_before:
            return False
        self.client.delete_object(Bucket=self.bucket, Key=key)
        return True


def make_store(settings: Settings) -> ArtifactStore:
    if settings.artifact_store == "s3":
        options = settings.s3_client_options()
        return S3Store(
            settings.s3_bucket, options.pop("endpoint_url"), options.pop("region_name"), **options
        )
    return LocalStore(settings.artifacts_dir)
