"""The deployment files: docker-compose.yml, Dockerfile, .dockerignore.

Structural checks always run (PyYAML): the services distributed mode needs, a worker that
scales, a Redis that never evicts queued jobs, one-shot migrations before the API and
the workers, a maintained S3 server whose credentials and port the services agree on,
pinned images, settings that exist, commands the CLI accepts; an image built in two
stages that installs the wheel (never an editable install of a source tree), non-root,
without torch; a build context that holds what the wheel is built from. When a Compose
validator is on PATH (``docker-compose`` v1 from Debian, or ``docker compose``), the file
is also validated by it. No Docker daemon is needed (tests/test_wheel.py builds and runs
the same wheel).
"""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
import tomllib
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import yaml

from autofusion.app.cli import build_parser
from autofusion.app.core.config import Settings

REPO = Path(__file__).resolve().parents[1]
COMPOSE = REPO / "docker-compose.yml"
DOCKERFILE = REPO / "Dockerfile"
COMPLETED = "service_completed_successfully"
HEALTHY = "service_healthy"
BASE_IMAGE = "python:3.11-slim"
SOURCE_FOLDERS = ("fusion_core", "app", "worker", "migrations")


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
    assert {"api", "worker", "redis", "postgres", "s3", "migrate"} <= set(services)


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
    assert urlsplit(env["AUTOFUSION_S3_ENDPOINT_URL"]).hostname == "s3"
    assert services["migrate"].get("restart") == "no"


def test_api_requires_keys_on_all_interfaces(services):
    command = _command(services["api"])
    assert command[:2] == ["autofusion", "serve"]
    assert "--require-api-keys" in command
    assert command[command.index("--host") + 1] == "0.0.0.0"


@pytest.mark.parametrize("name", ["api", "worker", "migrate"])
def test_the_services_are_bounded(services, name):
    """Memory, processes, a read-only image, no capability beyond what starting a
    sandbox as nobody in its own network namespace takes, no new privileges."""
    service = services[name]
    assert service["mem_limit"] and service["pids_limit"] > 0
    assert service["read_only"] is True and "/tmp" in service["tmpfs"]
    assert service["cap_drop"] == ["ALL"]
    assert set(service["cap_add"]) <= {
        "CHOWN",
        "DAC_OVERRIDE",
        "FOWNER",
        "SETUID",
        "SETGID",
        "KILL",
        "SYS_ADMIN",
    }
    assert "no-new-privileges:true" in service["security_opt"]
    # Root in the container only to start sandboxes as the (default) sandbox user.
    assert service["user"] == "0:0"
    assert "AUTOFUSION_SANDBOX_USER" not in service["environment"]


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


def _stages() -> list[list[tuple[str, str]]]:
    """The Dockerfile's stages, each its instructions from its FROM on."""
    stages: list[list[tuple[str, str]]] = []
    for kind, arg in _instructions():
        if kind == "FROM":
            stages.append([])
        stages[-1].append((kind, arg))
    return stages


def _runs(stage: list[tuple[str, str]]) -> str:
    return " ".join(arg for kind, arg in stage if kind == "RUN")


def test_dockerfile():
    steps = _instructions()
    assert steps[0][0] == "FROM" and steps[0][1].split()[0] == BASE_IMAGE
    users = [arg.strip() for kind, arg in steps if kind == "USER"]
    assert users and users[-1].split(":")[0] not in ("root", "0")
    assert not [arg for _, arg in steps if "torch" in arg], "torch is no runtime dependency"
    health = " ".join(arg for kind, arg in steps if kind == "HEALTHCHECK")
    assert "/healthz" in health
    cmd = [arg for kind, arg in steps if kind == "CMD"][-1]
    assert '"autofusion", "serve"' in cmd


