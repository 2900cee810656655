"""The presets table of the README: what a run of each preset gets, for every key some preset sets."""

from __future__ import annotations

from typing import Any

from triskele.train.config.overrides import make_config
from triskele.train.config.presets import PRESETS
from triskele.train.config.schema import flat_keys


def _cell(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    return repr(value) if isinstance(value, float) else str(value)


def presets_table() -> str:
    """The README's preset table: a row per preset with what a run of it gets for every key some preset
    sets (blank: not a key of that preset's domain); keys every preset gives the same value follow the table."""
    rows = {name: flat_keys(make_config(name).to_dict()) for name in PRESETS}
    set_by_some = {key for name in PRESETS for key in flat_keys(PRESETS[name])}
    keys = list(dict.fromkeys(key for row in rows.values() for key in row if key in set_by_some))
    cells = {key: [_cell(rows[name][key]) if key in rows[name] else "" for name in PRESETS] for key in keys}
    shared = [key for key in keys if len(set(cells[key])) == 1]
    columns = [key for key in keys if key not in shared]
    lines = ["| preset | " + " | ".join(f"`{key}`" for key in columns) + " |",
             "|" + "---|" * (len(columns) + 1)]
    lines += [f"| `{name}` | " + " | ".join(cells[key][i] for key in columns) + " |" for i, name in enumerate(PRESETS)]
    if shared:
        lines += ["", "Every preset: " + ", ".join(f"`{key}={cells[key][0]}`" for key in shared) + "."]
    return "\n".join(lines) + "\n"
