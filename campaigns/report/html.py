"""`commcamp report`: one self-contained HTML file from the results store (plotly.js inline, once; no
network access needed to view it).

plotly.js (4.6 MiB) is embedded gzip-compressed and base64-encoded (1.8 MiB) and unpacked in the browser
with DecompressionStream (Chromium 80+, Firefox 113+, Safari 16.4+); each figure is a JSON block that the
page draws once plotly is loaded. `document.body.dataset.plots` then holds the number of plots drawn.

Medians are taken only over runs that agree on everything that changes the number: the benchmark that measured
it (commbench, or nccl-tests / OSU records ingested from their output: other timing methods), site, system and
partition, programming environment, MPI library, transport, node and rank count, placement (network
distance), batch, knob set (the catalog's variables in the environment commbench recorded), host memory (pinned
or pageable), direction and, in a selection sweep, the algorithm selected. Each curve is one such group; its legend
names what differs between the curves of a plot, the plot's subtitle what they share.
Tuning trials (campaign `tune`: settings under test, some bad) are left out unless asked for.

Sections, each shown when the data has it:
1. Goodput vs message size, one plot per op, one line per group (median over its runs), the nominal link
   bandwidths of the partitions its curves ran on dashed (seed 001 Figs. 3, 5, 6).
2. GPU-pair heatmaps from `pairmatrix` records: latency at the smallest size, goodput (uni) and aggregate
   bandwidth (bi) at the largest size, per transport (seeds 000, 004).
3. Distributions of per-iteration times (violin + box, p50/p95/p99 in the table) of valid measurements (as every
   plot) at the smallest, a middle and the largest size per op and transport (seed 001 Fig. 8); each
   distribution is drawn from 201 quantiles of its stored samples, so the file stays small whatever the
   iteration count.
4. Nightly trend of every health metric with its reference band, log axis: the runs health judges
   (campaigns.model.references.measured: passed, or failed only their performance check), each against the
   references of the partition it ran on (a campaign's own references first, as health's).
5. Health summary: the verdict files given (`--verdict`), metric (with placement and hosts) and node
   tables.
"""
from __future__ import annotations

import base64
import functools
import gzip
import html
import json
import math
import re
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas
import plotly.graph_objects as go
import plotly.io as pio
import plotly.offline

from campaigns.formats.foreign import check_filter_names
from campaigns.model.references import find_reference, measured, run_metrics
from campaigns.model.site import BenchReference, Reference, Site, SiteError, load_site
from campaigns.store import Store
from campaigns.store.store import no_measurements_message
from campaigns.model.vocabulary import BENCHMARK_PARAMETER, MATRIX_OPS, METRICS, reported_metrics
from tuners.writers import write_atomic

if TYPE_CHECKING:
    from campaigns.model.spec import Campaign

QUANTILES = np.linspace(0, 1, 201)
_CSS = """
body { font-family: system-ui, sans-serif; margin: 1.5em; color: #222; }
h1 { font-size: 1.5em; } h2 { font-size: 1.2em; margin-top: 2em; border-bottom: 1px solid #ccc; }
table { border-collapse: collapse; font-size: 0.85em; margin: 0.5em 0; }
td, th { border: 1px solid #ddd; padding: 2px 6px; text-align: left; }
.ok { color: #1a7f37; } .degraded { color: #b58100; font-weight: bold; } .failed { color: #c62828; font-weight: bold; }
.note { color: #555; font-size: 0.9em; }
.plots { display: flex; flex-wrap: wrap; gap: 1em; } .plots > div { flex: 1 1 640px; }
"""


@dataclass(frozen=True)
class Nominal:
    """A nominal link bandwidth drawn dashed on the goodput plots: of one partition (site data: drawn on the plots
    with a curve from it), or of no partition in particular (`--nominal`: drawn on every plot)."""

    label: str
    gbs: float
    site: str | None = None
    system: str | None = None
    partition: str | None = None

    def applies_to(self, partitions: set[tuple[str, str, str]]) -> bool:
        """Whether it belongs on a plot of curves from these (site, system, partition)s."""
        return self.partition is None or (self.site, self.system, self.partition) in partitions


