# autofusion: the API (`autofusion serve`) and the job workers (`autofusion worker`) share
# this image. docker-compose.yml runs it in distributed mode; alone it runs embedded:
#   docker build -t autofusion .
#   docker run -p 8000:8000 -v autofusion-data:/var/lib/autofusion autofusion
#   docker exec <container> autofusion keys create --tenant ci --scopes jobs:write
#
# Two stages: the first builds the wheel from the source, the second installs that wheel
# as a user would (`pip install`, no editable install, no source tree), so the image runs
# exactly what the wheel ships: the migrations and the dashboard's files included
# (tests/test_wheel.py runs the same wheel from a fresh venv).

FROM python:3.11-slim AS build

ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /src
# What the wheel is built from: the .dockerignore allow-list, nothing else.
COPY pyproject.toml README.md ./
COPY fusion_core ./fusion_core
COPY app ./app
COPY worker ./worker
COPY migrations ./migrations
RUN pip wheel --no-deps --wheel-dir /wheels .


FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    AUTOFUSION_DATA_DIR=/var/lib/autofusion

# The dependencies first, from pyproject.toml alone, so this layer survives source edits.
# The base dependencies (the client) and the server extra's, the engine's (core) with
# them, and tracing's (OpenTelemetry: off until OTEL_* settings turn it on); its own
# `autofusion[...]` lines name the extras taken here already. No test tools and no torch
# (torch is an optional extra for regenerating test models).
COPY pyproject.toml /tmp/pyproject.toml
RUN python -c "import tomllib; p = tomllib.load(open('/tmp/pyproject.toml', 'rb'))['project']; x = p['optional-dependencies']; print('\n'.join(r for r in p['dependencies'] + x['core'] + x['server'] + x['tracing'] if not r.startswith('autofusion[')))" > /tmp/requirements.txt \
    && pip install -r /tmp/requirements.txt \
    && rm /tmp/requirements.txt /tmp/pyproject.toml

# The wheel itself, then a check that what is installed fits together.
COPY --from=build /wheels /tmp/wheels
RUN pip install --no-deps /tmp/wheels/autofusion-*.whl \
    && rm -rf /tmp/wheels \
    && pip check \
    && useradd --system --uid 10001 --user-group --home-dir /var/lib/autofusion --create-home autofusion

# Packages stay root-owned and read-only to the service; only the data dir (SQLite, queue
# and artifacts in embedded mode; scratch space in a cluster) is writable. The working
# directory is root-owned and empty too: Settings reads ./.env from it, so nothing the
# service (or a job) can write may land there.
WORKDIR /opt/autofusion
USER autofusion
EXPOSE 8000

HEALTHCHECK --interval=15s --timeout=5s --start-period=30s --retries=3 \
    CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8000/healthz', timeout=4)"]

# In a container the API must listen on all interfaces, so keys are required; create
# the first one with `autofusion keys create` (see docs/service.md).
CMD ["autofusion", "serve", "--host", "0.0.0.0", "--require-api-keys"]