def test_the_image_installs_the_wheel_built_in_its_first_stage():
    """Build the wheel in one stage, install it in the next as a user would: what runs is
    what the wheel ships, never a source tree beside an editable install."""
    build, final = _stages()
    assert build[0][1].split() == [BASE_IMAGE, "AS", "build"]
    assert final[0][1].split() == [BASE_IMAGE], "the same Python builds and runs the wheel"
    assert "pip wheel --no-deps --wheel-dir /wheels ." in _runs(build)

    text = DOCKERFILE.read_text(encoding="utf-8")
    assert not re.search(r"pip install[^\n]*\s(-e|--editable)\s", text), "no editable install"
    copies = [arg.split() for kind, arg in final if kind == "COPY"]
    assert ["--from=build", "/wheels", "/tmp/wheels"] in copies
    copied = {part.rstrip("/") for args in copies for part in args[:-1]}
    assert not copied & set(SOURCE_FOLDERS), "the final stage gets the wheel, not the source"
    runs = _runs(final)
    assert "pip install --no-deps /tmp/wheels/autofusion-*.whl" in runs
    assert "pip check" in runs
    # The dependencies are a layer of their own, read from pyproject.toml alone.
    assert runs.index("pip install -r /tmp/requirements.txt") < runs.index("/tmp/wheels")


def test_every_package_folder_is_listed_for_the_wheel():
    """setuptools cannot discover packages under the ``autofusion`` prefix, so pyproject.toml
    lists them: a new package folder that is not listed would be missing from the wheel."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))
    listed = set(project["tool"]["setuptools"]["packages"])
    folders = {
        "autofusion." + ".".join(init.parent.relative_to(REPO).parts)
        for folder in SOURCE_FOLDERS
        for init in (REPO / folder).rglob("__init__.py")
        if "__pycache__" not in init.parts
    }
    assert listed == folders, (
        f"add to [tool.setuptools] packages: {sorted(folders - listed)}; "
        f"drop: {sorted(listed - folders)}"
    )


def _allowed() -> set[str]:
    lines = (REPO / ".dockerignore").read_text(encoding="utf-8").splitlines()
    return {line.strip()[1:] for line in lines if line.strip().startswith("!")}


def test_the_build_context_holds_what_the_wheel_is_built_from():
    """Every package pyproject.toml ships, its readme and itself are let into the build
    context and copied into the build stage; nothing else is."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))
    mapped = project["tool"]["setuptools"]["package-dir"]
    assert mapped == {"autofusion": "."}
    listed = project["tool"]["setuptools"]["packages"]
    packages = {name.split(".")[1] for name in listed}
    assert packages == set(SOURCE_FOLDERS)
    needed = packages | {"pyproject.toml", project["project"]["readme"]}
    assert _allowed() == needed
    build = _stages()[0]
    copied = {
        part.rstrip("/")
        for kind, arg in build
        if kind == "COPY"
        for part in arg.split()[:-1]
        if not part.startswith("--")
    }
    assert copied == needed


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


# ----- the S3 store ------------------------------------------------------------------------


def test_the_s3_store_is_a_maintained_server_the_services_agree_with(services):
    """SeaweedFS, not MinIO (whose community images are no longer published): its port,
    credentials and health check match what the autofusion services use, and `migrate`
    (which creates the bucket) waits for it to be healthy."""
    s3 = services["s3"]
    image = s3["image"]
    assert not image.startswith("minio/") and image.startswith("chrislusf/seaweedfs:")
    command = _command(s3)
    assert command[:2] == ["server", "-s3"]
    ports = [arg.split("=", 1)[1] for arg in command if arg.startswith("-s3.port=")]
    port = int(ports[-1]) if ports else 8333
    for name in ("migrate", "api", "worker"):
        env = services[name]["environment"]
        endpoint = urlsplit(env["AUTOFUSION_S3_ENDPOINT_URL"])
        assert (endpoint.hostname, endpoint.port) == ("s3", port), name
        for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
            assert env[key] == s3["environment"][key], f"{name}: {key} differs from s3's"
    assert services["migrate"]["depends_on"]["s3"]["condition"] == HEALTHY
    assert f"127.0.0.1:{port}/healthz" in " ".join(s3["healthcheck"]["test"])
    assert any(volume.endswith(":/data") for volume in s3["volumes"])
    assert "MINIO" not in COMPOSE.read_text(encoding="utf-8")  # no variable left behind


def test_images_are_pinned(services):
    """A release tag on every image pulled (never `latest` or none): an upgrade of the
    store or the database is a reviewed change of this file."""
    for name, service in services.items():
        if "build" in service:
            continue
        image = service["image"]
        repository, _, tag = image.rpartition(":")
        assert repository and tag and tag != "latest" and "/" not in tag, f"{name}: {image}"