def _nominal_lines(links: list[Nominal], partitions: set[tuple[str, str, str]]) -> list[tuple[str, float]]:
    """(label, GB/s) of each dashed line of one plot: one per label and value; where the plot's curves come from
    several partitions, the label names the partitions the value is theirs."""
    lines: dict[tuple[str, float], list[str]] = {}
    for link in links:
        if link.applies_to(partitions):
            wheres = lines.setdefault((link.label, link.gbs), [])
            if link.partition is not None:
                wheres.append(f"{link.system}:{link.partition}")
    return [(label + (f" ({', '.join(sorted(set(wheres)))})" if wheres and len(partitions) > 1 else ""), gbs)
            for (label, gbs), wheres in sorted(lines.items())]


_LOADER = """
(async () => {
  const packed = document.getElementById('plotly-js-gzip').textContent;
  const bytes = Uint8Array.from(atob(packed), c => c.charCodeAt(0));
  const code = await new Response(new Blob([bytes]).stream().pipeThrough(new DecompressionStream('gzip'))).text();
  (0, eval)(code);  // global scope: defines window.Plotly
  let drawn = 0;
  for (const block of document.querySelectorAll('script.figure')) {
    const figure = JSON.parse(block.textContent);
    await Plotly.newPlot(block.previousElementSibling, figure.data, figure.layout,
                         {displaylogo: false, responsive: true});
    drawn += 1;
  }
  document.body.dataset.plots = String(drawn);
})().catch(error => {
  console.error('report: ' + error);
  document.body.insertAdjacentHTML('afterbegin', '<p style="color:red">Plots could not be drawn: ' + error + '</p>');
});
"""


def _figure_html(fig: go.Figure) -> str:
    fig.update_layout(template="plotly_white", margin=dict(l=60, r=40, t=50, b=50), modebar_orientation="v")
    if fig.layout.height is None:
        fig.update_layout(height=420)
    # "</" inside a script element would end it; "<\/" is the same JSON string.
    spec = pio.to_json(fig, validate=False, pretty=False).replace("</", "<\\/")
    return f"<div><div class='plot'></div><script type='application/json' class='figure'>{spec}</script></div>"


def _plotly_js_packed() -> str:
    return base64.b64encode(gzip.compress(plotly.offline.get_plotlyjs().encode(), compresslevel=9)).decode()


TUNING_CAMPAIGN = "tune"  # campaigns/tuning/session.py stores each trial as a run of this campaign
# What tells two curves apart, in legend order; environment and library are always in the legend.
DIMENSIONS = ("benchmark", "site", "system", "environment", "library", "collective_library", "backend", "transport",
              "nodes", "ranks", "placement", "batch", "dtype", "knobs", "host_memory", "direction", "selection")
ALWAYS_IN_LEGEND = ("environment", "library")


def library_label(text: object) -> str:
    """A library's name and version from MPI_Get_library_version's text (MPICH: a multi-line configure
    dump, tab-separated, sometimes stored with literal backslash escapes)."""
    first = str(text or "").replace("\\n", "\n").replace("\\t", "\t").strip().split("\n")[0]
    first = " ".join(first.split())
    mpich = re.match(r"MPICH Version:\s*(\S+)", first)
    if mpich:
        return f"MPICH {mpich.group(1)}"
    return first.split(",")[0] or "unknown library"


@functools.cache
def _knob_names() -> frozenset[str]:
    """The knob catalog's variables: those of a record's environment that make its knob set."""
    from tuners.catalog import KnobCatalog

    return frozenset(knob.name for knob in KnobCatalog.load())


def benchmark_of(extra: object) -> str:
    """Which benchmark measured a record: its `source.benchmark` (nccl-tests, osu: campaigns.formats.foreign),
    else commbench."""
    source = extra.get("source") if isinstance(extra, dict) else None
    return str(source.get("benchmark") or "commbench") if isinstance(source, dict) else "commbench"


def selection_of(extra: object) -> str | None:
    """The algorithm a selection sweep's record measured (`selection.name`: own or a forced one), else None."""
    selection = extra.get("selection") if isinstance(extra, dict) else None
    return str(selection["name"]) if isinstance(selection, dict) and selection.get("name") else None


