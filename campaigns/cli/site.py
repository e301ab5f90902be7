"""`commcamp site ...`: the sites under site_configs/: list them, check their files, show their data.
campaigns/cli/app.py mounts it with register(app).

`commcamp site check SITE` (or `--all`) validates site.yaml, the ReFrame configuration it produces, the
knob overrides against the catalog, env.sh and the Spack environment (campaigns.model.site.check_site) and
prints every problem as `FILE: key: message`; it warns (stderr) about each site.yaml value that still says EDIT
(a template's placeholder: campaigns.model.site.edit_placeholders), which is not a problem. Exit codes: 0 sound
(warnings or not), 1 problems found, 2 unknown site or bad usage.
"""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Optional

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from campaigns import paths
from campaigns.exit_codes import ExitCode

if TYPE_CHECKING:  # site.yaml's models (pydantic) load when a command runs: `commcamp --help` stays fast
    from campaigns.model.site import Bandwidth



def _gbs(bandwidth: Bandwidth | None) -> str:
    if bandwidth is None:
        return "-"
    value = f"{bandwidth.gbs:g}" if bandwidth.gbs is not None else f"{bandwidth.min_gbs:g}-{bandwidth.max_gbs:g}"
    return value + ("" if bandwidth.verified else " (unverified)")


def list_sites() -> None:
    """The sites, their partitions and what the suite runs there."""
    from campaigns.model.site import SiteError, available_sites, load_site

    table = Table(title="Sites (<site>/site.yaml on the search path: `commcamp paths`)", title_justify="left")
    for column in ("site", "partition", "scheduler", "nodes", "GPUs/node", "backend", "transports", "facts"):
        table.add_column(column)
    for name in available_sites():
        try:
            site = load_site(name)
        except SiteError as exc:
            table.add_row(name, f"[red]invalid: {escape(str(exc).splitlines()[0])}[/]", *[""] * 6)
            continue
        for system in site.systems:
            for part in system.partitions:
                commbench = part.commbench
                table.add_row(name, f"{system.name}:{part.name}", part.scheduler, str(part.nodes), str(part.node.gpus),
                              commbench.backend if commbench else "-",
                              ", ".join(commbench.transports) if commbench else "-",
                              "verified" if part.node.verified else "unverified")
    Console().print(table)


def show(site_name: Annotated[str, typer.Argument(help="a directory under site_configs/")]) -> None:
    """A site's nominal bandwidths, libraries and references: what a measurement is compared with."""
    from campaigns.model.site import SiteError, load_site

    try:
        site = load_site(site_name)
    except SiteError as exc:
        Console(stderr=True).print(f"[bold red]{escape(str(exc))}[/]", soft_wrap=True)
        raise typer.Exit(ExitCode.USAGE) from None
    console = Console()
    console.print(f"[bold]{site.name}[/]: {escape(site.description)}")
    if site.network:
        net = site.network
        state = "verified" if net.verified else "unverified"
        console.print(f"network: {escape(net.fabric)}; {escape(net.topology)}; location by {net.location}: "
                      f"{escape(net.location_how)} ({state}; {escape(net.source)})")
    for system in site.systems:
        for part in system.partitions:
            links = part.links
            console.print(f"\n[bold]{system.name}:{part.name}[/] {part.nodes} node(s) x {part.node.gpus} GPU(s) "
                          f"{escape(part.node.gpu_model)}; nominal GB/s per direction: GPU pair "
                          f"{_gbs(links.gpu_pair if links else None)}, NIC {_gbs(links.nic if links else None)}, "
                          f"host<->device {_gbs(links.host_device if links else None)}")
            for lib in part.libraries:
                console.print(f"  {lib.name} {escape(lib.version)} ({'verified' if lib.verified else 'unverified'}: "
                              f"{escape(lib.source)})")
            references = part.commbench.references if part.commbench else []
            console.print(f"  commbench references: {len(references)}; reference benchmarks: "
                          f"{', '.join(b.package for b in part.reference_benchmarks.values()) or 'none'}")


def _warn_placeholders(errors: Console, name: str, placeholders: list[str], listed: bool) -> None:
    """A warning naming the site.yaml values that still say EDIT (`listed`: each, else how many)."""
    if placeholders:
        errors.print(f"[yellow]site {name}: warning: {len(placeholders)} value(s) still say EDIT[/] (a template's "
                     "placeholders: replace each with the site's value" +
                     (")" if listed else f"; `commcamp site check {name}` names them)"), soft_wrap=True,
                     highlight=False)
        for placeholder in placeholders if listed else ():
            errors.print(f"  {escape(placeholder)}", soft_wrap=True, highlight=False)


