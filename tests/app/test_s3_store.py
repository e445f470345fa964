"""The S3 artifact store against a local S3 emulator: moto's server mode, started in this
process on a free port of 127.0.0.1 (the ``s3`` fixture), spoken to over HTTP by boto3
exactly as the SeaweedFS of docker-compose.yml is.

``autofusion migrate`` creates the bucket; ``S3Store`` keeps each blob once under
``sha256/<digest>``; and a real ``autofusion serve`` with ``AUTOFUSION_ARTIFACT_STORE=s3``
runs a job whose model, fused model and report all live in the bucket, none on disk.
"""

from __future__ import annotations

import hashlib
import os
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import boto3
import httpx
import onnx
import pytest
from moto.server import ThreadedMotoServer

from autofusion.app.cli import main
from autofusion.app.core.config import Settings
from autofusion.app.services.artifacts import S3Store, make_store
from autofusion.fusion_core.testing import conv_bn_relu
from tests.serve_process import LOOPBACK, free_port, run_job, serving

REPO = Path(__file__).resolve().parents[2]
REGION = "us-east-1"


@pytest.fixture(scope="module")
def s3_endpoint() -> Iterator[str]:
    """moto's S3 server in a thread of this process, on a free port of 127.0.0.1."""
    server = ThreadedMotoServer(ip_address=LOOPBACK, port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    try:
        yield f"http://{host}:{port}"
    finally:
        server.stop()


@dataclass
class S3:
    endpoint: str
    bucket: str
    env: dict[str, str]  # the AUTOFUSION_* and AWS_* variables a process needs for it

    def client(self):
        return boto3.client("s3", endpoint_url=self.endpoint, region_name=REGION)

    def keys(self) -> set[str]:
        listed = self.client().list_objects_v2(Bucket=self.bucket)
        return {item["Key"] for item in listed.get("Contents", [])}

    def settings(self, tmp_path: Path) -> Settings:
        return Settings(
            data_dir=tmp_path / "data",
            artifact_store="s3",
            s3_bucket=self.bucket,
            s3_endpoint_url=self.endpoint,
            s3_region=REGION,
        )


@pytest.fixture
def s3(s3_endpoint: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> S3:
    """A bucket name of this test's own (not created) and the emulator's credentials:
    any pair works there. Never the machine's: no ~/.aws files, no instance metadata."""
    bucket = f"autofusion-test-{uuid.uuid4().hex[:12]}"
    env = {
        "AUTOFUSION_ARTIFACT_STORE": "s3",
        "AUTOFUSION_S3_ENDPOINT_URL": s3_endpoint,
        "AUTOFUSION_S3_BUCKET": bucket,
        "AUTOFUSION_S3_REGION": REGION,
        "AWS_ACCESS_KEY_ID": "autofusion-test",
        "AWS_SECRET_ACCESS_KEY": "autofusion-test-secret",
        "AWS_CONFIG_FILE": str(tmp_path / "no-aws-config"),
        "AWS_SHARED_CREDENTIALS_FILE": str(tmp_path / "no-aws-credentials"),
        "AWS_EC2_METADATA_DISABLED": "true",
    }
    for name in ("AWS_SESSION_TOKEN", "AWS_PROFILE", "AWS_DEFAULT_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    return S3(s3_endpoint, bucket, env)


def test_migrate_creates_the_bucket_once(s3: S3, tmp_path: Path, capsys) -> None:
    assert main(["migrate", "--data-dir", str(tmp_path / "data")]) == 0
    assert f"S3 bucket {s3.bucket!r} created" in capsys.readouterr().err
    s3.client().head_bucket(Bucket=s3.bucket)
    assert main(["migrate", "--data-dir", str(tmp_path / "data")]) == 0
    assert f"S3 bucket {s3.bucket!r} exists" in capsys.readouterr().err


def test_each_blob_is_stored_once_by_its_digest(s3: S3, tmp_path: Path) -> None:
    s3.client().create_bucket(Bucket=s3.bucket)
    store = make_store(s3.settings(tmp_path))
    assert isinstance(store, S3Store)
    data = b"\x08\x07" * 1000
    digest = hashlib.sha256(data).hexdigest()
    assert not store.exists(digest)

    assert store.put_bytes(data) == digest
    first = s3.client().head_object(Bucket=s3.bucket, Key=f"sha256/{digest}")
    source = tmp_path / "model.onnx"
    source.write_bytes(data)
    upload_file = store.client.upload_file
    store.client.upload_file = None  # already there: not uploaded again (it would raise)
    assert store.put_file(source) == digest
    store.client.upload_file = upload_file
    again = s3.client().head_object(Bucket=s3.bucket, Key=f"sha256/{digest}")
    # Refreshed in place (retention leaves a blob stored again alone), same bytes.
    assert again["LastModified"] >= first["LastModified"] and again["ContentLength"] == 2000
    assert s3.keys() == {f"sha256/{digest}"}

    assert store.exists(digest) and store.read_bytes(digest) == data
    assert store.size(digest) == len(data)
    fetched = store.fetch(digest, tmp_path / "deep" / "down" / "copy.onnx")
    assert fetched.read_bytes() == data
    other = tmp_path / "other.bin"
    other.write_bytes(b"another blob")
    assert store.put_file(other) == hashlib.sha256(b"another blob").hexdigest()
    assert len(s3.keys()) == 2
    with pytest.raises(ValueError, match="not a sha256 digest"):
        store.exists("../../etc/passwd")


def test_retention_lists_and_removes_only_blobs_stored_before_its_cutoff(
    s3: S3, tmp_path: Path
) -> None:
    """``blobs()`` lists the bucket's blobs with when each was last stored; ``delete``
    removes one stored before the cutoff and leaves one stored (or stored again) since."""
    s3.client().create_bucket(Bucket=s3.bucket)
    store = make_store(s3.settings(tmp_path))
    old, fresh = store.put_bytes(b"old blob"), store.put_bytes(b"fresh blob")
    s3.client().put_object(Bucket=s3.bucket, Key="elsewhere/not-ours", Body=b"x")
    listed = {blob.digest: blob for blob in store.blobs()}
    assert set(listed) == {old, fresh} and listed[old].size == len(b"old blob")
    assert abs(listed[old].stored_at - time.time()) < 60

    assert not store.delete(fresh, stored_before=listed[fresh].stored_at)  # not before
    assert store.delete(old, stored_before=time.time() + 5)
    assert not store.exists(old) and store.exists(fresh)
    assert not store.delete(old, stored_before=time.time() + 5)  # gone already: no error
    assert {"elsewhere/not-ours", f"sha256/{fresh}"} == s3.keys()


@pytest.mark.slow
def test_a_served_job_keeps_its_artifacts_in_the_bucket(s3: S3, tmp_path: Path) -> None:
    """As docker-compose.yml runs it, minus containers: `migrate` creates the bucket, then
    an API (its worker thread) stores the upload, the fused model and the report in S3."""
    data = tmp_path / "data"
    assert main(["migrate", "--data-dir", str(data)]) == 0
    clean = {k: v for k, v in os.environ.items() if not k.upper().startswith("AUTOFUSION_")}
    env = {**clean, **s3.env}
    log = tmp_path / "serve.log"
    cli = [
        sys.executable,
        "-c",
        "import sys; from autofusion.app.cli import main; sys.exit(main())",
    ]
    command = [*cli, "serve", "--port", free_port(), "--data-dir", data, "--log-level", "warning"]
    model = conv_bn_relu().SerializeToString()
    with (
        serving(command, env=env, cwd=REPO, log=log) as url,
        httpx.Client(base_url=url, timeout=30) as client,
    ):
        job = run_job(client, model, log=log)
        fused = client.get(f"/v1/jobs/{job['id']}/model")
        assert fused.status_code == 200
        report = client.get(f"/v1/jobs/{job['id']}/report")
        assert report.status_code == 200

    keys = s3.keys()
    for blob in (model, fused.content, report.content):
        assert f"sha256/{hashlib.sha256(blob).hexdigest()}" in keys, sorted(keys)
    assert job["model_digest"] == hashlib.sha256(model).hexdigest()
    assert "BatchNormalization" not in {
        n.op_type for n in onnx.load_from_string(fused.content).graph.node
    }
    artifacts = data / "artifacts"
    assert not artifacts.exists() or not any(artifacts.rglob("*")), "a blob went to local disk"
