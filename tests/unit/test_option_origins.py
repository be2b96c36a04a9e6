"""A refused run option is named as the user gave it: the flag typed on the command line,
the key and file of a YAML config, or the flag with its default."""

from __future__ import annotations

import pytest

from ipcshare.backends import check_handle
from ipcshare.cli.main import build_parser
from ipcshare.cli.option_origins import OptionOrigins
from ipcshare.cli.run_pattern import resolve_options
from ipcshare.cli.same_command import CommandLineError
from ipcshare.runtime.errors import ConfigError


def refusal(argv: list[str]) -> str:
    with pytest.raises(ConfigError) as caught:
        resolve_options(build_parser().parse_args(argv))
    return str(caught.value)


@pytest.mark.parametrize("argv,message", [
    (["ring", "-b", "0"], "-b/--minbytes 0: must be at least 1 byte; use a size such as 64K "
                          "or 1M"),
    (["ring", "--minbytes", "0"], "-b/--minbytes 0: must be at least 1 byte; use a size such "
                                  "as 64K or 1M"),
    (["ring", "-e", "1.5M"], "-e/--maxbytes 1.5M is not a size; use a positive integer with "
                             "an optional K, M or G suffix (binary), e.g. 64K or 1M"),
    (["ring", "-b", "1K", "-e", "4K", "-f", "1"],
     "-f/--stepfactor 1: must be >= 2 to sweep sizes from -b/--minbytes 1K to "
     "-e/--maxbytes 4K"),
    (["ring", "-b", "2M"], "-e/--maxbytes 1M (the default) is smaller than -b/--minbytes 2M: "
                           "the largest size must be at least the smallest"),
    (["ring", "-n", "0"], "-n/--iters 0: must be >= 1"),
    (["allgather", "-w", "-1"], "-w/--warmup_iters -1: must be >= 0"),
    (["allgather", "-c", "-1"], "-c/--check -1: must be >= 0"),
    (["allreduce", "-d", "float128"], "-d/--datatype float128: unknown datatype; choose one "
                                      "of: uint8"),
    (["ring", "--backend", "gpu"], "--backend gpu: unknown backend; choose one of: auto, host, "
                                   "cuda-ipc, cuda-vmm"),
    (["ring", "--exchange", "fax"], "--exchange fax: unknown exchange"),
    (["ring", "--handle", "paper"], "--handle paper: unknown handle"),
    (["ring", "--baseline", "gloo"], "--baseline gloo: unknown baseline"),
    (["ring", "--algo", "fast"], "--algo fast: unknown algo"),
    (["ring", "--inter", "ib"], "--inter ib: unknown inter"),
    (["ring", "--timing", "p99"], "--timing p99: unknown timing"),
    (["ring", "--min-bw", "-2"], "--min-bw -2.0: must be a non-negative number of GB/s"),
    (["ring", "-b", "two words"], "-b/--minbytes 'two words' is not a size"),
    # argparse took a negative size for a flag ("expected one argument").
    (["ring", "-b", "-4K"], "-b/--minbytes -4K: must be at least 1 byte"),
    (["allgather", "--maxbytes", "-1M"], "-e/--maxbytes -1M: must be at least 1 byte"),
])
def test_a_flag_is_named_as_typed(argv, message):
    assert refusal(argv).startswith(message)


def test_a_config_value_is_named_by_its_key_and_file(tmp_path):
    config = tmp_path / "run.yaml"
    config.write_text("min_bytes: 4K\nmax-bytes: 1K\niters: 0\n")
    assert refusal(["ring", "--config", str(config)]) == (
        f"max-bytes: 1K in '{config}' is smaller than min_bytes: 4K in '{config}': the "
        "largest size must be at least the smallest")
    # The flag overrides the file: then it is the flag that is wrong.
    assert refusal(["ring", "--config", str(config), "-e", "8K"]) == (
        f"iters: 0 in '{config}': must be >= 1")
    assert refusal(["ring", "--config", str(config), "-e", "8K", "-n", "0"]) == (
        "-n/--iters 0: must be >= 1")


def test_an_unknown_config_key_names_the_file(tmp_path):
    config = tmp_path / "run.yaml"
    config.write_text("warp: 9\n")
    assert refusal(["ring", "--config", str(config)]).startswith(
        f"config file '{config}': unknown option 'warp'; known options: ")


def test_every_option_flag_is_known_by_its_field():
    # The flags come from the parser itself: a flag renamed there is renamed here.
    args = build_parser().parse_args(["allreduce"])
    assert args.option_flags["min_bytes"] == "-b/--minbytes"
    assert args.option_flags["max_bytes"] == "-e/--maxbytes"
    assert args.option_flags["step_factor"] == "-f/--stepfactor"
    assert args.option_flags["register"] == "-R/--register"
    from ipcshare.cli.run_pattern import _OPTION_KEYS

    # Every option key is some pattern command's flag (--splits is alltoall's alone).
    flags = set(args.option_flags) | set(build_parser().parse_args(["alltoall"]).option_flags)
    assert set(_OPTION_KEYS) - flags == set()
    assert build_parser().parse_args(["alltoall"]).option_flags["splits"] == "--splits"


def test_an_option_a_command_lacks_is_refused_by_the_command():
    # argparse's own error points at `ipcshare --help`, which lists commands, not flags.
    with pytest.raises(CommandLineError) as caught:
        build_parser().parse_args(["ring", "-o", "max"])
    assert caught.value.line == ("ipcshare ring: error: unrecognized arguments: -o max "
                                 "(see ipcshare ring --help)")
    with pytest.raises(CommandLineError) as caught:
        build_parser().parse_args(["--warp"])
    assert caught.value.line.endswith("(see ipcshare --help)")


def test_a_fabric_handle_needs_the_cuda_vmm_backend():
    with pytest.raises(ConfigError) as caught:
        with OptionOrigins.of(build_parser().parse_args(
                ["ring", "--handle", "fabric", "--backend", "host"]),
                ("handle", "backend")).naming_options():
            check_handle("host", "fabric")
    assert str(caught.value) == ("--handle fabric: fabric handles export cuMem allocations "
                                 "of GPU memory: they need a GPU backend, cuda-vmm, and the "
                                 "backend is host")
    check_handle("host", "posix-fd")  # every backend's default


def test_library_arguments_in_a_message_are_named_as_the_command_s_flags():
    from ipcshare.cli.main import build_parser
    from ipcshare.cli.option_origins import as_flags

    flags = build_parser().parse_args(["allreduce"]).option_flags
    message = ("backend 'cuda-ipc' needs a GPU; use backend='host' or backend='auto'; "
               "algo='ll' cannot run this; use inter='mpi'")
    assert as_flags(message, flags) == (
        "backend 'cuda-ipc' needs a GPU; use --backend host or --backend auto; "
        "--algo ll cannot run this; use --inter mpi")
    # Code, and arguments the command has no flag for, stay as they are.
    assert as_flags("self.exchange='mpi' and dtype='x'", flags) == \
        "self.exchange='mpi' and dtype='x'"
    assert as_flags("use backend='host' or inter='mpi'", {"inter": "--inter"}) == \
        "use backend='host' or --inter mpi"
