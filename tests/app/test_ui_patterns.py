"""The patterns page, read by a user (issue 27): a search that works without JavaScript
(and live with htmx), the patterns grouped by family, one-line descriptions with the rest
on the pattern's page, and how often each pattern fired and measured in the tenant's
recent jobs (one bounded query over the jobs' summaries)."""

from __future__ import annotations

import html as html_lib
import json
import re
import uuid
from collections import Counter
from datetime import UTC, datetime, timedelta

from ui_testing import assert_page, conv_bn_relu, run_job

from autofusion.app.core.models import Job, Tenant
from autofusion.app.services.pattern_usage import pattern_usage
from autofusion.app.ui.pattern_list import FAMILIES, short
from autofusion.fusion_core.catalog import builtin_pattern_data
from autofusion.fusion_core.rewriters import builtin_rewriters
from autofusion.worker.plan import measured_by_pattern


def _rows(html: str) -> list[str]:
    return re.findall(r'<tr data-pattern="([^"]+)"', html)


def _families(html: str) -> dict[str, list[str]]:
    """Each family's tbody and the patterns in it, in page order."""
    found = {}
    for family, body in re.findall(r'data-family="([^"]+)">(.*?)</tbody>', html, re.S):
        found[html_lib.unescape(family)] = _rows(body)
    return found


def _cell(html: str, name: str, css: str) -> dict[str, str]:
    row = re.search(rf'<tr data-pattern="{re.escape(name)}".*?</tr>', html, re.S).group(0)
    cell = re.search(rf'<td class="{css}"([^>]*)>', row).group(1)
    return dict(re.findall(r'data-(\w+)="([^"]*)"', cell))


def test_every_builtin_rewriter_has_a_family() -> None:
    # A new rewriter lands in a family of its own name until FAMILIES names it: say so.
    named = {rewriter for names in FAMILIES.values() for rewriter in names}
    assert set(builtin_rewriters().names()) <= named


def test_the_page_groups_every_pattern_by_family(service) -> None:
    html = assert_page(service.client.get("/ui/patterns"), "patterns", "pattern-search")
    families = _families(html)
    builtin = {raw["name"] for raw in builtin_pattern_data()}
    assert sorted(name for rows in families.values() for name in rows) == sorted(builtin)
    assert "conv_bn" in families["Folded into Conv or Gemm"]
    assert {"attention", "attention_packed"} <= set(families["Attention"])
    assert "layer_norm" in families["Normalization"] and "gelu_erf" not in families
    assert list(families)[:2] == ["Attention", "Normalization"]  # FAMILIES' order


def test_a_registered_pattern_is_in_its_family_and_its_page_links_there(service) -> None:
    text = (
        "name: acme.conv_relu\ndescription: A Relu after a Conv.\n"
        "nodes:\n  - {id: conv, op: Conv}\n  - {id: act, op: Relu, inputs: {'0': conv}}\n"
        "rewriter: {name: fused_region, params: {domain: ai.acme}}\n"
    )
    assert service.client.post("/ui/patterns/new", data={"yaml": text}).status_code == 200
    listing = service.client.get("/ui/patterns").text
    assert "acme.conv_relu" in _families(listing)["Fused regions (any ops, no code)"]
    page = service.client.get("/ui/patterns/acme.conv_relu").text
    anchor = re.search(r'id="pattern-family" href="/ui/patterns#([^"]+)"', page).group(1)
    assert f'id="{anchor}" data-family="Fused regions (any ops, no code)"' in listing


def test_descriptions_are_one_short_line_and_whole_on_the_patterns_page(service) -> None:
    full = next(r["description"] for r in builtin_pattern_data() if r["name"] == "attention")
    full = " ".join(full.split())
    html = service.client.get("/ui/patterns").text
    row = re.search(r'<tr data-pattern="attention".*?</tr>', html, re.S).group(0)
    shown = html_lib.unescape(re.search(r'<td class="description">(.*?) <a', row, re.S).group(1))
    assert len(shown) <= 122 and shown.endswith("…") and full.startswith(shown[:-2])
    assert 'class="more" href="/ui/patterns/attention"' in row
    page = service.client.get("/ui/patterns/attention").text
    described = re.search(r'id="pattern-description">(.*?)</p>', page).group(1)
    assert html_lib.unescape(described) == full


def test_short_keeps_a_first_sentence_and_cuts_at_a_word() -> None:
    assert short("Folds a BN. Then more text follows.") == "Folds a BN."
    assert short("com.microsoft.Attention e.g. here") == "com.microsoft.Attention e.g. here"
    assert short("word " * 40, limit=22) == "word word word word …"


