"""`autofusion registry`: a server's pattern registry and named strategies, through its API.

  autofusion registry patterns list                  name, version, state, targets
  autofusion registry patterns get NAME [-o FILE]    the spec (YAML; JSON for a .json FILE)
  autofusion registry patterns create FILE           register the pattern(s) a file holds
  autofusion registry patterns put NAME FILE         replace NAME's spec: a new version
  autofusion registry patterns delete NAME           delete (its history stays readable)
  autofusion registry patterns enable|disable NAME   the next jobs use it, or leave it out
  autofusion registry patterns history NAME          every version, oldest first
  autofusion registry strategies list|get|create|put|history ...   the same for strategies

Lost updates are refused. `get` (and `create`, `put`) record the ETag the server sent
("NAME@VERSION") in $XDG_STATE_HOME/autofusion/etags.json, per server; `put` and `delete`
send it as If-Match. When someone else changed the entry in between, the server answers
412 and nothing is written (exit 7): get it again, redo the change, put again.
--if-match ETAG sends another ETag ('*': whatever version is there now).

`autofusion patterns` stays what it was: the built-in patterns and pattern files on this
machine, no server (`patterns check FILE` validates a file before you create it here).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from autofusion.app.cli._client import (
    Client,
    ClientError,
    add_server_options,
    read_json,
    with_client,
)
from autofusion.app.cli._exit import EXIT_BAD_INPUT, EXIT_CONFLICT, EXIT_OK, EXIT_USAGE, epilog

__all__ = ["KINDS", "EtagStore", "add_parser"]


@dataclass(frozen=True)
class Kind:
    name: str  # "pattern": as messages say it
    path: str  # the collection's route
    actions: tuple[str, ...]
    state_fields: tuple[str, ...]  # in a GET answer, not in what PUT takes

    def url(self, name: str) -> str:
        if not name or "/" in name:
            raise ClientError(f"not a {self.name} name: {name!r}", EXIT_USAGE)
        return f"{self.path}/{name}"

    def document(self, entry: dict) -> dict:
        """What PUT takes, from what GET answered: a pattern's spec, a strategy's fields."""
        if self.name == "pattern":
            return entry.get("spec") or {}
        return {k: v for k, v in entry.items() if k not in self.state_fields}


_COMMON = ("list", "get", "create", "put", "history")
KINDS = {
    "patterns": Kind(
        "pattern",
        "/v1/patterns",
        (*_COMMON, "delete", "enable", "disable"),
        ("version", "enabled", "builtin", "updated_at"),
    ),
    # The API has no DELETE for strategies: a strategy is replaced, never removed.
    "strategies": Kind("strategy", "/v1/strategies", _COMMON, ("version", "updated_at")),
}


class EtagStore:
    """The ETag last read or written of each registry entry, per server."""

    def __init__(self, path: Path | None = None) -> None:
        state = os.environ.get("XDG_STATE_HOME") or Path.home() / ".local" / "state"
        self.path = path or Path(state) / "autofusion" / "etags.json"

    def _read(self) -> dict[str, str]:
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return {}
        return data if isinstance(data, dict) else {}

    def get(self, key: str) -> str | None:
        return self._read().get(key)

    def put(self, key: str, etag: str | None) -> None:
        data = self._read()
        if etag:
            data[key] = etag
        else:
            data.pop(key, None)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        partial = self.path.with_name(self.path.name + ".part")
        partial.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n", encoding="utf-8")
        os.replace(partial, self.path)


def add_parser(commands: argparse._SubParsersAction) -> None:
    p = commands.add_parser(
        "registry",
        description=__doc__,
        epilog=epilog(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    kinds = p.add_subparsers(dest="registry_kind", required=True, metavar="KIND")
    for kind_name, kind in KINDS.items():
        k = kinds.add_parser(kind_name, help=f"the server's {kind_name}")
        actions = k.add_subparsers(dest="registry_action", required=True, metavar="ACTION")
        for action in kind.actions:
            _add_action(actions, kind, action)


_HELP = {
    "list": "list them",
    "get": "show one (YAML, or -o FILE) and record its ETag",
    "create": "create from a YAML/JSON file",
    "put": "replace one with a file's content (If-Match: the recorded ETag)",
    "delete": "delete one (If-Match: the recorded ETag)",
    "enable": "enable one",
    "disable": "disable one",
    "history": "every version, oldest first",
}


def _add_action(actions: argparse._SubParsersAction, kind: Kind, action: str) -> None:
    a = actions.add_parser(action, help=_HELP[action], description=_HELP[action])
    add_server_options(a)
    if action not in ("list", "create"):
        a.add_argument("name", metavar="NAME")
    if action in ("create", "put"):
        a.add_argument("file", type=Path, metavar="FILE", help="YAML or JSON")
    if action in ("put", "delete"):
        a.add_argument("--if-match", metavar="ETAG", help="this ETag, not the recorded one")
    if action == "get":
        a.add_argument("-o", "--output", type=Path, help="write here (.json: JSON; else YAML)")
    a.add_argument("--json", action="store_true", help="print the server's JSON answer")
    a.set_defaults(run=lambda args: _run(args, kind, action))


def _run(args: argparse.Namespace, kind: Kind, action: str) -> int:
    return with_client(
        args, "registry", lambda client: _ACTIONS[action](client, args, kind, EtagStore())
    )


def _key(client: Client, kind: Kind, name: str) -> str:
    return f"{client.server} {kind.name} {name}"


def _dump(value: Any, as_json: bool) -> str:
    if as_json:
        return json.dumps(value, indent=2) + "\n"
    return yaml.safe_dump(value, sort_keys=False, allow_unicode=True)


def _print(args: argparse.Namespace, value: Any) -> None:
    print(_dump(value, args.json), end="")


def _list(client: Client, args: argparse.Namespace, kind: Kind, _: EtagStore) -> int:
    answer = read_json(client.send("GET", kind.path))
    if args.json:
        _print(args, answer)
        return EXIT_OK
    for entry in answer.get("data") or []:
        state = "" if entry.get("enabled", True) else " (disabled)"
        extra = ",".join(entry.get("targets") or []) or entry.get("description") or ""
        print(f"{entry.get('name')}  v{entry.get('version')}{state}  {extra}".rstrip())
    if "registry_version" in answer:
        sys.stderr.write(f"registry version {answer['registry_version']}\n")
    return EXIT_OK


def _get(client: Client, args: argparse.Namespace, kind: Kind, etags: EtagStore) -> int:
    response = client.send("GET", kind.url(args.name))
    entry = read_json(response)
    etags.put(_key(client, kind, args.name), response.headers.get("ETag"))
    if args.output:
        document = kind.document(entry)
        args.output.write_text(_dump(document, args.output.suffix == ".json"), encoding="utf-8")
        sys.stderr.write(f"wrote {args.output} ({kind.name} {args.name} v{entry.get('version')})\n")
    else:
        _print(args, entry if args.json else kind.document(entry))
    return EXIT_OK


def _documents(path: Path, kind: Kind) -> list[dict]:
    """The entries a file holds: one mapping, a list, or a pattern file's ``patterns:``."""
    try:
        loaded = yaml.safe_load(path.read_text(encoding="utf-8"))  # JSON is YAML
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        raise ClientError(f"cannot read {path}: {exc}", EXIT_BAD_INPUT) from None
    if isinstance(loaded, dict) and kind.name == "pattern" and "patterns" in loaded:
        loaded = loaded["patterns"]
    documents = loaded if isinstance(loaded, list) else [loaded]
    if not documents or not all(isinstance(d, dict) for d in documents):
        raise ClientError(
            f"{path} must hold a {kind.name} (a mapping) or a list of them", EXIT_BAD_INPUT
        )
    return documents


