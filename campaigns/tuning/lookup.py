"""What `commcamp recommend` is asked, checked before the lookup (tuners.recommend). A value no tune could
have measured (a name that is not a site, system, op, transport or library, a library version no scope can
hold, a node or GPU count below 1, a size commbench cannot send) is bad input naming its option, never "not
measured": a job script must tell a typo from a context nobody tuned."""
from __future__ import annotations

import re
from pathlib import Path

from campaigns import paths
from campaigns.model import vocabulary
from campaigns.model.site import NAME_PATTERN, find_site_file, load_site
from campaigns.model.sizes import check_measurable, parse_size
from tuners.catalog import Library
from tuners.scope import SCOPE_NAME


def _choice(option: str, value: str | None, choices: tuple[str, ...], what: str) -> None:
    if value is not None and value not in choices:
        raise ValueError(f"{option} {value!r} is not {what} (one of: {', '.join(choices)})")


def check_query(root: Path, site: str, system: str, *, partition: str | None, op: str, nodes: int,
                gpus_per_node: int | None, tasks_per_node: int | None, transport: str | None, library: str | None, library_version: str | None,
                size: str | None) -> int | None:
    """The size in bytes (None when not given); ValueError naming the first bad option otherwise."""
    for option, name in (("--site", site), ("--system", system), ("--partition", partition)):
        if name is not None and not re.fullmatch(NAME_PATTERN, name):
            raise ValueError(f"{option} {name!r} is not a name (a letter, then letters, digits, _ or -)")
    _choice("--op", op, vocabulary.OPS, "a commbench op")
    _choice("--transport", transport, vocabulary.TRANSPORTS, "a commbench transport")
    _choice("--library", library, tuple(Library), "a library of the knob catalog")
    if library_version is not None and not SCOPE_NAME.fullmatch(library_version):
        raise ValueError(f"--library-version {library_version!r} is not a version a tune records (a letter or digit, "
                         "then letters, digits, ., _, + or -)")
    if nodes < 1:
        raise ValueError(f"--nodes {nodes} must be at least 1")
    if gpus_per_node is not None and gpus_per_node < 1:
        # tune records CPU scopes with 1 GPU per node (TuningSpec.gpus_per_node): 0 would match nothing
        raise ValueError(f"--gpus-per-node {gpus_per_node} must be at least 1 (CPU scopes are tuned and published "
                         "with 1; leave it out to match any)")
    if tasks_per_node is not None and tasks_per_node < 1:
        raise ValueError(f"--tasks-per-node {tasks_per_node} must be at least 1 (leave it out to match any)")
    size_bytes = None
    if size is not None:
        try:
            size_bytes = parse_size(size)
            check_measurable([size_bytes])
        except ValueError as exc:
            raise ValueError(f"--size {size}: {exc}") from None
    _check_names(root, site, system, partition)
    return size_bytes


def _check_names(root: Path, site: str, system: str, partition: str | None) -> None:
    """Known: described by the site's site.yaml or published under `root`. A site without site.yaml (known by
    its knob file or what it published) describes no systems: any system is taken, as tune takes it."""
    published = root / site
    if find_site_file(site) is None:
        if published.is_dir() or (paths.KNOBS_DIR / f"{site}.yaml").is_file():
            return
        raise ValueError(f"--site {site!r} is not a site: no site.yaml on the site path, nothing published "
                         f"under {root}")
    systems = {s.name: [p.name for p in s.partitions] for s in load_site(site).systems}
    if system in systems:
        if partition is not None and partition not in systems[system]:
            raise ValueError(f"partition {partition!r} (--system {system}:{partition} or --partition) is not a "
                             f"partition of {site}/{system} "
                             f"(it has: {', '.join(systems[system])})")
        if partition is None and len(systems[system]) > 1:  # a job on one got another's settings
            raise ValueError(f"--system {system} has several partitions ({', '.join(systems[system])}): give "
                             f"system:partition (--system {system}:{systems[system][0]})")
    elif not (published / system).is_dir():
        raise ValueError(f"--system {system!r} is not a system of site {site!r} (it has: {', '.join(systems)})")