def _dimensions(row: pandas.Series) -> dict[str, str]:
    """The text of each of DIMENSIONS for one measurement; "" for one the record does not have (NCCL/RCCL version,
    datatype, host memory, direction and selection are left out of legends and subtitles then)."""
    extra = row["extra"] if isinstance(row["extra"], dict) else {}
    batch = extra.get("batch", 1)
    distance = row.get("network_distance")
    placement = distance if isinstance(distance, str) else row.get("placement") or "any"
    knobs = {k: v for k, v in (row["env"] if isinstance(row["env"], dict) else {}).items() if k in _knob_names()}
    host_memory, direction, selection = row.get("host_memory"), row.get("direction"), selection_of(extra)
    versions = row.get("versions") if isinstance(row.get("versions"), dict) else {}
    collective = " ".join(f"{name.upper()} {versions[name]}" for name in ("nccl", "rccl") if versions.get(name))
    dtype = row.get("dtype")
    return {"benchmark": benchmark_of(extra), "site": str(row["site"]),
            "system": f"{row['system']}:{row['partition']}",
            "environment": str(row["environ"]), "library": library_label(row["mpi_library"]),
            # NCCL/RCCL runs of two versions, host and device buffers, two datatypes: not one curve
            "collective_library": collective, "backend": f"{row['backend']} backend",
            "transport": str(row["transport"]), "nodes": f"{row['nodes']} node(s)", "ranks": f"{row['ranks']} ranks",
            "placement": f"placement {placement}",
            # nccl-tests' throughput method, not per-op latency
            "batch": f"batch {batch}" if batch > 1 else "per-op timing",
            "dtype": str(dtype) if isinstance(dtype, str) and dtype else "",
            "knobs": "knobs " + (" ".join(f"{k}={v}" for k, v in sorted(knobs.items())) or "unset"),
            # h2d/d2h from pinned or pageable host memory: several times apart at the same size
            "host_memory": f"{host_memory} host memory" if isinstance(host_memory, str) else "",
            "direction": f"direction {direction}" if isinstance(direction, str) else "",
            # a selection sweep (--selections): one curve per algorithm measured
            "selection": f"selection {selection}" if selection else ""}


def with_series(frame: pandas.DataFrame) -> pandas.DataFrame:
    """The frame with `series` (one text per group of runs that may be pooled) and `dimensions`."""
    dimensions = frame.apply(_dimensions, axis=1)
    return frame.assign(dimensions=dimensions, series=[" | ".join(d[k] for k in DIMENSIONS) for d in dimensions])


def describe_series(rows: pandas.DataFrame, leave_out: tuple[str, ...] = ()) -> tuple[dict[str, str], str]:
    """Legend label per series of one plot (what differs, plus environment and library) and what every
    series of the plot shares (its subtitle); `leave_out`: dimensions the plot's title names itself."""
    groups = {series: dims for series, dims in zip(rows["series"], rows["dimensions"], strict=True)}
    shown = [k for k in DIMENSIONS if k not in leave_out]
    varying = [k for k in shown if len({d[k] for d in groups.values()}) > 1 or k in ALWAYS_IN_LEGEND]
    labels = {series: ", ".join(dims[k] for k in varying if dims[k]) for series, dims in groups.items()}
    first = next(iter(groups.values()))
    return labels, "; ".join(first[k] for k in shown if k not in varying and first[k])


def _subtitled(title: str, common: str) -> str:
    return f"{html.escape(title)}<br><sup>{html.escape(common)}</sup>" if common else html.escape(title)


def goodput_section(frame: pandas.DataFrame, nominal: list[Nominal]) -> str:
    results = frame[(frame["kind"] == "result") & frame["valid"] & ~frame["op"].isin(MATRIX_OPS)
                    & frame["goodput_gbs"].notna() & (frame["bytes"] > 0)]
    if results.empty:
        return ""
    parts: list[str] = []
    drawn: dict[tuple[str, float], None] = {}  # the lines drawn on any plot, in order
    for op, rows in results.groupby("op", sort=True):
        fig = go.Figure()
        labels, common = describe_series(rows)
        for series, points in rows.groupby("series", sort=True):
            curve = points.groupby("bytes")["goodput_gbs"].median().sort_index()
            fig.add_trace(go.Scatter(x=curve.index, y=curve.values, mode="lines+markers", name=labels[series],
                                     hovertemplate="%{x} B: %{y:.3g} GB/s"))
        # the links of the partitions this plot's curves ran on, not every partition's (a label is no key)
        for label, gbs in _nominal_lines(nominal, set(zip(rows["site"], rows["system"], rows["partition"]))):
            drawn[(label, gbs)] = None
            fig.add_hline(y=gbs, line_dash="dash", line_color="#555")
            # On a log axis an annotation's y is log10 of the value (add_hline's own annotation gets it wrong).
            fig.add_annotation(x=0, xref="paper", y=math.log10(gbs), yref="y", showarrow=False,
                               xanchor="left", yanchor="bottom", text=f"{label} nominal {gbs:g} GB/s",
                               font=dict(size=10, color="#555"))
        fig.update_layout(title=_subtitled(f"{op}: goodput, median over the runs of each curve", common),
                          legend=dict(orientation="h", yanchor="top", y=-0.2), height=520)
        fig.update_xaxes(type="log", title="message size (bytes)", exponentformat="power")
        fig.update_yaxes(type="log", title="goodput (GB/s)")
        parts.append(_figure_html(fig))
    note = ("Nominal link bandwidths dashed: " + ", ".join(f"{label} {gbs:g} GB/s" for label, gbs in drawn)
            if drawn else "No nominal link bandwidth known for the partitions shown (site data or --nominal).")
    return (f"<h2>Goodput vs message size</h2><p class='note'>{html.escape(note)}</p>"
            f"<div class='plots'>{''.join(parts)}</div>")


