"""The built-in patterns are parsed and validated once per content of their files;
every call still binds its own registry's rewriters, and user pattern files are read
fresh."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from autofusion.fusion_core import catalog
from autofusion.fusion_core.rewriters import builtin_rewriters

_PATTERN = """\
patterns:
  - name: {name}
    priority: {priority}
    nodes:
      - {{id: conv, op: Conv, inputs: {{0: $x, 1: $w}}}}
      - {{id: relu, op: Relu, inputs: {{0: conv}}}}
    rewriter: {{name: fused_region}}
"""


@pytest.fixture
def parses(monkeypatch) -> list[str]:
    """The origins of every pattern text parsed from now on, with empty caches."""
    seen: list[str] = []
    parse = catalog.parse_pattern_text

    def counting(text: str, origin: str = "<text>"):
        seen.append(origin)
        return parse(text, origin)

    monkeypatch.setattr(catalog, "parse_pattern_text", counting)
    catalog._parsed_builtins.cache_clear()
    catalog._builtin_specs.cache_clear()
    yield seen
    catalog._parsed_builtins.cache_clear()
    catalog._builtin_specs.cache_clear()


@pytest.fixture
def folder(tmp_path: Path, monkeypatch) -> Path:
    """A built-in folder of one pattern file, in place of the shipped one."""
    (tmp_path / "conv_relu.yaml").write_text(_PATTERN.format(name="conv_relu", priority=10))
    monkeypatch.setattr(catalog, "_builtin_folder", lambda: tmp_path)
    return tmp_path


def test_two_calls_parse_the_shipped_files_once(parses):
    first = catalog.builtin_patterns()
    files = len(parses)
    second = catalog.builtin_patterns()
    assert files > 10  # one parse per shipped file
    assert len(parses) == files  # and none for the second call
    assert [p.spec for p in first] == [p.spec for p in second]
    assert all(a.spec is b.spec for a, b in zip(first, second, strict=True))


def test_each_call_binds_its_own_registry(parses):
    registry = builtin_rewriters()
    compiled = catalog.builtin_patterns(registry)
    again = catalog.builtin_patterns(builtin_rewriters())
    assert all(p.rewriter is registry.get(p.spec.rewriter.name) for p in compiled)
    assert all(a.rewriter is not b.rewriter for a, b in zip(compiled, again, strict=True))


def test_an_edited_builtin_file_is_parsed_again(parses, folder):
    assert [p.spec.priority for p in catalog.builtin_patterns()] == [10]
    catalog.builtin_patterns()
    assert parses == ["conv_relu.yaml"]
    # same size, and possibly the same timestamp: the content is the key
    (folder / "conv_relu.yaml").write_text(_PATTERN.format(name="conv_relu", priority=20))
    assert [p.spec.priority for p in catalog.builtin_patterns()] == [20]
    assert parses == ["conv_relu.yaml", "conv_relu.yaml"]


def test_a_new_builtin_file_is_seen(parses, folder):
    assert [p.name for p in catalog.builtin_patterns()] == ["conv_relu"]
    (folder / "more.yaml").write_text(_PATTERN.format(name="conv_relu_2", priority=5))
    assert [p.name for p in catalog.builtin_patterns()] == ["conv_relu", "conv_relu_2"]


def test_builtin_data_is_a_copy(parses, folder):
    data = catalog.builtin_pattern_data()
    data[0]["priority"] = 99
    data[0]["nodes"].clear()
    assert catalog.builtin_pattern_data()[0]["priority"] == 10
    assert catalog.builtin_patterns()[0].spec.priority == 10
    assert len(parses) == 1


def test_a_user_pattern_file_is_read_fresh(tmp_path: Path):
    path = tmp_path / "mine.yaml"
    path.write_text(_PATTERN.format(name="mine.conv_relu", priority=1))
    assert catalog.load_pattern_file(path)[0].spec.priority == 1
    path.write_text(_PATTERN.format(name="mine.conv_relu", priority=2))
    assert catalog.load_pattern_file(path)[0].spec.priority == 2


def test_threads_share_the_specs_and_get_their_own_compiled_patterns(parses):
    found: list[list[catalog.CompiledPattern]] = []
    threads = [
        threading.Thread(target=lambda: found.append(catalog.builtin_patterns())) for _ in range(4)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(found) == 4
    names = [p.name for p in found[0]]
    assert all([p.name for p in compiled] == names for compiled in found)
    # variants were built before sharing: nobody builds them lazily afterwards
    assert all(p.spec._variants is not None for p in found[0])
