"""Load a YAML file into a pydantic model with errors that name the file, the line and the field path.

Used for every YAML commcamp reads: campaign specs, site data (site_configs/<site>/site.yaml), the knob
catalog, recommendations.yaml, Spack manifests (spack_env/spack_check.py). Duplicate mapping keys are an
error (PyYAML would silently keep the last one), and every problem pydantic finds is reported, each
as `FILE:LINE: field.path: message`.
"""
from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from pathlib import Path
from types import UnionType
from typing import Annotated, Any, Literal, TypeVar, Union, get_args, get_origin

import yaml
from pydantic import (BaseModel, BeforeValidator, ConfigDict, PlainValidator, ValidationError, WrapValidator,
                      model_validator)
from pydantic_core import ErrorDetails, InitErrorDetails, PydanticCustomError

ModelT = TypeVar("ModelT", bound=BaseModel)
Loc = Sequence[str | int]


class YamlModelError(ValueError):
    """A YAML document that cannot be read, parsed or validated; the message lists every problem."""

    def __init__(self, source: str, problems: list[str]) -> None:
        self.source = source
        self.problems = problems
        super().__init__("\n".join(problems))


class YamlModel(BaseModel):
    """Base of every model read from YAML: unknown keys refused, values frozen, and YAML's true/yes where a
    number belongs refused: pydantic would take it as 1 (`nodes: yes`, `iters: true`, `node_counts: [true]`); so
    is a quoted whole number where a plain one belongs (`iters: "10"`: the file says a string; a size takes its
    units)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    @model_validator(mode="before")
    @classmethod
    def _no_bool_for_a_number(cls, data: Any) -> Any:
        # A model validator, not a field validator on "*": pydantic allows none on a discriminator field.
        if not isinstance(data, dict):
            return data
        problems: list[InitErrorDetails] = []
        # a field validator that runs first reads the value itself (a tune's `sizes: [64K]`); a strict model
        # (site.yaml) refuses a string itself, with every other problem of the document
        parsed = {name for v in cls.__pydantic_decorators__.field_validators.values() if v.info.mode != "after"
                  for name in v.info.fields} | (set(cls.model_fields) if cls.model_config.get("strict") else set())
        for name, value in data.items():
            field = cls.model_fields.get(name) if isinstance(name, str) else None
            if field is None:
                continue
            if isinstance(value, bool) and _numeric(field.annotation):
                problems.append(_bool_problem((name,), value))
            elif _quoted_number(value) and _plain_number(field.annotation) and not _parses(field.metadata) \
                    and name not in parsed:
                problems.append(_string_problem((name,), value))
            elif isinstance(value, (list, tuple)) and any(_numeric(item) for item in _item_types(field.annotation)):
                problems += [_bool_problem((name, i), v) for i, v in enumerate(value) if isinstance(v, bool)]
                if any(_plain_number(item) for item in _item_types(field.annotation)) and name not in parsed:
                    problems += [_string_problem((name, i), v) for i, v in enumerate(value) if _quoted_number(v)]
        if problems:
            raise ValidationError.from_exception_data(cls.__name__, problems)
        return data


def _bool_problem(loc: tuple[str | int, ...], value: bool) -> InitErrorDetails:
    return InitErrorDetails(type=PydanticCustomError("bool_for_a_number", "expected a number, not {value}",
                                                     {"value": str(value).lower()}), loc=loc, input=value)


def _quoted_number(value: Any) -> bool:
    """A string pydantic would take as a whole number ("10", " 3 "); others get its own error."""
    if not isinstance(value, str):
        return False
    try:
        int(value)
    except ValueError:
        return False
    return True


def _string_problem(loc: tuple[str | int, ...], value: str) -> InitErrorDetails:
    return InitErrorDetails(type=PydanticCustomError("string_for_a_number", "expected a number, not the string {value}",
                                                     {"value": repr(value)}), loc=loc, input=value)


def _plain_number(annotation: Any) -> bool:
    """Whether a type takes a whole number and no string: int, int | None (not a size type that parses its units,
    an Annotated one). Not a float: YAML 1.1 reads `alpha: 1e-3` (no dot) as a string nobody quoted."""
    members = [m for m in get_args(annotation) or (annotation,)] if get_origin(annotation) in (Union, UnionType) \
        else [annotation]
    return int in members and str not in members and not any(
        get_origin(m) is Annotated and _parses(list(get_args(m)[1:])) for m in members)


def _parses(metadata: list[Any]) -> bool:
    """Whether a field's metadata reads its value itself (a size's BeforeValidator takes "64K")."""
    return any(isinstance(m, (BeforeValidator, PlainValidator, WrapValidator)) for m in metadata)


def _union_members(annotation: Any) -> tuple[Any, ...]:
    if get_origin(annotation) is Annotated:
        return _union_members(get_args(annotation)[0])
    return tuple(m for a in get_args(annotation) for m in _union_members(a)) \
        if get_origin(annotation) in (Union, UnionType) else (annotation,)


def _numeric(annotation: Any) -> bool:
    """Whether a type is a number, or a union of one and no bool (int, float, int | None, Literal[1, 2], ...)."""
    members = _union_members(annotation)
    return bool not in members and any(
        m in (int, float) or (get_origin(m) is Literal and all(type(v) is int for v in get_args(m))) for m in members)


def _item_types(annotation: Any) -> list[Any]:
    """The item types of the list or tuple types in `annotation` (list[int] | None -> [int])."""
    return [get_args(m)[0] for m in _union_members(annotation) if get_origin(m) in (list, tuple) and get_args(m)]


class _UniqueKeyLoader(yaml.SafeLoader):
    """SafeLoader that refuses duplicate keys in a mapping."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            if isinstance(key, (list, dict)):  # `{[a]: 1}`, a typo: unhashable, PyYAML would raise a TypeError
                raise yaml.constructor.ConstructorError(
                    None, None, f"a {type(key).__name__} as a mapping key ({key!r})", key_node.start_mark)
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key {key!r}", key_node.start_mark)
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