def _pair_matrix(rows: pandas.DataFrame, column: str) -> tuple[list[int], np.ndarray]:
    ranks = sorted(set(rows["pair_src"].astype(int)) | set(rows["pair_dst"].astype(int)))
    index = {rank: i for i, rank in enumerate(ranks)}
    matrix = np.full((len(ranks), len(ranks)), np.nan)
    for (src, dst), value in rows.groupby(["pair_src", "pair_dst"])[column].median().items():
        matrix[index[int(src)], index[int(dst)]] = value
        if np.isnan(matrix[index[int(dst)], index[int(src)]]):
            matrix[index[int(dst)], index[int(src)]] = value  # a pair measured one way shows both ways
    return ranks, matrix


def heatmap_section(frame: pandas.DataFrame) -> str:
    pairs = frame[(frame["op"] == "pairmatrix") & (frame["kind"] == "result") & frame["valid"]
                  & frame["pair_src"].notna()]
    if pairs.empty:
        return ""
    parts = []
    labels, common = describe_series(pairs, leave_out=("direction",))  # each heatmap's title names its direction
    for (series, direction), rows in pairs.groupby(["series", "direction"], sort=True):
        small, large = rows["bytes"].min(), rows["bytes"].max()
        bandwidth = "aggregate_gbs" if direction == "bi" and rows["extra"].notna().any() else "goodput_gbs"
        for size, column, what, unit, scale in (
                (small, "latency_us", "latency", "us", "Viridis_r"),
                (large, bandwidth, "aggregate bandwidth" if bandwidth == "aggregate_gbs" else "goodput", "GB/s",
                 "Viridis")):
            at_size = rows[rows["bytes"] == size]
            if column == "aggregate_gbs":
                at_size = at_size.assign(aggregate_gbs=[(e or {}).get("aggregate_gbs") for e in at_size["extra"]])
            at_size = at_size[at_size[column].notna()]
            if at_size.empty:
                continue
            ranks, matrix = _pair_matrix(at_size, column)
            # cpu backend: the pairs are MPI ranks (host memory), not GPUs
            names = [f"{'rank' if rows['backend'].iloc[0] == 'cpu' else 'GPU'} {r}" for r in ranks]
            fig = go.Figure(go.Heatmap(z=matrix, x=names, y=names, colorscale=scale, colorbar_title=unit,
                                       text=np.vectorize(lambda v: "" if np.isnan(v) else f"{v:.3g}")(matrix),
                                       texttemplate="%{text}", hovertemplate="%{y} -> %{x}: %{z:.4g} " + unit))
            fig.update_layout(title=_subtitled(f"{labels[series]}: {direction} {what} at {int(size)} B", common),
                              height=460)
            fig.update_yaxes(autorange="reversed", title="source")
            fig.update_xaxes(title="destination")
            parts.append(_figure_html(fig))
    return f"<h2>GPU / rank pairs</h2><div class='plots'>{''.join(parts)}</div>"


