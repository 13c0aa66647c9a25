"""docs/configuration.md is generated from the configuration models and kept in step with them; the
example configurations parse with the same models and show every key, so none of them can drift."""

from __future__ import annotations

import re
from pathlib import Path

from bridge.core.config import BridgeConfig, PartitionConfig, parse_config
from bridge.manager import config_reference
from bridge.manager.config_reference import REFERENCE, render, tables

ROOT = Path(__file__).parents[2]
EXAMPLE = ROOT / "docs" / "bridge.example.toml"


def test_the_reference_is_what_the_models_generate() -> None:
    assert REFERENCE.read_text(encoding="utf-8") == render(), (
        "docs/configuration.md is stale: run python -m bridge.manager.config_reference"
    )


def test_the_check_mode_fails_on_a_stale_file_and_passes_on_a_fresh_one(tmp_path: Path) -> None:
    reference = tmp_path / "configuration.md"
    assert config_reference.main(["--output", str(reference)]) == 0
    assert config_reference.main(["--check", "--output", str(reference)]) == 0
    reference.write_text(reference.read_text().replace("| `gpu_mode` |", "| `gpu_modes` |"))
    assert config_reference.main(["--check", "--output", str(reference)]) == 1


def test_every_key_has_a_type_a_default_and_a_description() -> None:
    keys = [(table.header, key) for table in tables(BridgeConfig, "", "", array=False) for key in table.keys]
    assert len(keys) > 50
    undescribed = [f"{header} {key.name}" for header, key in keys if len(key.description) < 10]
    assert undescribed == []
    assert all(key.type and key.default for _, key in keys)


def test_defaults_and_types_are_read_from_the_models() -> None:
    rows = {line.split("|")[1].strip(): line for line in render().splitlines() if line.startswith("| `")}
    assert f'`"{PartitionConfig().gpu_mode}"`' in rows["`gpu_mode`"]
    defaults = BridgeConfig(cluster="c", partitions={"p": PartitionConfig()})
    assert f"`{defaults.termination_grace_s}`" in rows["`termination_grace_s`"]
    assert "| integer, >= 0 |" in rows["`termination_grace_s`"]
    assert "| required |" in rows["`cluster`"]
    assert '`"device-plugin"`' in rows["`gpu_mode`"]


def _example_keys(text: str) -> set[tuple[str, str]]:
    """(table header, key) of every key the example sets or shows commented out, partition names
    read as NAME; a table shown by its header counts as a key of the table above it."""
    found: set[tuple[str, str]] = set()
    section = ""
    for line in text.splitlines():
        header = re.match(r"^#?\s*(\[\[?)([\w.-]+)(\]\]?)\s*$", line)
        if header:
            path = re.sub(r"^(partitions|workloads\.namespaces)\.[\w-]+", r"\1.NAME", header.group(2))
            parent, _, name = path.removesuffix(".NAME").rpartition(".")
            found.add((f"[{parent}]" if parent else "", name))
            section = f"{header.group(1)}{path}{header.group(3)}"
            continue
        key = re.match(r'^#?\s*"?([\w./-]+)"?\s*=', line)
        if key:
            found.add((section, key.group(1)))
    return found


def test_the_example_parses_and_shows_every_key() -> None:
    text = EXAMPLE.read_text(encoding="utf-8")
    parse_config(text, source=str(EXAMPLE))
    shown = _example_keys(text)
    missing = [f"{table.header or 'top level'}: {key.name}"
               for table in tables(BridgeConfig, "", "", array=False) for key in table.keys
               if (table.header, key.name) not in shown]
    assert missing == []
