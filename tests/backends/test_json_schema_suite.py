"""The JSON-Schema-Test-Suite conformance kit, run on every registered backend (fd_guided.harness.conformance).

A third-party backend registered under ``fd_guided.backends`` is picked up here by its name and
held to the same bar: every invalid instance of every schema it compiles is rejected, token by
token, through the `Grammar` interface only. The suite is found at ``../shared/corpora/
json-schema-test-suite`` next to the repository or through ``$FD_GUIDED_JSON_SCHEMA_SUITE``.
"""
import dataclasses
import functools

import pytest

from fd_guided.harness.conformance import DRAFTS as DRAFT_URIS
from fd_guided.harness.conformance import SUITE_ENV, load_cases, run_cases, suite_root, summarise
from fd_guided.registry import available_backends

pytestmark = pytest.mark.cpu
DRAFTS = ("draft2020-12", "draft7")
# Instances the suite counts as valid that fd_guided rejects by design (docs/conformance.md):
# draft2020-12/format.json reads formats as annotations; fd_guided asserts them (outputs are
# judged with a format checker).
MIN_COMPLETENESS = {"auto": 0.95, "llguidance": 0.94, "xgrammar": 0.90}


@functools.lru_cache(maxsize=None)
def results(backend: str, draft: str, optional: str | None = None, declared: bool = True):
    """`declared`: each schema names its draft in ``$schema`` (as the suite intends); without, the
    schemas are sent as clients send them (no ``$schema``) and must still be read so that every
    instance the draft's own tests call invalid is rejected (fd_guided.schema.drafts)."""
    root = suite_root()
    if root is None:
        pytest.skip(f"JSON-Schema-Test-Suite not found: set {SUITE_ENV} or place it at ../shared/corpora/json-schema-test-suite")
    cases = load_cases(root, draft, optional=optional)
    if not declared:
        cases = [dataclasses.replace(case, schema=_undeclared(case.schema, draft)) for case in cases]
    return summarise(run_cases(backend, cases, strict=False))


def _undeclared(schema, draft: str):
    if isinstance(schema, dict) and schema.get("$schema") == DRAFT_URIS[draft]:
        return {key: value for key, value in schema.items() if key != "$schema"}
    return schema


@pytest.mark.parametrize("declared", [True, False], ids=["with-$schema", "without-$schema"])
@pytest.mark.parametrize("draft", DRAFTS)
@pytest.mark.parametrize("backend", available_backends())
def test_every_invalid_instance_is_rejected(backend, draft, declared):
    summary = results(backend, draft, declared=declared)
    assert summary["unsound"] == [] and summary["soundness"] == 1.0
    assert summary["capped"] == 0  # every key order of every invalid instance was tried


@pytest.mark.parametrize("declared", [True, False], ids=["with-$schema", "without-$schema"])
@pytest.mark.parametrize("draft", DRAFTS)
@pytest.mark.parametrize("backend", available_backends())
def test_optional_formats_are_sound(backend, draft, declared):
    summary = results(backend, draft, "format", declared=declared)
    assert summary["unsound"] == []


@pytest.mark.parametrize("draft", DRAFTS)
def test_auto_covers_at_least_each_engine(draft):
    auto = results("auto", draft)
    assert auto["coverage"] >= 0.75
    assert auto["compiled"] >= max(results("xgrammar", draft)["compiled"], results("llguidance", draft)["compiled"])


@pytest.mark.parametrize("draft", DRAFTS)
@pytest.mark.parametrize("backend", ["auto", "llguidance", "xgrammar"])
def test_valid_instances_are_accepted(backend, draft):
    assert results(backend, draft)["completeness"] >= MIN_COMPLETENESS[backend]
