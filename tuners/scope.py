"""The scope a study and its recommendation belong to."""

from __future__ import annotations

import re

from pydantic import BaseModel, ConfigDict, Field, field_validator

from tuners.catalog import Library

# Scope fields end up in study names, file names and comments: keep them to a plain alphabet.
SCOPE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.+-]*")


class StudyScope(BaseModel):
    """Site, system:partition, library+version, op, transport, node count, GPUs per node, ranks per node and
    the message-size bucket ("all" when one study scores every bucket of the sweep). Ranks per node None: a
    scope published before it named them."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    site: str
    system: str
    partition: str = "default"
    library: Library
    library_version: str
    op: str
    transport: str
    # strict: a hand-edited recommendations.yaml's `nodes: true` or `nodes: "1"` is no node count (read as 1 before)
    nodes: int = Field(ge=1, strict=True)
    gpus_per_node: int = Field(ge=1, strict=True)
    size_bucket: str = "all"
    # a CPU scope has 1 GPU per node, whatever its ranks: 1 and 4 ranks per node are two measurements
    tasks_per_node: int | None = Field(default=None, ge=1, strict=True)

    @field_validator("site", "system", "partition", "library_version", "op", "transport", "size_bucket")
    @classmethod
    def _plain(cls, value: str) -> str:
        if not SCOPE_NAME.fullmatch(value):
            raise ValueError(f"{value!r} must match {SCOPE_NAME.pattern}")
        return value

    @property
    def ranks(self) -> int:
        return self.nodes * self.gpus_per_node

    @property
    def study_name(self) -> str:
        return (
            f"{self.site}/{self.system}:{self.partition}/{self.library}-{self.library_version}/"
            f"{self.op}/{self.transport}/{self.size_bucket}/n{self.nodes}/g{self.gpus_per_node}{self._tasks('/t')}"
        )

    def _tasks(self, prefix: str) -> str:
        return "" if self.tasks_per_node is None else f"{prefix}{self.tasks_per_node}"

    @property
    def slug(self) -> str:
        """File-name form, unique within one <site>/<system> directory."""
        return (
            f"{self.partition}_{self.library}-{self.library_version}_{self.op}_{self.transport}_"
            f"{self.size_bucket}_n{self.nodes}_g{self.gpus_per_node}{self._tasks('_t')}"
        )

    def describe(self) -> str:
        return (
            f"site={self.site} system={self.system}:{self.partition} library={self.library} "
            f"{self.library_version} op={self.op} transport={self.transport} nodes={self.nodes} "
            f"gpus_per_node={self.gpus_per_node}{self._tasks(' tasks_per_node=')} sizes={self.size_bucket}"
        )