def test_search_filters_by_name_description_and_op_type_without_javascript(service) -> None:
    by_op = service.client.get("/ui/patterns", params={"q": "batchnormalization"}).text
    assert "conv_bn" in _rows(by_op) and "layer_norm" not in _rows(by_op)
    assert 'value="batchnormalization"' in by_op  # the box keeps what was asked
    both = _rows(service.client.get("/ui/patterns", params={"q": "rms SKIP"}).text)
    assert both and all("skip_rms" in name for name in both)
    by_words = _rows(service.client.get("/ui/patterns", params={"q": "rotate_half"}).text)
    assert by_words == ["rotary_embedding"]  # a word of its description only
    none = service.client.get("/ui/patterns", params={"q": "no such fusion"})
    assert _rows(assert_page(none, "no-patterns")) == []
    too_long = service.client.get("/ui/patterns", params={"q": "x" * 201})
    assert too_long.status_code == 422


def test_htmx_live_search_gets_the_results_only(service) -> None:
    headers = {"HX-Request": "true", "HX-Target": "results"}
    response = service.client.get("/ui/patterns", params={"q": "Erf"}, headers=headers)
    assert response.status_code == 200
    fragment = response.text
    assert fragment.lstrip().startswith('<section id="results">') and "<html" not in fragment
    assert _rows(fragment) and all(n.startswith("gelu_erf") for n in _rows(fragment))


def _finished_job(session, tenant: str, summary: dict, *, age_s: float = 0.0) -> None:
    session.add(
        Job(
            id=str(uuid.uuid4()),
            tenant_id=tenant,
            status="succeeded",
            model_digest="0" * 64,
            summary=summary,
            created_at=datetime.now(UTC) - timedelta(seconds=age_s),
        )
    )


def test_usage_counts_the_tenants_real_jobs_and_measured_selection(service) -> None:
    plain = run_job(service, service.submit(conv_bn_relu().SerializeToString()).json()["id"])
    config = {"target": "onnxruntime", "selection": "measured", "measure_options": {"budget_s": 1}}
    response = service.submit(conv_bn_relu().SerializeToString(), config=config)
    job = run_job(service, response.json()["id"])
    report = json.loads(service.app.state.store.read_bytes(job.report_digest))
    measured = job.summary["measured"]
    assert measured == measured_by_pattern(report) and measured  # the summary holds it
    with service.db() as session:  # another tenant's job never shows
        session.add(Tenant(id="elsewhere"))
        session.flush()
        _finished_job(session, "elsewhere", {"counts": {name: 50 for name in measured}})
    html = service.client.get("/ui/patterns").text
    verdicts = {"faster": "faster", "no measurable change": "level", "slower": "slower"}
    for name in measured:
        groups = [g for g in report["measurement"]["groups"] if g["pattern"] == name]
        cell = _cell(html, name, "usage-measured")
        assert int(cell["kept"]) == sum(g["kept"] for g in groups)
        assert int(cell["dropped"]) == sum(not g["kept"] for g in groups)
        for verdict, key in verdicts.items():
            assert int(cell[key]) == sum(g["ratio"]["verdict"] == verdict for g in groups)
    assert "this tenant’s 2 finished jobs" in html
    fired = Counter(plain.summary["counts"]) + Counter(job.summary["counts"])
    assert fired and sum(fired.values()) >= 1
    for name, count in fired.items():
        jobs = sum(name in j.summary["counts"] for j in (plain, job))
        assert _cell(html, name, "usage-fired") == {"fusions": str(count), "jobs": str(jobs)}
    name = next(iter(plain.summary["counts"]))
    page = service.client.get(f"/ui/patterns/{name}").text
    assert f"Fired {fired[name]} time" in page


def test_usage_reads_the_newest_jobs_of_the_window_only(service) -> None:
    with service.db() as session:
        session.add(Tenant(id="acme"))
        session.flush()
        for age, count in ((30, 7), (20, 5), (10, 3)):
            _finished_job(session, "acme", {"counts": {"conv_bn": count}}, age_s=age)
        _finished_job(session, "acme", None)  # failed before any result: nothing
    with service.db() as session:
        assert pattern_usage(session, "acme").of("conv_bn").fusions == 15
        window = pattern_usage(session, "acme", window=2)
    assert (window.jobs, window.of("conv_bn").fusions, window.of("conv_bn").jobs) == (2, 3, 1)