def _create(client: Client, args: argparse.Namespace, kind: Kind, etags: EtagStore) -> int:
    for document in _documents(args.file, kind):
        try:
            response = client.send("POST", kind.path, json=document)
        except ClientError as exc:
            raise _refused(kind, exc) from None
        entry = read_json(response)
        etags.put(_key(client, kind, entry["name"]), response.headers.get("ETag"))
        print(f"created {kind.name} {entry['name']} v{entry.get('version')}")
    return EXIT_OK


def _if_match(client: Client, args: argparse.Namespace, kind: Kind, etags: EtagStore) -> dict:
    etag = args.if_match or etags.get(_key(client, kind, args.name))
    return {"If-Match": etag} if etag else {}


def _changed(kind: Kind, name: str, exc: ClientError, sent: dict) -> ClientError:
    """A refused change in words that say what to do, and its code."""
    get = f"autofusion registry {kind.path.rsplit('/', 1)[1]} get {name}"
    if exc.status == 412:
        return ClientError(
            f"{kind.name} {name} was changed on the server since you read it (your ETag "
            f"{sent.get('If-Match')}); nothing was written. Run `{get}` to see the current "
            "version, redo your change on it and try again (--if-match '*' overwrites it "
            "whatever it is now)",
            EXIT_CONFLICT,
            status=412,
        )
    if exc.status == 428:
        return ClientError(
            f"the server needs the version you are changing: run `{get}` first (it records "
            f"the ETag), or pass --if-match ETAG ('*' for whatever version is there)",
            EXIT_USAGE,
            status=428,
        )
    return _refused(kind, exc)