def check(
    site_name: Annotated[Optional[str], typer.Argument(metavar="SITE", help="a directory under site_configs/")] = None,
    all_sites: Annotated[bool, typer.Option("--all", help="check every site")] = False,
) -> None:
    """Validate a site's files: site.yaml, its ReFrame configuration, knob overrides, env.sh, Spack environment.
    Values still marked EDIT (the template's) are warned about, not counted as problems."""
    from campaigns.model.site import (SiteError, available_sites, check_site, edit_placeholders, find_site_file,
                                      site_file)

    errors = Console(stderr=True)
    if all_sites == (site_name is not None):
        errors.print("give a SITE or --all (one of them)")
        raise typer.Exit(ExitCode.USAGE)
    names = available_sites() if all_sites else [site_name]
    if site_name is not None:
        try:
            site_file(site_name)
        except SiteError as exc:
            errors.print(f"[bold red]{escape(str(exc))}[/]", soft_wrap=True)
            raise typer.Exit(ExitCode.USAGE) from None
    failed = 0
    for name in names:
        assert name is not None
        problems = check_site(name)
        if problems:
            failed += 1
            errors.print(f"[bold red]site {name}: {len(problems)} problem(s)[/]")
            for problem in problems:
                errors.print(f"  {escape(problem)}", soft_wrap=True, highlight=False)
        else:
            Console().print(f"site {name}: ok")
        found = find_site_file(name)  # None: gone since it was listed (check_site named that)
        if found is not None:
            _warn_placeholders(errors, name, edit_placeholders(found), listed=not all_sites)
    if failed:
        raise typer.Exit(ExitCode.FAILED)


def new(
    site_name: Annotated[str, typer.Argument(metavar="NAME", help="the new site's name (its directory's name)")],
    template: Annotated[str, typer.Option("--from", help="the site to start from")] = "generic-slurm",
    directory: Annotated[Optional[Path], typer.Option(
        "--dir", help="where NAME/ goes [default: the first directory of $COMMCAMP_SITE_PATH, else .]")] = None,
) -> None:
    """Scaffold a site in a directory you own (e.g. your site's repository): site.yaml, reframe_config.py and
    env.sh from --from, checked like `site check`, written in one rename (nothing on failure)."""
    from campaigns.model.site import SITE_FILE, SiteError, SiteWriteError, edit_placeholders, new_site, site_search_path

    parent = directory or next(iter(paths.site_path_dirs()), Path.cwd())
    try:
        target = new_site(site_name, template, parent.resolve())
    except SiteError as exc:  # bad NAME, --from or --dir: 2; the files could not be written (a full disk): 1
        Console(stderr=True).print(f"[bold red]{escape(str(exc))}[/]", soft_wrap=True, highlight=False)
        raise typer.Exit(ExitCode.FAILED if isinstance(exc, SiteWriteError) else ExitCode.USAGE) from None
    print(target)
    errors = Console(stderr=True)
    for other in (d / site_name for d in site_search_path() if (d / site_name / SITE_FILE).is_file()
                  and (d / site_name).resolve() != target.resolve()):  # on purpose (an unverified example) or not
        shipped = " (a shipped example: `make demo` and the shipped campaigns run on site local)" \
            if other.parent.resolve() == paths.SITE_CONFIGS_DIR.resolve() else ""
        errors.print(f"site {site_name} hides {escape(str(other))}{shipped} wherever {escape(str(target.parent))} "
                     "comes first on the site search path", soft_wrap=True, highlight=False)
    if target.parent not in [p.resolve() for p in site_search_path()]:
        errors.print(f"add {escape(str(target.parent))} to COMMCAMP_SITE_PATH so that commcamp finds "
                     f"site {site_name}", soft_wrap=True, highlight=False)
    if placeholders := edit_placeholders(target / SITE_FILE):
        errors.print(f"{len(placeholders)} value(s) of {escape(str(target / SITE_FILE))} still say EDIT: replace them "
                     f"(`commcamp site check {site_name}` names those left)", soft_wrap=True, highlight=False)


def register(app: typer.Typer) -> None:
    """Add the `site` command group to the commcamp CLI."""
    sites = typer.Typer(help="The sites ($COMMCAMP_SITE_PATH, then the shipped site_configs/): list, check, show, "
                             "new.", no_args_is_help=True)
    sites.command("list")(list_sites)
    sites.command("check")(check)
    sites.command("show")(show)
    sites.command("new")(new)
    app.add_typer(sites, name="site")
