"""`--max-memory`: sizes as people write them, and the memory a capped node offers."""

from __future__ import annotations

import msgspec
import pytest

from exo_core.cli import config_from_args, core_parser
from exo_core.ids import RunnerId
from exo_core.state import NodeResources
from exo_core.telemetry import cap_memory, parse_size


@pytest.mark.parametrize(
    ("text", "size"),
    [
        ("600MB", 600_000_000),
        ("600mb", 600_000_000),
        ("1.5GiB", 1_610_612_736),
        ("512k", 512_000),
        ("2 KiB", 2048),
        ("1000000", 1_000_000),
        ("1TB", 10**12),
    ],
)
def test_sizes(text: str, size: int) -> None:
    assert parse_size(text) == size


@pytest.mark.parametrize("text", ["", "MB", "-5MB", "6XB", "1e9", "5 MB extra"])
def test_bad_sizes_are_refused(text: str) -> None:
    with pytest.raises(ValueError, match="not a size"):
        parse_size(text)


def test_the_cap_is_the_total_and_runners_use_it_up() -> None:
    machine = NodeResources(memory_total=16_000_000_000, memory_available=9_000_000_000)
    capped = cap_memory(machine, 600_000_000)
    assert (capped.memory_total, capped.memory_available) == (600_000_000, 600_000_000)
    busy = msgspec.structs.replace(machine, runner_memory={RunnerId("r"): 450_000_000})
    assert cap_memory(busy, 600_000_000).memory_available == 150_000_000
    over = msgspec.structs.replace(machine, runner_memory={RunnerId("r"): 700_000_000})
    assert cap_memory(over, 600_000_000).memory_available == 0
    short = msgspec.structs.replace(machine, memory_available=100_000_000)
    assert cap_memory(short, 600_000_000).memory_available == 100_000_000, "never above free"
    assert cap_memory(machine, None) == machine


def test_the_command_line_option() -> None:
    args = core_parser().parse_args(["--max-memory", "600MB"])
    assert config_from_args(args).max_memory == 600_000_000
    assert config_from_args(core_parser().parse_args([])).max_memory is None
    with pytest.raises(SystemExit):
        core_parser().parse_args(["--max-memory", "lots"])