def _refused(kind: Kind, exc: ClientError) -> ClientError:
    """An invalid strategy is a config error (2), as `optimize --strategy` says of one;
    an invalid pattern is bad input (3), as `optimize --pattern-file` says."""
    if exc.status == 422 and kind.name == "strategy":
        return ClientError(str(exc), EXIT_USAGE, status=422)
    return exc


def _put(client: Client, args: argparse.Namespace, kind: Kind, etags: EtagStore) -> int:
    documents = _documents(args.file, kind)
    if len(documents) != 1:
        raise ClientError(
            f"{args.file} holds {len(documents)} {kind.name}s; put takes one", EXIT_BAD_INPUT
        )
    document = {**documents[0], "name": documents[0].get("name", args.name)}
    headers = _if_match(client, args, kind, etags)
    try:
        response = client.send("PUT", kind.url(args.name), json=document, headers=headers)
    except ClientError as exc:
        raise _changed(kind, args.name, exc, headers) from None
    entry = read_json(response)
    etags.put(_key(client, kind, args.name), response.headers.get("ETag"))
    print(f"updated {kind.name} {args.name} to v{entry.get('version')}")
    return EXIT_OK


def _delete(client: Client, args: argparse.Namespace, kind: Kind, etags: EtagStore) -> int:
    headers = _if_match(client, args, kind, etags)
    try:
        client.send("DELETE", kind.url(args.name), headers=headers)
    except ClientError as exc:
        raise _changed(kind, args.name, exc, headers) from None
    etags.put(_key(client, kind, args.name), None)
    print(f"deleted {kind.name} {args.name}")
    return EXIT_OK


def _state(client: Client, args: argparse.Namespace, kind: Kind, etags: EtagStore) -> int:
    action = args.registry_action
    response = client.send("POST", f"{kind.url(args.name)}/{action}")
    entry = read_json(response)
    etags.put(_key(client, kind, args.name), response.headers.get("ETag"))
    print(f"{action}d {kind.name} {args.name} (v{entry.get('version')})")
    return EXIT_OK


def _history(client: Client, args: argparse.Namespace, kind: Kind, _: EtagStore) -> int:
    answer = read_json(client.send("GET", f"{kind.url(args.name)}/versions"))
    if args.json:
        _print(args, answer)
        return EXIT_OK
    for version in answer.get("data") or []:
        change = version.get("change") or ""
        by = f" by {version['created_by']}" if version.get("created_by") else ""
        print(f"v{version.get('version')}  {version.get('created_at')}  {change}{by}".rstrip())
    return EXIT_OK


_ACTIONS = {
    "list": _list,
    "get": _get,
    "create": _create,
    "put": _put,
    "delete": _delete,
    "enable": _state,
    "disable": _state,
    "history": _history,
}
