"""Where the commands write, checked before they do any work (one home for `run`, `tune`, `pretune`, `report` and
`results export`): each output can be written, or a ValueError naming its option (the commands exit 2)."""
from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from campaigns import paths

# What the --help of an output file option says of `-` (standard output is not one of commcamp's outputs)
NOT_STDOUT = "'-' is refused: give a file name"


def check_outputs(files: Mapping[str, Path | None], directories: Mapping[str, Path | None],
                  in_job_env: Mapping[str, Path | None] | None = None) -> None:
    """Before any run: each output can be written, or ValueError naming its option. A file (--summary,
    --env-file, --output) goes into a directory that exists (none is made for it); `-` is no file (nothing writes
    to standard output); a symbolic link's file is what is replaced (tuners.writers.write_target), and one that is
    not a regular file (a directory, a device such as /dev/full, a FIFO) is refused. A directory (--publish-dir,
    --runs-dir) exists or is made under the nearest one above it that does. Either must take new files.
    `in_job_env`: paths that jobs get in their environment (the per-size rules' files under --publish-dir and
    --runs-dir, the tuner plugin): resolved, each must be a safe value (tuners.catalog.check_safe_value), which
    publish would refuse after the whole tune."""
    from tuners.writers import write_target

    for option, path in (in_job_env or {}).items():
        if path is not None:
            check_safe_path(option, path)
    for option, path in files.items():
        if path is not None and str(path) == "-":
            raise ValueError(f"{option} -: give a file name (this command does not write to standard output)")
    named = [(option, _resolved(option, path)) for option, path in files.items() if path is not None]
    for i, (option, path) in enumerate(named):
        other = next((o for o, p in named[:i] if p == path), None)
        if other is not None:  # the second would overwrite the first
            raise ValueError(f"{other} and {option} name the same file {path}")
    for option, path in [*files.items(), *directories.items()]:
        if path is None:
            continue
        if option in files:
            try:
                target = write_target(path)
            except OSError as exc:
                raise ValueError(f"{option} {path}: {exc.strerror}") from None
            where = target.parent
            if not where.is_dir():
                raise ValueError(f"{option} {path}: directory {where} does not exist")
        else:
            where = path
            if path.exists() and not path.is_dir():
                raise ValueError(f"{option} {path}: not a directory")
        try:
            paths.probe_writable(where)
        except OSError as exc:
            refused = Path(exc.filename).parent if exc.filename else where  # the directory that took no file
            raise ValueError(f"{option} {path}: cannot create files in {refused} ({exc.strerror or exc})") from None


def _resolved(option: str, path: Path) -> Path:
    try:
        return path.resolve()
    except (RuntimeError, OSError):  # a symlink loop (RuntimeError up to Python 3.12)
        raise ValueError(f"{option} {path}: is a symbolic link that leads nowhere (a loop)") from None


def check_safe_path(option: str, path: Path) -> None:
    """ValueError naming `option` and the characters of `path` (resolved) that a job's environment may not carry."""
    from tuners.catalog import SAFE_VALUE_PATTERN, UnsafeValueError, check_safe_value

    resolved = str(Path(path).resolve())
    try:
        check_safe_value(resolved, option)
    except UnsafeValueError:
        bad = sorted({char for char in resolved if not SAFE_VALUE_PATTERN.fullmatch(char)})
        names = ", ".join("a space" if char == " " else repr(char) for char in bad)
        raise ValueError(f"{option} {resolved}: has {names}: jobs get this path in their environment (per-size "
                         "rule files, the tuner plugin), where only letters, digits and _ . , : ^ / + = - may appear; "
                         "choose a path without it") from None
