"""OpenTelemetry tracing: off unless the standard ``OTEL_*`` settings ask for it.

On when ``OTEL_TRACES_EXPORTER`` names an exporter (``otlp``, ``console``) or an OTLP
endpoint is set (``OTEL_EXPORTER_OTLP_ENDPOINT``, ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``),
unless ``OTEL_SDK_DISABLED=true``; the SDK reads the rest (``OTEL_SERVICE_NAME``,
``OTEL_RESOURCE_ATTRIBUTES``, ``OTEL_BSP_*``, ``OTEL_PROPAGATORS``, headers...). The
packages are the ``tracing`` extra; asked for without them, one warning line says so.

Off, nothing of OpenTelemetry is imported here and every call is a no-op: tracing costs
a global read per span. Each process decides once, at its first span (``setup``), so a
prefork worker's pool processes set up their own exporter after the fork.

The spans of one job form one trace: the API's request span (FastAPI's own, on this
provider: ``app.main``), its ``autofusion.enqueue`` span whose context travels in the
task message's headers (``carrier``/``attached``), the worker's ``autofusion.job`` span
and its phases, and the sandbox's phases, which the sandbox writes to a file and the
worker exports (``worker.supervise``). Attributes are named ``autofusion.<key>``.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager, nullcontext
from contextvars import ContextVar
from typing import Any

from autofusion.app.core.logs import current_request_id

__all__ = [
    "INSTALL_HINT",
    "annotate",
    "attached",
    "carrier",
    "enabled",
    "ids",
    "record_span",
    "requested",
    "setup",
    "span",
    "tracer_provider",
    "use_provider",
]

logger = logging.getLogger(__name__)

INSTALL_HINT = "pip install 'autofusion[tracing]'"
_PREFIX = "autofusion."
_SUPPORTED = ("otlp", "otlp_proto_http", "console")
_NOTHING = nullcontext()

_lock = threading.Lock()
_decided = False
_tracer: Any = None  # an OpenTelemetry Tracer while tracing is on
_provider: Any = None
# Never mutated: ids() sets a new dict, so the shared default stays empty.
_ids: ContextVar[dict[str, Any]] = ContextVar("autofusion_trace_ids", default={})  # noqa: B039


def requested(environ: Mapping[str, str] | None = None) -> bool:
    """Whether the environment asks for traces (installed or not)."""
    env = os.environ if environ is None else environ
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    if env.get("OTEL_TRACES_EXPORTER", "").strip():
        return bool(_exporter_names(env))
    return bool(
        env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or env.get("OTEL_EXPORTER_OTLP_ENDPOINT")
    )


def _exporter_names(env: Mapping[str, str]) -> list[str]:
    """``OTEL_TRACES_EXPORTER`` (a comma-separated list; the SDK's default is otlp)."""
    names = (env.get("OTEL_TRACES_EXPORTER") or "otlp").lower().split(",")
    return [name.strip() for name in names if name.strip() not in ("", "none")]


def setup() -> bool:
    """Decide, once per process, whether this process traces; True when it does."""
    global _decided
    with _lock:
        if _decided:
            return _tracer is not None
        _decided = True
        if not requested():
            return False
        try:
            provider = _make_provider(os.environ)
        except ImportError as exc:
            logger.warning(
                "tracing: OTEL_* settings ask for traces, but OpenTelemetry is not installed "
                "(%s): %s",
                exc.name,
                INSTALL_HINT,
            )
            return False
        except Exception as exc:  # a bad OTEL_* value must not stop the service
            logger.warning("tracing: off, it could not start: %s", exc)
            return False
        _use(provider)
    logger.info("tracing: on (exporters: %s)", ", ".join(_exporter_names(os.environ)))
    return True


def _make_provider(env: Mapping[str, str]) -> Any:
    """The global SDK provider when something (``opentelemetry-instrument``) set one
    already, else ours: the exporters named, each behind a batch processor."""
    from opentelemetry import trace
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter

    current = trace.get_tracer_provider()
    if isinstance(current, TracerProvider):
        return current
    # Resource.create reads OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES; where neither
    # names the service, the SDK's "unknown_service:python" becomes ours.
    resource = Resource.create()
    if str(resource.attributes.get("service.name", "")).startswith("unknown_service"):
        resource = resource.merge(Resource({"service.name": "autofusion"}))
    provider = TracerProvider(resource=resource)
    protocol = env.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") or env.get(
        "OTEL_EXPORTER_OTLP_PROTOCOL"
    )
    if protocol and protocol != "http/protobuf":
        logger.warning(
            "tracing: OTLP protocol %r is not installed; http/protobuf is used", protocol
        )
    for name in _exporter_names(env):
        if name == "console":
            provider.add_span_processor(BatchSpanProcessor(ConsoleSpanExporter()))
        elif name in _SUPPORTED:  # endpoint, headers, timeout: from the OTEL_* variables
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

            provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
        else:
            logger.warning("tracing: exporter %r is not supported here: %s", name, _SUPPORTED)
    trace.set_tracer_provider(provider)
    return provider


