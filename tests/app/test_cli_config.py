"""`autofusion config show` (issue 27, item 5): the effective settings, secrets masked."""

from __future__ import annotations

import json
import os

import pytest

from autofusion.app.cli import main
from autofusion.app.cli._exit import EXIT_OK, EXIT_USAGE


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch, tmp_path):
    for name in os.environ.copy():
        if name.upper().startswith("AUTOFUSION_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("AUTOFUSION_ENV_FILE", "")
    monkeypatch.setenv("AUTOFUSION_SECRETS_DIR", "")
    monkeypatch.chdir(tmp_path)


def _show(capsys, *args: str) -> tuple[int, str, str]:
    code = main(["config", "show", *args])
    out, err = capsys.readouterr()
    return code, out, err


def test_show_marks_defaults_and_masks_secrets(capsys, monkeypatch):
    monkeypatch.setenv("AUTOFUSION_DATABASE_URL", "postgresql+psycopg://ci:hunter2@db:5432/af")
    monkeypatch.setenv("AUTOFUSION_JOB_TIME_LIMIT_S", "120")
    code, out, _ = _show(capsys)
    assert code == EXIT_OK
    assert "hunter2" not in out
    lines = out.splitlines()
    assert "AUTOFUSION_DATABASE_URL=**********" in lines
    assert "AUTOFUSION_JOB_TIME_LIMIT_S=120" in lines  # set: not marked
    assert "AUTOFUSION_LEASE_S=60  # default" in lines
    assert "# database: postgresql+psycopg://ci:***@db:5432/af" in lines


def test_show_json_is_one_object(capsys, monkeypatch):
    monkeypatch.setenv("AUTOFUSION_S3_SECRET_ACCESS_KEY", "very-secret")
    code, out, _ = _show(capsys, "--json")
    shown = json.loads(out)
    assert code == EXIT_OK and "very-secret" not in out
    assert shown["settings"]["AUTOFUSION_S3_SECRET_ACCESS_KEY"] == "**********"
    assert "AUTOFUSION_S3_SECRET_ACCESS_KEY" not in shown["defaults"]
    assert "AUTOFUSION_DATA_DIR" in shown["defaults"]
    assert shown["broker"] == "filesystem://"


def test_an_invalid_setting_exits_usage_naming_it(capsys, monkeypatch):
    monkeypatch.setenv("AUTOFUSION_JOB_TIME_LIMIT_S", "soon")
    code, out, err = _show(capsys)
    assert code == EXIT_USAGE and out == ""
    assert "job_time_limit_s" in err and "soon" not in err
