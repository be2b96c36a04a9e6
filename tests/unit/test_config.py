"""Sizes, options, YAML configs and output files: every bad input gets a clear ConfigError."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ipcshare.runtime.config import (
    format_size,
    human_bytes,
    load_yaml_config,
    merge_options,
    parse_size,
)
from ipcshare.runtime.errors import ConfigError, OptionError
from ipcshare.runtime.output_files import check_writable


@pytest.mark.parametrize("text,value", [("1", 1), ("64", 64), ("4K", 4096), ("1M", 1 << 20),
                                        ("2G", 2 << 30), ("8k", 8192), ("1MiB", 1 << 20),
                                        ("3MB", 3 << 20), (512, 512)])
def test_sizes_with_binary_suffixes(text, value):
    assert parse_size(text) == value


@pytest.mark.parametrize("text", ["0", "-1", "-4K", "abc", "1.5M", "", "1X", "M", True])
def test_bad_sizes_are_refused_with_a_hint(text):
    with pytest.raises(ConfigError, match="size|at least 1 byte"):
        parse_size(text)


@given(st.integers(min_value=1, max_value=1 << 45))
def test_format_size_round_trips(n):
    assert parse_size(format_size(n)) == n


def test_human_sizes():
    assert human_bytes(None) == "-"
    assert human_bytes(512) == "512B"
    assert human_bytes(3 << 29) == "1.5G"
    assert human_bytes(200 << 20) == "200M"
    # What format_size spelled 4294967496K: no exact suffix, so it said every kilobyte.
    assert human_bytes((4 << 40) + (200 << 10)) == "4.0T"


def test_defaults_and_layers_later_wins():
    opts = merge_options({"min_bytes": "1K", "max_bytes": "4K", "iters": 3},
                         {"iters": 7, "backend": None})
    assert (opts.min_bytes, opts.max_bytes, opts.iters, opts.backend) == (1024, 4096, 7, "auto")
    assert opts.sizes() == [1024, 2048, 4096]


@pytest.mark.parametrize("layer,message", [
    ({"backend": "gpu9000"}, "^backend gpu9000: unknown backend; choose one of: auto, host"),
    ({"exchange": "fax"}, "^exchange fax: unknown exchange"),
    ({"bogus": 1}, "unknown option 'bogus'"),
    ({"iters": "ten"}, "^iters ten: expected an integer$"),
    ({"iters": 0}, "^iters 0: must be >= 1$"),
    ({"graph": "yes"}, "^graph yes: expected true or false$"),
    ({"min_bytes": "2M", "max_bytes": "1M"}, "^max_bytes 1M is smaller than min_bytes 2M: the "
                                             "largest size must be at least the smallest$"),
    ({"min_bytes": "0"}, "^min_bytes 0: must be at least 1 byte"),
    ({"max_bytes": "two words"}, "^max_bytes 'two words' is not a size"),
    ({"step_factor": 1, "max_bytes": "4M"}, "^step_factor 1: must be >= 2 to sweep sizes from "
                                            "min_bytes 1M to max_bytes 4M$"),
    ({"datatype": "complex256"}, "unknown datatype"),
    ({"min_bw": -1}, "^min_bw -1: must be a non-negative"),
    ({"register": 2}, r"^register 2: must be 0 \(arrays copied in by the library\) or 1"),
])
def test_bad_options_name_the_key_and_the_value(layer, message):
    with pytest.raises(ConfigError, match=message):
        merge_options(layer)


@pytest.mark.parametrize("layer", [
    {"backend": "gpu9000"}, {"min_bytes": "0"}, {"iters": 0}, {"warmup": -1}, {"checks": -1},
    {"step_factor": 1, "max_bytes": "4M"}, {"min_bw": float("nan")}, {"register": 2},
    {"timing": "fast"}, {"iters": "ten"},
])
def test_every_refused_value_says_which_option_it_is(layer):
    # The command line names the flag the user typed from these (cli.option_origins).
    with pytest.raises(OptionError) as caught:
        merge_options(layer)
    assert caught.value.options[0][0] == next(iter(layer))
    assert caught.value.render(lambda field, shown: f"<{field}={shown}>").startswith(
        f"<{next(iter(layer))}=")


def test_a_value_with_a_line_break_stays_one_line():
    with pytest.raises(OptionError) as caught:
        merge_options({"backend": "host\nsecond line"})
    assert "\n" not in str(caught.value)


def test_yaml_config_loads_a_mapping(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("backend: host\nmin_bytes: 4K\nmax_bytes: 1M\nstep_factor: 4\n")
    opts = merge_options(load_yaml_config(path), {"max_bytes": "16K"})
    assert opts.backend == "host" and opts.max_bytes == 16384 and opts.sizes() == [4096, 16384]


@pytest.mark.parametrize("text,message", [
    ("- a\n- b\n", "must be a mapping"),
    ("just words", "must be a mapping"),
    ("a: [1, 2\n", "not valid YAML"),
])
def test_bad_yaml(tmp_path, text, message):
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=message):
        load_yaml_config(path)


def test_missing_config_file(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_yaml_config(tmp_path / "nope.yaml")


def test_shipped_configs_are_valid():
    from pathlib import Path

    # bench-*.yaml are suites, not run configs: tests/unit/test_bench_suite.py checks them.
    configs = sorted(path for path in
                     Path(__file__).resolve().parents[2].joinpath("configs").glob("*.yaml")
                     if not path.name.startswith("bench-"))
    assert configs, "configs/ should ship example run configs"
    for path in configs:
        data = load_yaml_config(path)
        merge_options({k: v for k, v in data.items() if k != "op"})


def test_timing_modes_of_the_cli_are_the_drivers():
    from ipcshare.patterns.timing import TIMING_MODES
    from ipcshare.runtime.config import TIMINGS

    assert TIMINGS == TIMING_MODES
    assert merge_options({}, {"timing": "latency"}).timing == "latency"
    with pytest.raises(ConfigError, match="timing fast: unknown timing; choose one of: "
                                          "nccl-tests, latency"):
        merge_options({}, {"timing": "fast"})


def test_the_communicators_cases_register_their_arrays():
    from ipcshare.patterns import make_pattern

    assert make_pattern("allreduce", register=1).register
    assert make_pattern("reducescatter", register=1).register
    assert make_pattern("alltoall", register=1, splits="random").register
    assert not make_pattern("allreduce").register
    assert not make_pattern("alltoall").register
    with pytest.raises(ConfigError, match="register applies to the allreduce, reducescatter "
                                          "and alltoall ops .* not to allgather"):
        make_pattern("allgather", register=1)


def test_an_output_file_that_cannot_be_written_is_refused_before_the_work(tmp_path):
    with pytest.raises(ConfigError, match="cannot write .*: no directory"):
        check_writable(str(tmp_path / "missing" / "d.json"))
    with pytest.raises(ConfigError, match="is a directory"):
        check_writable(str(tmp_path))
    check_writable(None)
    check_writable(str(tmp_path / "d.json"))