def _use(provider: Any) -> None:
    global _tracer, _provider
    _provider = provider
    _tracer = None if provider is None else provider.get_tracer("autofusion")


def use_provider(provider: Any) -> None:
    """Trace to ``provider`` (an SDK TracerProvider), or not at all (None), whatever the
    environment says: for tests, and for an application that brings its own."""
    global _decided
    with _lock:
        _decided = True
        _use(provider)


def enabled() -> bool:
    """Whether this process traces (deciding now if it has not yet)."""
    return setup() if not _decided else _tracer is not None


def tracer_provider() -> Any:
    """The provider spans go to; None while tracing is off."""
    return _provider if enabled() else None


@contextmanager
def ids(**values: Any) -> Iterator[None]:
    """Spans begun inside the block carry these attributes too (a job's ``job_id`` and
    ``tenant``); the request id of the logging context they carry anyway."""
    token = _ids.set({**_ids.get(), **values})
    try:
        yield
    finally:
        _ids.reset(token)


def _attributes(values: Mapping[str, Any]) -> dict[str, Any]:
    """``autofusion.<key>`` for each value known (None: unknown, left out): the request
    id of the logging context, the block's ``ids``, then ``values``."""
    known = {"request_id": current_request_id(), **_ids.get(), **values}
    return {_PREFIX + key: value for key, value in known.items() if value is not None}


def span(name: str, *, kind: str | None = None, **attributes: Any) -> AbstractContextManager:
    """A span around a block, child of the current one, current inside it; an exception
    that leaves the block is recorded on it. ``kind``: ``producer`` or ``consumer``
    (internal by default). A no-op (yielding None) while tracing is off."""
    if not enabled():
        return _NOTHING
    from opentelemetry.trace import SpanKind

    span_kind = SpanKind[kind.upper()] if kind else SpanKind.INTERNAL
    return _tracer.start_as_current_span(name, kind=span_kind, attributes=_attributes(attributes))


def annotate(**attributes: Any) -> None:
    """Set ``autofusion.<key>`` attributes on the current span (if any is recording)."""
    if not enabled():
        return
    from opentelemetry import trace

    trace.get_current_span().set_attributes(_attributes(attributes))


def record_span(name: str, start_ns: int, end_ns: int, **attributes: Any) -> None:
    """A span that already happened (times in ns since the epoch), child of the current
    one: what another process measured (the sandbox's phases)."""
    if not enabled():
        return
    _tracer.start_span(name, start_time=start_ns, attributes=_attributes(attributes)).end(
        end_time=end_ns
    )


def carrier() -> dict[str, str]:
    """The current span's context as W3C headers (``traceparent``, ``tracestate``), to
    send with a message; empty while tracing is off."""
    if not enabled():
        return {}
    from opentelemetry import propagate

    headers: dict[str, str] = {}
    propagate.inject(headers)
    return headers


@contextmanager
def attached(headers: Mapping[str, str] | None) -> Iterator[None]:
    """Inside the block, spans are children of the context ``headers`` carry (those
    ``carrier`` made in another process); as it was without headers or tracing."""
    if not headers or not enabled():
        yield
        return
    from opentelemetry import context, propagate

    token = context.attach(propagate.extract(dict(headers)))
    try:
        yield
    finally:
        context.detach(token)
