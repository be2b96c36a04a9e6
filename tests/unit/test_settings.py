"""Every IPCSHARE_* variable is read in runtime/settings.py, parsed the same way as
before, refused with a message naming it and its value, and listed in docs/SETTINGS.md."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from ipcshare.runtime import settings
from ipcshare.runtime.errors import ConfigError

_ROOT = Path(__file__).resolve().parents[2]
# Read by the launch scripts alone; the package only names them in advice.
_LAUNCH_SCRIPT_VARIABLES = {"IPCSHARE_KEEP_VISIBLE_DEVICES"}


def test_every_variable_the_package_names_is_a_setting():
    named = set()
    for path in (_ROOT / "ipcshare").rglob("*.py"):
        named.update(re.findall(r"IPCSHARE_[A-Z0-9_]+[A-Z0-9]", path.read_text()))
    assert named - _LAUNCH_SCRIPT_VARIABLES <= {s.name for s in settings.SETTINGS}


def test_only_settings_reads_the_environment_for_ipcshare_variables():
    readers = []
    for path in (_ROOT / "ipcshare").rglob("*.py"):
        text = path.read_text()
        if re.search(r"environ(\.get)?\(?\[?\s*[\"']IPCSHARE_", text):
            readers.append(path.relative_to(_ROOT).as_posix())
    assert readers == []


def test_docs_table_lists_every_setting_with_its_default_and_meaning():
    table = (_ROOT / "docs" / "SETTINGS.md").read_text()
    documented = {name: (default, meaning) for name, default, meaning in re.findall(
        r"^\| `(IPCSHARE_[A-Z0-9_]+)` \| (.*?) \| (.*) \|$", table, re.MULTILINE)}
    assert documented == {s.name: (s.default, s.meaning) for s in settings.SETTINGS}


@pytest.mark.parametrize(("text", "expected"), [("", 30.0), (" 2.5 ", 2.5), ("10", 10.0),
                                                ("0.001", 0.001), ("1e6", 1e6)])
def test_seconds(monkeypatch, text, expected):
    monkeypatch.setenv(settings.EXCHANGE_TIMEOUT, text)
    assert settings.seconds(settings.EXCHANGE_TIMEOUT, 30.0) == expected


@pytest.mark.parametrize(("text", "message"), [
    ("soon", r"IPCSHARE_EXCHANGE_TIMEOUT='soon' is not a number of seconds"),
    ("0", r"IPCSHARE_EXCHANGE_TIMEOUT must be positive, got '0'"),
    ("nan", r"IPCSHARE_EXCHANGE_TIMEOUT must be positive, got 'nan'"),
    # Accepted before: 1 ns made every wait a timeout (and corrupted the heap at exit),
    # inf and 1e308 overflowed the clock a socket timeout takes, 30 s into the run.
    ("1e-9", r"IPCSHARE_EXCHANGE_TIMEOUT='1e-9' is out of range: give between 0.001 and "
             r"1e\+06 seconds, or unset it"),
    ("inf", r"IPCSHARE_EXCHANGE_TIMEOUT='inf' is out of range"),
    ("1e308", r"IPCSHARE_EXCHANGE_TIMEOUT='1e308' is out of range"),
    ("1000001", r"IPCSHARE_EXCHANGE_TIMEOUT='1000001' is out of range"),
])
def test_bad_seconds_name_the_variable_and_value(monkeypatch, text, message):
    monkeypatch.setenv(settings.EXCHANGE_TIMEOUT, text)
    with pytest.raises(ConfigError, match=message):
        settings.seconds(settings.EXCHANGE_TIMEOUT, 30.0)


def test_max_ranks_per_gpu(monkeypatch):
    monkeypatch.delenv(settings.MAX_RANKS_PER_GPU, raising=False)
    assert settings.max_ranks_per_gpu() is None
    monkeypatch.setenv(settings.MAX_RANKS_PER_GPU, " 3 ")
    assert settings.max_ranks_per_gpu() == 3
    monkeypatch.setenv(settings.MAX_RANKS_PER_GPU, "many")
    with pytest.raises(ConfigError, match=r"IPCSHARE_MAX_RANKS_PER_GPU='many' is not a whole"):
        settings.max_ranks_per_gpu()
    monkeypatch.setenv(settings.MAX_RANKS_PER_GPU, "0")
    with pytest.raises(ConfigError, match="IPCSHARE_MAX_RANKS_PER_GPU must be at least 1, got 0"):
        settings.max_ranks_per_gpu()


def test_disabled_p2p_pairs(monkeypatch):
    monkeypatch.setenv(settings.DISABLE_P2P, "0-1, 2-3,")
    assert settings.disabled_p2p_pairs() == {frozenset((0, 1)), frozenset((2, 3))}
    monkeypatch.setenv(settings.DISABLE_P2P, "0-1,2")
    with pytest.raises(ConfigError, match=r"IPCSHARE_DISABLE_P2P: '2' is not a pair"):
        settings.disabled_p2p_pairs()


def test_shared_gpu_barrier(monkeypatch):
    monkeypatch.delenv(settings.SHARED_GPU_BARRIER, raising=False)
    assert settings.shared_gpu_barrier() == "host"
    monkeypatch.setenv(settings.SHARED_GPU_BARRIER, "stream")
    assert settings.shared_gpu_barrier() == "stream"
    monkeypatch.setenv(settings.SHARED_GPU_BARRIER, "device")
    with pytest.raises(ConfigError, match=r"IPCSHARE_SHARED_GPU_BARRIER='device'; choose one "
                                          r"of: host, stream"):
        settings.shared_gpu_barrier()


def test_mpi_cuda_aware(monkeypatch):
    monkeypatch.delenv(settings.MPI_CUDA_AWARE, raising=False)
    assert settings.mpi_cuda_aware() is None
    monkeypatch.setenv(settings.MPI_CUDA_AWARE, "1")
    assert settings.mpi_cuda_aware() is True
    monkeypatch.setenv(settings.MPI_CUDA_AWARE, "0")
    assert settings.mpi_cuda_aware() is False
    monkeypatch.setenv(settings.MPI_CUDA_AWARE, "yes")
    with pytest.raises(ConfigError, match=r"IPCSHARE_MPI_CUDA_AWARE='yes': use 1"):
        settings.mpi_cuda_aware()


def test_kernel_trace_is_off_unless_1_and_refuses_other_words(monkeypatch):
    monkeypatch.delenv(settings.KERNEL_TRACE, raising=False)
    assert settings.kernel_trace() is False
    for text, expected in (("1", True), (" 1 ", True), ("0", False), ("", False)):
        monkeypatch.setenv(settings.KERNEL_TRACE, text)
        assert settings.kernel_trace() is expected
    monkeypatch.setenv(settings.KERNEL_TRACE, "yes")
    with pytest.raises(ConfigError, match=r"IPCSHARE_KERNEL_TRACE='yes': use 1 \(kernels "
                                          r"with phase stamps"):
        settings.kernel_trace()


def test_texts_and_flags(monkeypatch):
    for name in (settings.LOG, settings.DEBUG, settings.SOCKET_DIR, settings.KERNEL_CACHE,
                 settings.DOCTOR_TEST_DIE_RANK, settings.DOCTOR_TEST_DIE_STAGE):
        monkeypatch.delenv(name, raising=False)
    assert (settings.log_level(), settings.debug(), settings.socket_dir(),
            settings.kernel_cache(), settings.doctor_test_death()) == (
        None, False, None, None, ("", "matrix"))
    monkeypatch.setenv(settings.LOG, "info")
    monkeypatch.setenv(settings.DEBUG, "1")
    monkeypatch.setenv(settings.DOCTOR_TEST_DIE_RANK, " 1 ")
    monkeypatch.setenv(settings.DOCTOR_TEST_DIE_STAGE, "bandwidth")
    assert (settings.log_level(), settings.debug(), settings.doctor_test_death()) == (
        "info", True, ("1", "bandwidth"))
    monkeypatch.setenv(settings.P2P_FALLBACK, " relay")
    assert settings.raw(settings.P2P_FALLBACK) == " relay"  # compared between ranks as written


def test_the_signal_timeout_the_table_documents_is_the_one_groups_use(monkeypatch):
    # Groups read it through settings.signal_timeout(), whose default lives beside it.
    monkeypatch.delenv(settings.SIGNAL_TIMEOUT, raising=False)
    (row,) = [s for s in settings.SETTINGS if s.name == settings.SIGNAL_TIMEOUT]
    assert float(row.default) == settings.signal_timeout() == settings.DEFAULT_SIGNAL_TIMEOUT_S


def test_a_log_level_that_is_none_is_warned_about_once_and_warning_is_used(monkeypatch,
                                                                           capsys):
    # It was ignored in silence. Warned, not raised: logging is set up before the ranks'
    # first collective, where a rank raising alone would leave the others waiting.
    import logging

    from ipcshare.runtime.logs import configure_logging

    monkeypatch.setenv("IPCSHARE_LOG", "verbose")
    configure_logging(0)
    configure_logging(0)
    err = capsys.readouterr().err
    assert err.count("ipcshare: warning: IPCSHARE_LOG='verbose' is not a log level "
                     "(DEBUG, INFO, WARNING, ERROR, CRITICAL): using WARNING") == 1, err
    assert logging.getLogger("ipcshare").level == logging.WARNING
    monkeypatch.setenv("IPCSHARE_LOG", "info")
    configure_logging(0)
    assert logging.getLogger("ipcshare").level == logging.INFO
    monkeypatch.delenv("IPCSHARE_LOG")
    configure_logging(0)
