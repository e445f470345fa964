"""The deployment files: docker-compose.yml, Dockerfile, .dockerignore.

Structural checks always run (PyYAML): the services distributed mode needs, a worker that
scales, a Redis that never evicts queued jobs, one-shot migrations before the API and
the workers, settings that exist, commands the CLI accepts, a non-root image without
torch. When a Compose validator is on PATH (``docker-compose`` v1 from Debian, or
``docker compose``), the file is also validated by it.
"""

from __future__ import annotations

import shlex
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from app.cli import build_parser
from app.core.config import Settings

REPO = Path(__file__).resolve().parents[1]
COMPOSE = REPO / "docker-compose.yml"
DOCKERFILE = REPO / "Dockerfile"
COMPLETED = "service_completed_successfully"


@pytest.fixture(scope="module")
def compose() -> dict:
    return yaml.safe_load(COMPOSE.read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def services(compose) -> dict:
    return compose["services"]


def _command(service: dict) -> list[str]:
    command = service.get("command", [])
    return shlex.split(command) if isinstance(command, str) else [str(c) for c in command]


def test_distributed_services_exist(services):
    assert {"api", "worker", "redis", "postgres", "minio", "migrate"} <= set(services)


def test_worker_scales(services):
    worker = services["worker"]
    assert "container_name" not in worker
    assert "ports" not in worker
    assert _command(worker)[:2] == ["autofusion", "worker"]


def test_redis_never_evicts_and_persists(services):
    command = " ".join(_command(services["redis"]))
    assert "--maxmemory-policy noeviction" in command
    assert "--appendonly yes" in command
    assert services["redis"].get("volumes")


def test_postgres_has_volume_and_healthcheck(services):
    postgres = services["postgres"]
    assert any(":/var/lib/postgresql/data" in v for v in postgres["volumes"])
    assert "pg_isready" in " ".join(postgres["healthcheck"]["test"])


@pytest.mark.parametrize("name", ["api", "worker"])
def test_migrations_run_once_before(services, name):
    depends = services[name]["depends_on"]
    assert depends["migrate"]["condition"] == COMPLETED
    env = services[name]["environment"]
    assert str(env["AUTOFUSION_MIGRATE_ON_START"]).lower() == "false"
    assert env["AUTOFUSION_BROKER_URL"].startswith("redis://")
    assert env["AUTOFUSION_DATABASE_URL"].startswith("postgresql")
    assert env["AUTOFUSION_ARTIFACT_STORE"] == "s3"
    assert env["AUTOFUSION_S3_ENDPOINT_URL"].startswith("http://minio:")
    assert services["migrate"].get("restart") == "no"


def test_api_requires_keys_on_all_interfaces(services):
    command = _command(services["api"])
    assert command[:2] == ["autofusion", "serve"]
    assert "--require-api-keys" in command
    assert command[command.index("--host") + 1] == "0.0.0.0"


def test_environment_names_are_settings(services):
    """A misspelt AUTOFUSION_* variable would be silently ignored: catch it here."""
    known = {f"AUTOFUSION_{name.upper()}" for name in Settings.model_fields}
    for name, service in services.items():
        env = service.get("environment") or {}
        unknown = {key for key in env if key.startswith("AUTOFUSION_")} - known
        assert not unknown, f"service {name}: not Settings fields: {sorted(unknown)}"


def test_commands_parse(services):
    """Every `autofusion ...` command in the file is one the CLI accepts."""
    parser = build_parser()
    for name, service in services.items():
        command = _command(service)
        if command[:1] == ["autofusion"]:
            try:
                parser.parse_args(command[1:])
            except SystemExit:
                pytest.fail(f"service {name}: the CLI rejects {shlex.join(command)}")


def _validator() -> list[str] | None:
    if shutil.which("docker-compose"):
        return ["docker-compose"]
    docker = shutil.which("docker")
    if (
        docker
        and subprocess.run([docker, "compose", "version"], capture_output=True).returncode == 0
    ):
        return [docker, "compose"]
    return None


def test_compose_validator_accepts_the_file():
    validator = _validator()
    if validator is None:
        pytest.skip("no Compose validator on PATH (apt-get install docker-compose)")
    result = subprocess.run(
        [*validator, "-f", str(COMPOSE), "config", "--quiet"],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr


def _instructions() -> list[tuple[str, str]]:
    text = DOCKERFILE.read_text(encoding="utf-8").replace("\\\n", " ")
    lines = [line.strip() for line in text.splitlines()]
    return [
        (line.split(None, 1)[0].upper(), line.split(None, 1)[1])
        for line in lines
        if line and not line.startswith("#")
    ]


def test_dockerfile():
    steps = _instructions()
    assert steps[0] == ("FROM", "python:3.11-slim")
    users = [arg.strip() for kind, arg in steps if kind == "USER"]
    assert users and users[-1].split(":")[0] not in ("root", "0")
    assert not [arg for _, arg in steps if "torch" in arg], "torch is no runtime dependency"
    health = " ".join(arg for kind, arg in steps if kind == "HEALTHCHECK")
    assert "/healthz" in health
    cmd = [arg for kind, arg in steps if kind == "CMD"][-1]
    assert '"autofusion", "serve"' in cmd


def test_dockerignore_keeps_local_state_out():
    lines = (REPO / ".dockerignore").read_text(encoding="utf-8").splitlines()
    rules = [line.strip() for line in lines if line.strip() and not line.startswith("#")]
    # A whitelist: everything is out, then only the project itself comes back in.
    assert rules[0] == "*"
    allowed = {rule[1:] for rule in rules if rule.startswith("!")}
    assert {"pyproject.toml", "app", "worker", "fusion_core", "migrations"} <= allowed
    assert not allowed & {".venv", "data", "tests", ".git"}


def test_service_docs_list_every_setting():
    """docs/service.md has a row for each AUTOFUSION_* variable Settings reads."""
    text = (REPO / "docs" / "service.md").read_text(encoding="utf-8")
    missing = [
        f"AUTOFUSION_{name.upper()}"
        for name in Settings.model_fields
        if f"| `AUTOFUSION_{name.upper()}` |" not in text
    ]
    assert not missing, f"add to the settings table of docs/service.md: {missing}"
