"""Settings come from the environment, a ``.env`` file and a secrets directory (issue
18, item 5); credentials are ``SecretStr`` and never printed (repr, validation errors,
logs, readiness answers)."""

from __future__ import annotations

import logging
import re
from pathlib import Path

import pytest
from pydantic import ValidationError

from autofusion.app.core.config import Settings, redact_url
from autofusion.app.services.health import readiness

SECRET = "hunter2"
DB_URL = f"postgresql+psycopg://autofusion:{SECRET}@127.0.0.1:1/autofusion"


@pytest.fixture(autouse=True)
def _no_ambient_sources(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """No .env of the checkout and no /run/secrets of the machine in these tests."""
    for name in ("AUTOFUSION_ENV_FILE", "AUTOFUSION_SECRETS_DIR", "AUTOFUSION_DATABASE_URL"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("AUTOFUSION_SECRETS_DIR", "")


def test_a_dotenv_file_is_read_and_the_environment_wins(monkeypatch, tmp_path):
    (tmp_path / ".env").write_text(
        f"AUTOFUSION_DATABASE_URL={DB_URL}\nAUTOFUSION_LEASE_S=42\nAUTOFUSION_MAX_ATTEMPTS=5\n"
    )
    monkeypatch.setenv("AUTOFUSION_MAX_ATTEMPTS", "7")
    settings = Settings()
    assert settings.resolved_database_url == DB_URL
    assert settings.lease_s == 42 and settings.max_attempts == 7  # environment over .env
    other = tmp_path / "elsewhere.env"
    other.write_text("AUTOFUSION_LEASE_S=43\n")
    monkeypatch.setenv("AUTOFUSION_ENV_FILE", str(other))
    assert Settings().lease_s == 43
    assert Settings(lease_s=44).lease_s == 44  # a flag over everything


def test_a_secrets_directory_holds_one_file_per_setting(monkeypatch, tmp_path):
    secrets = tmp_path / "secrets"
    secrets.mkdir()
    (secrets / "autofusion_database_url").write_text(DB_URL)
    (secrets / "autofusion_s3_access_key_id").write_text("AKIAEXAMPLE")
    (secrets / "autofusion_s3_secret_access_key").write_text(SECRET)
    (secrets / "autofusion_lease_s").write_text("30")
    monkeypatch.setenv("AUTOFUSION_SECRETS_DIR", str(secrets))
    monkeypatch.setenv("AUTOFUSION_LEASE_S", "31")
    settings = Settings()
    assert settings.resolved_database_url == DB_URL
    assert settings.lease_s == 31  # the environment over the secrets directory
    options = settings.s3_client_options()
    assert options["aws_access_key_id"] == "AKIAEXAMPLE"
    assert options["aws_secret_access_key"] == SECRET
    # A sandboxed child reads neither source.
    assert Settings(_env_file=None, _secrets_dir=None).database_url.get_secret_value() == ""


def test_credentials_are_never_printed(monkeypatch):
    settings = Settings(
        database_url=DB_URL,
        broker_url=f"redis://:{SECRET}@127.0.0.1:1/0",
        s3_secret_access_key=SECRET,
    )
    for text in (repr(settings), str(settings), settings.model_dump_json()):
        assert SECRET not in text
    assert settings.resolved_broker_url.endswith("@127.0.0.1:1/0")
    # A validation error names the setting, never the inputs (which hold the URLs).
    monkeypatch.setenv("AUTOFUSION_DATABASE_URL", DB_URL)
    with pytest.raises(ValidationError) as caught:
        Settings(visibility_timeout_s=5)
    assert "visibility_timeout_s" in str(caught.value) and SECRET not in str(caught.value)


def test_redact_url():
    assert redact_url(DB_URL) == "postgresql+psycopg://autofusion:***@127.0.0.1:1/autofusion"
    assert redact_url("redis://:pw@r:6379/0") == "redis://:***@r:6379/0"
    assert redact_url("redis://r:6379/0") == "redis://r:6379/0"
    assert redact_url("filesystem://") == "filesystem://"


def test_readiness_failures_carry_no_credentials(caplog, tmp_path):
    settings = Settings(
        data_dir=tmp_path / "data",
        database_url=DB_URL,
        broker_url=f"redis://:{SECRET}@127.0.0.1:1/0",
    )
    with caplog.at_level(logging.DEBUG):
        results = readiness(settings)
    assert results["database"] and results["broker"]
    assert SECRET not in repr(results) and SECRET not in caplog.text


def test_readiness_asks_the_s3_bucket(monkeypatch, tmp_path):
    """Against a local S3 emulator (moto's server): ready with the bucket, 503 reasons
    naming the bucket without it or without the server."""
    server_module = pytest.importorskip("moto.server")
    import boto3

    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    server = server_module.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        host, port = server.get_host_and_port()
        settings = Settings(
            data_dir=tmp_path / "data",
            artifact_store="s3",
            s3_bucket="ready-bucket",
            s3_endpoint_url=f"http://{host}:{port}",
            s3_region="us-east-1",
            s3_access_key_id="testing",
            s3_secret_access_key=SECRET,
        )
        assert "ready-bucket" in readiness(settings)["artifacts"]  # not created yet
        boto3.client("s3", **settings.s3_client_options()).create_bucket(Bucket="ready-bucket")
        assert readiness(settings)["artifacts"] is None
    finally:
        server.stop()
    reason = readiness(settings)["artifacts"]
    assert reason.startswith("S3 bucket 'ready-bucket' unreachable") and SECRET not in reason


def test_every_setting_is_in_the_settings_table():
    """docs/service.md's settings table names every field of Settings (and the two
    variables that choose the sources)."""
    text = (Path(__file__).resolve().parents[2] / "docs" / "service.md").read_text()
    table = text[text.index("\n## Settings") :]
    table = table[: table.index("\n## ", 1)]
    first_cells = [line.split("|")[1] for line in table.splitlines() if line.startswith("| `")]
    rows = {name for cell in first_cells for name in re.findall(r"`(AUTOFUSION_\w+)`", cell)}
    wanted = {f"AUTOFUSION_{name.upper()}" for name in Settings.model_fields}
    assert wanted | {"AUTOFUSION_ENV_FILE", "AUTOFUSION_SECRETS_DIR"} <= rows, sorted(wanted - rows)
