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

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from campaigns.model.records import parse_record_lines
from campaigns.paths import SITE_CONFIGS_DIR
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


def test_a_list_or_a_mapping_as_a_key_is_malformed_yaml(tmp_path: Path) -> None:
    """A bracket typo (`{[openmpi]}`) makes an unhashable key: PyYAML's own loader raises a TypeError, which
    took down every command that lists sites. It is malformed YAML, named with its line."""
    path = tmp_path / "site.yaml"
    for text, kind in (("name: x\nenvironments: {[openmpi]}\n", "list"), ("name: x\n? {a: 1}\n: y\n", "dict")):
        path.write_text(text, encoding="utf-8")
        try:
            YamlDocument(path)
        except YamlModelError as exc:
            assert str(exc).startswith(f"{path}:2: malformed YAML: a {kind} as a mapping key"), exc
        else:
            raise AssertionError(f"{text!r} was read")


@pytest.mark.parametrize(("loader", "edit", "problem"), [
    ("campaign", ("max_bytes: 1024", "max_bytes: 1024\n    iters: true"), "spec.yaml:8: checks[0].iters"),
    ("campaign", ("node_counts: [1]", "node_counts: [yes]"), "spec.yaml:3: node_counts[0]"),
    ("site", ("tasks_per_node: 2", "tasks_per_node: yes"), "site.yaml:26: systems[0].partitions[0].commbench"
                                                           ".tasks_per_node"),
    ("site", ("node: {cores: 2,", "node: {cores: on,"), "site.yaml:22: systems[0].partitions[0].node.cores"),
    ("tune", ("nodes: 1", "nodes: yes"), "tune.yaml:4: nodes"),
])
def test_yaml_s_true_where_a_number_belongs_is_refused(tmp_path: Path, loader: str, edit: tuple[str, str],
                                                       problem: str) -> None:
    """YAML reads yes/on/true as a bool, which pydantic takes as 1 where a number belongs: `iters: true` ran 1
    iteration, `node_counts: [true]` 1 node, a site's `tasks_per_node: yes` 1 task. Every loader refuses it."""
    sources = {"campaign": ("spec.yaml", "name: t\nsite: local\nnode_counts: [1]\nchecks:\n  - check: commbench_run\n"
                                         "    ops: [pingpong]\n    max_bytes: 1024\n"),
               "site": ("site.yaml", (SITE_CONFIGS_DIR / "local" / "site.yaml").read_text()),
               "tune": ("tune.yaml", "site: local\nsystem: local:cpu\nlibrary: openmpi\nnodes: 1\nop: allreduce\n"
                                     "knobs: [OMPI_MCA_btl_tcp_sndbuf]\n")}
    name, text = sources[loader]
    assert text.count(edit[0]) == 1
    path = tmp_path / name
    path.write_text(text.replace(edit[0], edit[1]), encoding="utf-8")
    read = {"campaign": load_campaign, "site": lambda p: YamlDocument(p).validate(Site), "tune": load_spec}[loader]
    with pytest.raises((SpecError, YamlModelError, ValueError)) as refused:
        read(path)
    assert f"{tmp_path}/{problem}: expected a number, not true" in str(refused.value), refused.value


@pytest.mark.parametrize(("loader", "edit", "problem"), [
    ("campaign", ("max_bytes: 1024", "max_bytes: 1024\n    iters: '10'"), "spec.yaml:8: checks[0].iters"),
    ("tune", ("nodes: 1", "nodes: '1'\ntrials: '5'"), "tune.yaml:4: nodes"),
    ("tune", ("nodes: 1", "nodes: 1\nfinalize: {rounds: '12'}"), "tune.yaml:5: finalize.rounds"),
])
def test_a_quoted_number_where_a_number_belongs_is_refused(tmp_path: Path, loader: str, edit: tuple[str, str],
                                                          problem: str) -> None:
    """pydantic took `iters: "10"` as 10 in a campaign or tuning spec, where site.yaml (strict) refuses it: the
    file says a string. Refused alike; a size still takes its units (max_bytes: 64K)."""
    sources = {"campaign": ("spec.yaml", "name: t\nsite: local\nnode_counts: [1]\nchecks:\n  - check: commbench_run\n"
                                         "    ops: [pingpong]\n    max_bytes: 64K\n".replace("64K", "1024")),
               "tune": ("tune.yaml", "site: local\nsystem: local:cpu\nlibrary: openmpi\nnodes: 1\nop: allreduce\n"
                                     "knobs: [OMPI_MCA_btl_tcp_sndbuf]\n")}
    name, text = sources[loader]
    path = tmp_path / name
    path.write_text(text.replace(edit[0], edit[1]), encoding="utf-8")
    read = {"campaign": load_campaign, "tune": load_spec}[loader]
    with pytest.raises((SpecError, YamlModelError, ValueError)) as refused:
        read(path)
    assert f"{tmp_path}/{problem}: expected a number, not the string '" in str(refused.value), refused.value
    if loader == "campaign":  # a size with its units is no quoted number
        path.write_text(text.replace("max_bytes: 1024", "max_bytes: '64K'"), encoding="utf-8")
        assert load_campaign(path).spec.checks[0].max_bytes == 65536
    else:  # nor a tune's sizes, nor YAML 1.1's unquoted 1e-3 (a string to PyYAML)
        path.write_text(text + "sizes: [64K, 1M]\nfinalize: {alpha: 1e-3}\n", encoding="utf-8")
        spec = load_spec(path)
        assert spec.sizes == [65536, 1 << 20] and spec.finalize.alpha == 0.001