def _picked_sizes(sizes: list[int]) -> list[int]:
    sizes = sorted(set(sizes))
    return sorted({sizes[0], sizes[len(sizes) // 2], sizes[-1]})


def distribution_section(frame: pandas.DataFrame, samples: dict[int, np.ndarray]) -> str:
    rows = frame[(frame["kind"] == "result") & frame["valid"] & frame["measurement_id"].isin(samples.keys())
                 & ~frame["op"].isin(MATRIX_OPS)]
    if rows.empty:
        return ""
    parts, table = [], []
    for op, by_op in rows.groupby("op", sort=True):
        fig = go.Figure()
        labels, common = describe_series(by_op)
        for series, by_series in by_op.groupby("series", sort=True):
            for size in _picked_sizes(list(by_series["bytes"])):
                ids = by_series[by_series["bytes"] == size]["measurement_id"]
                values = np.concatenate([samples[i] for i in ids])
                fig.add_trace(go.Violin(y=np.quantile(values, QUANTILES), name=f"{labels[series]}: {int(size)} B",
                                        box_visible=True, meanline_visible=False, points=False, spanmode="hard"))
                p50, p95, p99 = np.percentile(values, [50, 95, 99])
                table.append({"op": op, "series": labels[series], "bytes": int(size), "samples": len(values),
                              "p50 us": f"{p50:.4g}", "p95 us": f"{p95:.4g}", "p99 us": f"{p99:.4g}",
                              "max us": f"{values.max():.4g}"})
        fig.update_layout(title=_subtitled(f"{op}: per-iteration times (violin of 201 quantiles, box: quartiles)",
                                           common), showlegend=False)
        fig.update_xaxes(tickangle=20)
        fig.update_yaxes(type="log", title="time per iteration (us)")
        parts.append(_figure_html(fig))
    return (f"<h2>Per-iteration time distributions</h2><div class='plots'>{''.join(parts)}</div>"
            f"{pandas.DataFrame(table).to_html(index=False, border=0)}")


@dataclass
class ReferenceSource:
    """The references a run's metrics are judged against in the trend: `first` (a campaign's own, its spec's),
    then those of the site, system and partition the run ran on (site data: `sites` where given, else loaded by
    name), as health judges them. Never another partition's: its reference is no band for this one."""

    first: tuple[Reference | BenchReference, ...] = ()
    sites: dict[str, Site | None] = field(default_factory=dict)

    def of(self, site: str, system: str, partition: str) -> list[Reference | BenchReference]:
        if site not in self.sites:
            try:
                self.sites[site] = load_site(site)
            except SiteError:
                self.sites[site] = None  # measurements ingested under a site name without site data
        data = self.sites[site]
        try:
            own = list(data.system(system).partition(partition).references) if data is not None else []
        except KeyError:
            own = []  # a system or partition the site data does not have (any more)
        return [*self.first, *own]


def trend_section(frame: pandas.DataFrame, runs: pandas.DataFrame, references: ReferenceSource) -> str:
    """One plot per health series and metric: its value night by night, the reference band. The nights are the
    runs health judges (`measured`): a night that failed only its performance check is shown, marked."""
    points = []
    for run in runs.itertuples():
        if not pandas.notna(run.tag) or run.pair or not measured(run):
            continue
        records = frame[frame["run_id"] == run.id]
        op = run.op if isinstance(run.op, str) else records["op"].iloc[0]  # a reference check's: its benchmark
        for (metric, size), value in run_metrics(records, reported_metrics(run.check, op)).items():
            points.append({"series": run.series, "metric": metric, "bytes": size, "tag": run.tag, "value": value,
                           "placement": run.placement, "site": records["site"].iloc[0],
                           "system": records["system"].iloc[0], "partition": records["partition"].iloc[0],
                           "check": run.check, "op": op, "nodes": run.num_nodes, "environ": run.environ,
                           "ranks": int(records["ranks"].iloc[0]), "transport": records["transport"].iloc[0],
                           "status": run.status if run.status == "pass" else f"{run.status}: {run.reason}"})
    if not points:
        return ""
    parts, any_reference = [], False
    for (_series, metric, size), rows in pandas.DataFrame(points).groupby(["series", "metric", "bytes"], sort=True):
        rows = rows.sort_values("tag")
        first = rows.iloc[0]
        passed = rows["status"] == "pass"
        fig = go.Figure(go.Scatter(x=rows["tag"], y=rows["value"], mode="lines+markers", name="measured",
                                   text=rows["status"], hovertemplate="%{x}: %{y:.4g} (%{text})<extra></extra>",
                                   marker=dict(color=["#1f77b4" if ok else "#c62828" for ok in passed],
                                               symbol=["circle" if ok else "x" for ok in passed], size=9)))
        references_here = references.of(first["site"], first["system"], first["partition"])
        any_reference = any_reference or bool(references_here)
        ref = find_reference(references_here, _CaseLike(first["check"], first["op"], int(first["nodes"]),
                                                         int(first["ranks"]), first["environ"], first["transport"]),
                             metric, int(size))
        if ref is not None:  # an open side of the band reaches past the data (a log axis has no 0)
            open_low = ref.lower is None or ref.lower <= -1
            low = min(ref.value, rows["value"].min()) / 2 if open_low else ref.value * (1 + ref.lower)
            high = ref.value * (1 + ref.upper) if ref.upper is not None else max(ref.value, rows["value"].max()) * 2
            fig.add_hrect(y0=low, y1=high, fillcolor="green", opacity=0.12, line_width=0,
                          annotation_text="reference band", annotation_position="top left")
            fig.add_hline(y=ref.value, line_dash="dot", line_color="green")
        fig.add_hline(y=float(rows["value"].median()), line_dash="dash", line_color="#888",
                      annotation_text="median of the nights shown")
        where = "" if first["placement"] == "any" else f" {first['placement']}"
        what = f"{first['environ']} {first['op']} {first['nodes']}n{where}: {metric} @ {size} B"
        shared = f"{first['site']}:{first['system']}:{first['partition']}, {first['transport']}, {first['ranks']} ranks"
        if not passed.all():
            shared += "; x: the run failed its performance check"
        fig.update_layout(title=_subtitled(what, shared), showlegend=False, height=340)
        fig.update_xaxes(type="category", title="night")
        # log: a wide reference band (e.g. 10x) would squash the nights' spread on a linear axis
        fig.update_yaxes(type="log", title=METRICS[metric].unit)
        parts.append(_figure_html(fig))
    note = "" if any_reference else "<p class='note'>No references in the site data of these measurements.</p>"
    return f"<h2>Nightly trends</h2>{note}<div class='plots'>{''.join(parts)}</div>"


@dataclass(frozen=True)
class _CaseLike:
    """What find_reference reads of a test case."""

    check: str
    op: str
    num_nodes: int
    num_tasks: int
    environ: str
    transport: str


def _value_text(value: float | None, unit: str) -> str:
    return "-" if value is None else f"{value:.4g} {html.escape(unit)}"


def health_section(verdicts: list[dict[str, Any]], placements: dict[str, str]) -> str:
    """The verdicts' tables; `placements`: run key -> placement of the runs the store has."""
    if not verdicts:
        return ""
    parts = ["<h2>Health summary</h2>"]
    for verdict in verdicts:
        status = verdict["status"]
        parts.append(f"<h3>{html.escape(verdict['campaign'])} night {html.escape(str(verdict['tag']))}: "
                     f"<span class='{status}'>{status}</span></h3>")
        rows = "".join(
            f"<tr><td class='{m['status']}'>{m['status']}</td><td>{html.escape(m['environ'])}</td>"
            f"<td>{html.escape(m['op'])}</td><td>{m['num_nodes']}</td>"
            f"<td>{html.escape(placements.get(m.get('run_key', ''), 'not in the store'))}</td>"
            f"<td>{html.escape(' '.join(m.get('hosts') or []) or '-')}</td><td>{html.escape(m['metric'])}"
            f"{'' if m['bytes'] is None else '@' + str(m['bytes'])}</td>"
            f"<td>{_value_text(m['value'], m['unit'])}</td>"
            f"<td>{html.escape('; '.join(m['evidence']))}</td></tr>"
            for m in verdict["metrics"])
        parts.append("<table><tr><th>status</th><th>env</th><th>op</th><th>nodes</th><th>placement</th>"
                     "<th>hosts</th><th>metric</th><th>value</th>"
                     f"<th>evidence</th></tr>{rows}</table>")
        nodes = "".join(f"<tr><td>{html.escape(n)}</td><td class='{v['status']}'>{v['status']}"
                        f"{': ' + html.escape(v['reason']) if v.get('reason') else ''}</td>"
                        f"<td>{html.escape('; '.join(v['evidence']))}</td></tr>"
                        for n, v in sorted(verdict["nodes"].items()))
        parts.append(f"<table><tr><th>node</th><th>status</th><th>evidence</th></tr>{nodes}</table>")
        parts.append(slow_nodes_table(verdict.get("slow_nodes") or []))
        iso = verdict.get("isolation")
        if iso:
            culprits = ", ".join(iso["culprit_nodes"] + [f"{a}<->{b}" for a, b in iso["culprit_links"]]) or "none"
            path = ("named by the degraded run's per-rank times, confirmed by pair test(s)"
                    if iso.get("path") == "attribution" else "pair tests between the nodes involved")
            parts.append(f"<p>Isolation: culprit(s) {html.escape(culprits)}; path: {path}, "
                         f"{iso.get('extra_jobs', len(iso['pairs']))} extra job(s)"
                         + (f" ({html.escape(iso['attribution'])})" if iso.get("attribution") else "")
                         + "; pairs: "
                         + html.escape(", ".join(f"{'+'.join(p['nodes'])} {p['status']}" for p in iso["pairs"]))
                         + (f"; {html.escape(iso['note'])}" if iso.get("note") else "") + "</p>")
    return "".join(parts)


def slow_nodes_table(slow: list[dict[str, Any]]) -> str:
    """Fail-slow nodes (`degraded: slow`) with their evidence: tonight's time against its own history and
    against its peers of the same record, and that ratio's history."""
    if not slow:
        return ""

    def history(h: dict[str, Any]) -> str:
        return f"median {h['median']:.4g}, spread {h['spread']:.3g} over {h['nights']} night(s)" if h else "-"

    def ratio_history(h: dict[str, Any]) -> str:
        if "log_sd" not in h:  # a verdict written before the ratio's t-test (2026-11-26): judged like a time
            return history(h)
        return (f"geometric mean {h['mean']:.3g}, log sd {h['log_sd']:.3g} over {h['nights']} night(s); "
                f"t {h['t']:.3g}, p {h['p']:.2g}")

    rows = "".join(
        f"<tr><td>{html.escape(s['node'])}</td><td class='degraded'>degraded: slow</td>"
        f"<td>{html.escape(s['op'])}@{s['bytes']}</td><td>{s['value_us']:.4g} us</td>"
        f"<td>{html.escape(history(s['history']))} us</td>"
        f"<td>{html.escape(', '.join(f'{h} {v:.4g}' for h, v in sorted(s['peers_us'].items())))} us</td>"
        f"<td>{s['peer_ratio']:.3g}x</td><td>{html.escape(ratio_history(s['ratio_history']))}</td>"
        f"<td>{html.escape('; '.join(s['evidence']))}</td></tr>" for s in slow)
    return ("<table><tr><th>node</th><th>status</th><th>record</th><th>its time tonight</th><th>its history</th>"
            "<th>peers tonight</th><th>ratio to peers</th><th>ratio history</th><th>evidence</th></tr>"
            f"{rows}</table>")


def _runs_frame(store: Store, run_ids: list[int]) -> pandas.DataFrame:
    wanted = set(run_ids)
    runs = [run for run in store.runs() if run.id in wanted]
    return pandas.DataFrame([{
        "id": run.id, "run_key": run.run_key, "status": run.status, "reason": run.reason, "environ": run.environ,
        "num_nodes": run.num_nodes, "check": run.check_name,
        "op": run.parameters.get("op", run.parameters.get(BENCHMARK_PARAMETER)), "tag": run.parameters.get("tag"),
        "pair": bool(run.parameters.get("nodelist")), "network_distance": run.parameters.get("network_distance"),
        "placement": run.parameters.get("placement", "any"), "series": run.run_key.rsplit("@", 1)[0]} for run in runs],
        columns=["id", "run_key", "status", "reason", "environ", "num_nodes", "check", "op", "tag", "pair",
                 "network_distance", "placement", "series"])


def build_report(store: Store, *, title: str, nominal: list[Nominal], verdicts: list[dict[str, Any]],
                 include_tuning: bool = False, references: ReferenceSource | None = None, **filters: Any) -> str:
    """The report of the measurements `filters` select; tuning trials only with `include_tuning` (or when
    the filters ask for campaign `tune`). ValueError for an op, transport or backend no record can have, for
    filters that select nothing (as `results list` and `results export`) and for a selection without one valid
    result (every plot shows valid results only: the report would be empty). `references`: where the trend's
    reference bands come from (default: the site data of each run's partition)."""
    check_filter_names(**filters)
    frame = store.measurements(**filters)
    if frame.empty:
        raise ValueError(no_measurements_message(store.url, filters))
    tuning = frame["campaign"] == TUNING_CAMPAIGN
    asked = include_tuning or TUNING_CAMPAIGN in (filters.get("campaign") or [])
    left_out = 0 if asked else frame[tuning]["run_id"].nunique()
    if left_out:
        frame = frame[~tuning]
        if frame.empty:
            raise ValueError(f"only tuning trials (campaign {TUNING_CAMPAIGN}) match the filters; "
                             "--include-tuning shows them")
    if not ((frame["kind"] == "result") & frame["valid"].astype(bool)).any():
        raise ValueError(f"{len(frame)} measurements match the filters, none valid: the report shows valid results "
                         "only (`commcamp results list` shows the others)")
    runs = _runs_frame(store, sorted(set(frame["run_id"])))
    frame = with_series(frame.merge(runs[["id", "network_distance", "placement"]].rename(columns={"id": "run_id"}),
                                    on="run_id", how="left"))
    samples = store.sample_arrays(**filters)
    verdict_keys = {m.get("run_key") for verdict in verdicts for m in verdict["metrics"]}
    placements = {run.run_key: run.parameters.get("placement", "any") for run in store.runs()
                  if run.run_key in verdict_keys} if verdicts else {}
    sections = [goodput_section(frame, nominal), heatmap_section(frame), distribution_section(frame, samples),
                trend_section(frame, runs, references if references is not None else ReferenceSource()),
                health_section(verdicts, placements)]
    provenance = (frame.assign(library=frame["mpi_library"].map(library_label))
                  .groupby(["site", "system", "campaign", "environ", "library", "backend", "commbench_version"],
                           dropna=False)
                  .agg(runs=("run_id", "nunique"), measurements=("measurement_id", "size"),
                       first=("timestamp", "min"), last=("timestamp", "max")).reset_index())
    generated = datetime.now(UTC).isoformat(timespec="seconds")
    shown_filters = {k: v for k, v in filters.items() if v is not None and v != []}  # valid=False is a filter
    tuning_note = (f" {left_out} tuning-trial runs (campaign {TUNING_CAMPAIGN}) left out: --include-tuning shows "
                   "them." if left_out else "")
    header = (f"<h1>{html.escape(title)}</h1><p class='note'>Generated {generated} from {html.escape(store.url)}"
              f" with filters {html.escape(json.dumps(shown_filters, default=str))}: "
              f"{frame['run_id'].nunique()} runs, {len(frame)} measurements.{tuning_note} Each curve pools only "
              "runs of one benchmark, site, system, environment, library (and NCCL/RCCL version), backend, "
              "transport, node and rank count, placement, batch, datatype, knob set, host memory, direction and "
              "selection; plots and distributions show valid "
              "measurements only.</p>"
              f"{provenance.to_html(index=False, border=0)}")
    return (f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
            f"<style>{_CSS}</style></head><body>{header}{''.join(sections)}"
            f"<script type='application/octet-stream' id='plotly-js-gzip'>{_plotly_js_packed()}</script>"
            f"<script>{_LOADER}</script></body></html>")


_LINK_LABELS = {"gpu_pair": "GPU-GPU link", "nic": "NIC", "host_device": "host-device link"}


def site_nominal(site_name: str, system_names: list[str] | None = None,
                 partition_names: list[str] | None = None) -> list[Nominal]:
    """Nominal link bandwidths per direction from the site's data, one per partition (its `links`: gpu_pair, nic,
    host_device; a range gives its two ends), of the systems and partitions named (all when None). A name without
    site data has none."""
    try:
        site = load_site(site_name)
    except SiteError:
        return []
    found = []
    for system in site.systems:
        if system_names and system.name not in system_names:
            continue
        for partition in system.partitions:
            if partition_names and partition.name not in partition_names:
                continue
            links = getattr(partition, "links", None)
            for name, bandwidth in (links.model_dump(exclude_none=True) if links is not None else {}).items():
                if name not in _LINK_LABELS:
                    continue  # not a bandwidth (nic_latency)
                label = _LINK_LABELS[name]
                ends = ([(label, bandwidth["gbs"])] if bandwidth.get("gbs") else
                        [(f"{label} (min)", bandwidth["min_gbs"]), (f"{label} (max)", bandwidth["max_gbs"])])
                found += [Nominal(text, gbs, site.name, system.name, partition.name) for text, gbs in ends]
    return sorted(found, key=lambda n: (n.label, n.system or "", n.partition or ""))


def write_campaign_report(store: Store, campaign: Campaign, output: Path) -> None:
    """A characterize campaign's report: its own site and system; each trend judged against the campaign's own
    references first, then those of the run's partition (as health judges). ValueError (build_report) when the
    campaign stored nothing to show."""
    references = ReferenceSource(first=tuple(campaign.spec.references), sites={campaign.site.name: campaign.site})
    text = build_report(store, title=f"{campaign.name} on {campaign.site.name}:{campaign.system.name}",
                        nominal=site_nominal(campaign.site.name, [campaign.system.name]), verdicts=[],
                        references=references, campaign=[campaign.name], site=[campaign.site.name],
                        system=[campaign.system.name])
    write_atomic(output, text)