def format_loc(loc: Loc) -> str:
    """('checks', 0, 'iters') -> 'checks[0].iters'."""
    text = ""
    for part in loc:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text or "(document)"


class YamlDocument:
    """A parsed YAML file that still knows where each value came from."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.source = str(path)
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise YamlModelError(self.source, [f"{self.source}: cannot read: {exc}"]) from exc
        try:
            self.root = yaml.compose(text, Loader=_UniqueKeyLoader)
            self.data = yaml.load(text, Loader=_UniqueKeyLoader)
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            where = f"{self.source}:{mark.line + 1}" if mark is not None else self.source
            problem = getattr(exc, "problem", None) or str(exc)
            raise YamlModelError(self.source, [f"{where}: malformed YAML: {problem}"]) from exc

    def line_of(self, loc: Loc) -> int | None:
        """1-based line of the deepest node along `loc` that exists in the document."""
        node = self.root
        line = node.start_mark.line + 1 if node is not None else None
        for part in loc:
            child = None
            if isinstance(node, yaml.MappingNode):
                child = next((value for key, value in node.value if key.value == part), None)
            elif isinstance(node, yaml.SequenceNode) and isinstance(part, int) and part < len(node.value):
                child = node.value[part]
            if child is None:
                break
            node, line = child, child.start_mark.line + 1
        return line

    def with_line(self, message: str, outside: tuple[str, ...] = ()) -> str:
        """A message `SOURCE: a.b[0].c: why` about this document (a catalog's or site's knob error) as
        `SOURCE:LINE: a.b[0].c: why`, the line of the deepest key of that path the document has; `outside`: leading
        keys the path names that the document does not have (an override file is the `knobs:` mapping itself)."""
        prefix = f"{self.source}: "
        if not message.startswith(prefix):
            return message
        key = message[len(prefix):].split(": ", 1)[0].split(",")[0].strip()
        loc: list[str | int] = [int(part) if part.isdecimal() else part
                                for part in re.split(r"\.|\[|\]\.?", key) if part]
        if tuple(loc[:len(outside)]) == outside:
            loc = loc[len(outside):]
        line = self.line_of(tuple(loc))
        return message if line is None else f"{self.source}:{line}: {message[len(prefix):]}"

    def problem(self, loc: Loc, message: str) -> str:
        line = self.line_of(loc)
        where = f"{self.source}:{line}" if line is not None else self.source
        return f"{where}: {format_loc(loc)}: {message}"

    def error(self, problems: Iterable[tuple[Loc, str]]) -> YamlModelError:
        return YamlModelError(self.source, [self.problem(loc, message) for loc, message in problems])

    def validate(self, model: type[ModelT]) -> ModelT:
        if not isinstance(self.data, dict):
            kind = "empty" if self.data is None else f"a {type(self.data).__name__}"
            raise YamlModelError(self.source, [f"{self.source}: expected a mapping at the top level, "
                                               f"the document is {kind}"])
        try:
            return model.model_validate(self.data)
        except ValidationError as exc:
            raise self.error(_pydantic_problems(exc, self.data)) from None


def _document_loc(data: Any, loc: Loc, missing: bool) -> list[str | int]:
    """`loc` as a path in the document: without the tags pydantic adds for a discriminated union
    (checks[0].osu_run.benchmarks -> checks[0].benchmarks), each a name that is not a key of the mapping it
    would be in; but the last part of a `missing` error is the missing field."""
    path: list[str | int] = []
    node = data
    for index, part in enumerate(loc):
        if isinstance(node, dict) and part not in node and not (missing and index == len(loc) - 1):
            continue  # a union's tag
        path.append(part)
        inside = (isinstance(node, dict) and part in node) or (
            isinstance(node, list) and isinstance(part, int) and 0 <= part < len(node))
        node = node[part] if inside else None
    return path


def typos_first(exc: ValidationError) -> list[ErrorDetails]:
    """pydantic's errors with the keys a model does not have first: a misspelled key is both an unknown key and the
    "missing" one it leaves, and only the unknown one names the typo."""
    errors = exc.errors(include_url=False)
    return sorted(errors, key=lambda error: error["type"] != "extra_forbidden")


def _pydantic_problems(exc: ValidationError, data: Any) -> list[tuple[Loc, str]]:
    problems = []
    for error in typos_first(exc):
        loc = _document_loc(data, error["loc"], missing=error["type"] == "missing")
        # A model-level validator's message has its own field path; pydantic prefixes "Value error, ".
        message = error["msg"].removeprefix("Value error, ")
        if error["type"] == "extra_forbidden":
            message = "unknown field"
        elif error["type"] == "missing":
            message = "required field is missing"
        elif error["type"] in ("union_tag_invalid", "union_tag_not_found"):  # the field that picks the model
            context = error.get("ctx", {})
            loc.append(str(context.get("discriminator", "")).strip("'"))
            message = (f"Input should be {context.get('expected_tags')} (got {context.get('tag')!r})"
                       if error["type"] == "union_tag_invalid" else "required field is missing")
        elif "input" in error and error["type"] not in ("value_error", "assertion_error", "bool_for_a_number"):
            message = f"{message} (got {error['input']!r})"
        problems.append((tuple(loc), message))
    return problems


def load_yaml_model(path: Path, model: type[ModelT]) -> ModelT:
    """Parse `path` and validate it as `model`; raises YamlModelError naming every problem."""
    return YamlDocument(path).validate(model)
