# autofusion: the API (`autofusion serve`) and the job workers (`autofusion worker`) share
# this image. docker-compose.yml runs it in distributed mode; alone it runs embedded:
#   docker build -t autofusion .
#   docker run -p 8000:8000 -v autofusion-data:/var/lib/autofusion autofusion
#   docker exec <container> autofusion keys create --tenant ci --scopes jobs:write
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    AUTOFUSION_DATA_DIR=/var/lib/autofusion

WORKDIR /opt/autofusion

# The dependencies first, from pyproject.toml alone, so this layer survives source edits.
# Only [project.dependencies]: no test tools and no torch (torch is an optional extra
# for regenerating test models, never a runtime dependency).
COPY pyproject.toml README.md ./
RUN python -c "import tomllib; print('\n'.join(tomllib.load(open('pyproject.toml', 'rb'))['project']['dependencies']))" > /tmp/requirements.txt \
    && pip install -r /tmp/requirements.txt \
    && rm /tmp/requirements.txt

COPY fusion_core ./fusion_core
COPY app ./app
COPY worker ./worker
COPY migrations ./migrations
# Editable, so app.migrate finds migrations/ beside the source (it is not a package).
RUN pip install --no-deps -e . \
    && useradd --system --uid 10001 --user-group --home-dir /var/lib/autofusion --create-home autofusion

# Source and packages stay root-owned and read-only to the service; only the data dir
# (SQLite, queue and artifacts in embedded mode; scratch space in a cluster) is writable.
USER autofusion
EXPOSE 8000

HEALTHCHECK --interval=15s --timeout=5s --start-period=30s --retries=3 \
    CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8000/healthz', timeout=4)"]

# In a container the API must listen on all interfaces, so keys are required; create
# the first one with `autofusion keys create` (see docs/service.md).
CMD ["autofusion", "serve", "--host", "0.0.0.0", "--require-api-keys"]
