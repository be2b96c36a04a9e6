"""Fuzzing the user-facing parsers: the YAML config loader, merge_options and the
command line. Any input ends in options, a ConfigError, or a clean usage exit (2)."""

from __future__ import annotations

import contextlib
import io

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from ipcshare.cli.main import build_parser
from ipcshare.cli.run_pattern import resolve_options
from ipcshare.cli.same_command import CommandLineError
from ipcshare.runtime.config import PatternOptions, load_yaml_config, merge_options
from ipcshare.runtime.errors import ConfigError

from ..hypothesis_profiles import examples

KEYS = ["backend", "exchange", "handle", "min_bytes", "max_bytes", "step_factor", "iters",
        "warmup", "checks", "datatype", "baseline", "graph", "after_kernel", "algo", "json",
        "min_bw",
        "min-bytes", "warp", ""]
SCALARS = st.one_of(st.none(), st.booleans(), st.integers(-(1 << 70), 1 << 70),
                    st.floats(allow_nan=True), st.text(max_size=12),
                    st.sampled_from(["1K", "4M", "0", "-1", "1T", "host", "auto", "nan"]))
VALUES = st.recursive(SCALARS, lambda inner: st.one_of(st.lists(inner, max_size=3),
                      st.dictionaries(st.text(max_size=5), inner, max_size=3)), max_leaves=6)
LAYERS = st.dictionaries(st.sampled_from(KEYS), VALUES, max_size=6)


@settings(max_examples=examples(400), deadline=None)
@given(layers=st.lists(LAYERS, max_size=3))
def test_merge_options_gives_options_or_a_config_error(layers):
    try:
        options = merge_options(*layers)
    except ConfigError:
        return
    assert isinstance(options, PatternOptions)
    assert options.min_bytes <= options.max_bytes


@settings(max_examples=examples(300), deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=st.one_of(st.text(max_size=200),
                      st.lists(st.tuples(st.sampled_from(KEYS), SCALARS), max_size=5).map(
                          lambda pairs: "".join(f"{k}: {v!r}\n" for k, v in pairs)),
                      st.binary(max_size=100).map(lambda b: b.decode("latin-1"))))
def test_any_yaml_file_loads_or_raises_a_config_error(tmp_path_factory, text):
    path = tmp_path_factory.mktemp("yaml") / "config.yaml"
    path.write_text(text, encoding="utf-8", errors="surrogateescape")
    try:
        data = load_yaml_config(path)
        merge_options(data)
    except ConfigError:
        pass


WORDS = st.sampled_from(["ring", "allgather", "info", "bench", "doctor", "-b", "-e", "-f",
                         "-n", "-w", "-c", "-d", "--backend", "--exchange", "--handle",
                         "--algo", "--graph", "--min-bw", "--baseline", "--json", "--config",
                         "--quick", "--help-me", "1K", "64", "-5", "x", "host", "nan", "--",
                         "=", "--iters=3", "-n3", "1e9"])


@settings(max_examples=examples(400), deadline=None)
@given(argv=st.lists(st.one_of(WORDS, st.text(max_size=8)), max_size=8))
@example(argv=["ring", "\n"])  # found by this test: the usage error took two lines
def test_the_command_line_never_tracebacks(argv):
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            args = build_parser().parse_args(argv)
        except SystemExit as exc:
            assert exc.code == 0  # --help / --version
            return
        except CommandLineError as exc:  # main() prints its line once the ranks agree
            assert "\n" not in exc.line and exc.line.startswith("ipcshare")
            return
    if args.command in ("ring", "allgather") and not getattr(args, "config", None):
        try:
            resolve_options(args)
        except ConfigError as exc:
            assert "\n" not in str(exc)
