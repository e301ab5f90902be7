"""Generated input (hypothesis) against the loaders of everything a user writes: campaign specs, site files,
tuning specs, knob catalogs and site knob overrides, commbench JSON lines. Whatever the input, a loader
either accepts it or raises its own error type with a message (SpecError, YamlModelError, ValueError /
CatalogError / UnsafeValueError, RecordError) -- never a TypeError, KeyError or AttributeError from deep
inside -- and whatever it accepts holds nothing a shell would interpret."""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from campaigns.model.records import parse_record_lines
from campaigns.model.site import Site
from campaigns.model.spec import SpecError, load_campaign
from campaigns.tuning.spec import load_spec
from campaigns.model.yamlio import YamlDocument, YamlModelError
from fixtures_store import commbench_record
from tuners.catalog import SAFE_VALUE_PATTERN, KnobCatalog

# COMMCAMP_FUZZ_EXAMPLES=5000 for a longer hunt than CI's.
FUZZ = settings(max_examples=int(os.environ.get("COMMCAMP_FUZZ_EXAMPLES", "200")), deadline=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
CATALOG = KnobCatalog.load()

# Names the loaders know, so that generated documents get past the first check often enough to reach the
# deeper ones, mixed with arbitrary text.
SPEC_KEYS = ["name", "kind", "site", "system", "environments", "node_counts", "max_nodes", "placements", "checks",
             "check", "ops", "sizes", "min_bytes", "max_bytes", "iters", "warmup", "env", "extra_args", "transports",
             "tasks_per_node", "timeout_s", "time_limit_s", "health", "references", "check_performance"]
SITE_KEYS = ["schema_version", "name", "description", "network", "knobs", "systems", "environments", "partitions",
             "scheduler", "launcher", "access", "nodes", "node", "commbench", "backend", "transports", "references",
             "env_vars", "mpi", "cc", "links", "libraries", "sizes", "max_jobs", "hostnames"]
TUNE_KEYS = ["site", "system", "environ", "library", "op", "nodes", "tasks_per_node", "sizes", "knobs", "trials",
             "budget_s", "executor", "launcher", "db", "finalize", "iters", "knob_overrides", "sampler"]
KNOB_KEYS = ["defaults", "pinned", "forbidden", "restrict", "choices", "low", "high",
             *[knob.name for knob in CATALOG][:12]]
WORDS = ["local", "localslurm", "mars", "local:cpu", "localslurm:debug", "openmpi", "mpich", "commbench_run",
         "pingpong", "allreduce", "mpi", "ccl", "health", "characterize", "$(touch pwned)", "a;b", "x\ny", "",
         "4096", "^LL128", "tcp,self", "../../etc", "unset", "launcher", "reframe"]

scalars = st.one_of(st.none(), st.booleans(), st.integers(min_value=-2**70, max_value=2**70),
                    st.floats(allow_nan=True, allow_infinity=True), st.sampled_from(WORDS), st.text(max_size=12))


def documents(keys: list[str]) -> st.SearchStrategy[Any]:
    key = st.one_of(st.sampled_from(keys), st.text(max_size=8))
    return st.recursive(scalars, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                         st.dictionaries(key, inner, max_size=6)), max_leaves=25)


def dumped(document: Any) -> str:
    try:
        return yaml.safe_dump(document, allow_unicode=True)
    except (yaml.YAMLError, ValueError, OverflowError):
        return str(document)


@FUZZ
@given(st.one_of(documents(SPEC_KEYS).map(dumped), st.text(max_size=200)))
def test_campaign_spec_loader(tmp_path: Path, text: str) -> None:
    path = tmp_path / "spec.yaml"
    path.write_text(text, encoding="utf-8")
    try:
        campaign = load_campaign(path)
    except SpecError as exc:
        assert str(exc).strip()
        return
    for case in campaign.cases():
        for value in [*dict(case.env).values(), *dict(case.variables).get("extra_args", [])]:
            assert SAFE_VALUE_PATTERN.fullmatch(value), value


@FUZZ
@given(st.one_of(documents(SITE_KEYS).map(dumped), st.text(max_size=200)))
def test_site_file_loader(tmp_path: Path, text: str) -> None:
    path = tmp_path / "site.yaml"
    path.write_text(text, encoding="utf-8")
    try:
        YamlDocument(path).validate(Site)
    except YamlModelError as exc:
        assert str(path) in str(exc)


@FUZZ
@given(st.one_of(documents(TUNE_KEYS).map(dumped), st.text(max_size=200)))
def test_tuning_spec_loader(tmp_path: Path, text: str) -> None:
    path = tmp_path / "tune.yaml"
    path.write_text(text, encoding="utf-8")
    try:
        spec = load_spec(path)
    except ValueError as exc:
        assert str(exc).strip()
        return
    assert all(1 <= size <= 1 << 40 for size in spec.sizes)


@FUZZ
@given(documents(KNOB_KEYS))
def test_knob_overrides_loader(overrides: Any) -> None:
    try:
        catalog = CATALOG.for_site(overrides, "fuzz.yaml")
    except ValueError as exc:  # CatalogError and UnsafeValueError are ValueErrors
        assert "fuzz.yaml" in str(exc) or str(exc).strip()
        return
    for name, value in {**catalog.default_env(), **catalog.pinned}.items():
        assert SAFE_VALUE_PATTERN.fullmatch(str(value)), (name, value)


@FUZZ
@given(documents(["schema_version", "knobs", "libraries", "type", "choices", "low", "high", "default",
                  "safety", "description", "transports", "versions", "NCCL_ALGO", "unset", "source",
                  "constraints", "product", "at_most"]))
def test_knob_catalog_loader(document: Any) -> None:
    try:
        KnobCatalog.from_document(document, "fuzz-catalog.yaml")
    except ValueError as exc:
        assert str(exc).strip()


RECORD = commbench_record()


@FUZZ
@given(st.lists(st.one_of(
    st.text(max_size=80),
    st.integers(min_value=1, max_value=len(json.dumps(RECORD))).map(lambda n: json.dumps(RECORD)[:n]),
    st.tuples(st.sampled_from(sorted(RECORD)), scalars).map(lambda kv: json.dumps({**RECORD, kv[0]: kv[1]},
                                                                                 default=str)),
), max_size=5))
def test_record_lines_parser(lines: list[str]) -> None:
    text = "\n".join(lines)
    records, problems = parse_record_lines(text, "fuzz.jsonl")
    assert len(records) + len(problems) <= len(text.splitlines())  # one verdict per non-blank line at most
    for record in records:  # what is accepted is a whole, schema-valid record
        assert record["schema_version"] in (1, 2) and len(record["hostnames"]) == record["ranks"]
