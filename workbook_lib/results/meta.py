"""What made a results file (its ``_meta``: notebook, headline, completeness, params,
environment, the files beside it and the results it read)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..records import Record

SCHEMA_VERSION = 2


@dataclass
class Meta(Record):
    """What made a results file."""

    notebook: str
    headline: str
    complete: bool = True
    schema_version: int = SCHEMA_VERSION
    snapshot_checksum: str | None = None
    params: dict[str, Any] = field(default_factory=dict)
    environment: dict[str, Any] = field(default_factory=dict)
    files: list[str] = field(default_factory=list)  # written beside the JSON (relative paths)
    inputs: dict[str, str] = field(default_factory=dict)  # results read -> their checksum
