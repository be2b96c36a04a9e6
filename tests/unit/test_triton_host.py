"""ipcshare.triton's host side, with neither Triton nor torch nor a GPU: the peer table's
packing and the address arithmetic the device's ``translate`` does, the refusals (Triton
missing or too old, host memory, ranks taking turns on a GPU, unmapped peers), that
importing the package stays light, and that the device functions' ordering instructions
and pad words are the ones signal.cuh and the window layout own."""

from __future__ import annotations

import importlib.metadata
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import ipcshare.kernels
import ipcshare.triton as ipt
from ipcshare import Unsupported, WindowError
from ipcshare.triton import table as tt
from ipcshare.triton.view import check_can_spin, require_triton
from ipcshare.window import layout

_DEVICE_SOURCE = Path(ipt.__file__).with_name("device.py").read_text()
_SIGNAL_HEADER = (Path(ipcshare.kernels.__file__).parent / "include/ipcshare/signal.cuh"
                  ).read_text()


def _description(rank=1, size=3, timeout_ns=7):
    pads = tuple(0x7F00_0000_0000 + r * 0x10000 for r in range(size))
    window = tuple(0x7E00_0000_0000 + r * (1 << 30) for r in range(size))
    # An address above 2^63: it must survive as the same 64 bits in an int64 word.
    registration = tuple((1 << 63) + 0x1000 * (r + 1) for r in range(size))
    return tt.TableDescription(rank, pads, (window, registration), timeout_ns)


def test_the_table_is_header_then_pads_window_and_registrations():
    description = _description()
    table = tt.pack_table(description)
    assert table.dtype == np.int64
    assert table.shape == (tt.HEADER_WORDS + 3 * 3,)
    assert list(table[:tt.HEADER_WORDS]) == [1, 3, 3, 7]
    as_unsigned = table.view(np.uint64)
    for row, bases in enumerate((description.pads, *description.memories)):
        start = tt.row_offset(row, 3)
        assert [int(v) for v in as_unsigned[start:start + 3]] == list(bases)
    assert tt.PAD_ROW == 0 and tt.WINDOW_ROW == 1 and tt.FIRST_REGISTRATION_ROW == 2


@pytest.mark.parametrize("row", [tt.PAD_ROW, tt.WINDOW_ROW, tt.FIRST_REGISTRATION_ROW])
def test_translate_is_pointer_minus_my_base_plus_the_peers(row):
    description = _description()
    table = tt.pack_table(description)
    bases = (description.pads, *description.memories)[row]
    rng = np.random.default_rng(row)
    for offset in rng.integers(0, 1 << 20, 50):
        local = bases[description.rank] + int(offset)
        for peer in range(description.world_size):
            assert tt.translate_address(table, local, peer, row) == bases[peer] + int(offset)
    # Our own rank maps onto itself.
    assert tt.translate_address(table, bases[1] + 5, 1, row) == bases[1] + 5


def test_the_alignment_of_a_row_is_what_divides_every_distance_from_our_base():
    description = _description()
    # Pads 64 KiB apart, windows 1 GiB apart, registrations 4 KiB apart: 16 at most.
    assert [description.alignment(row) for row in range(3)] == [16, 16, 16]
    odd = tt.TableDescription(0, (0x1000, 0x2000), ((0x10000, 0x20008), (0x3002, 0x4000)))
    assert odd.alignment(tt.WINDOW_ROW) == 8                  # 0x10008 apart
    assert odd.alignment(tt.FIRST_REGISTRATION_ROW) == 2      # 0xFFE apart
    assert tt.TableDescription(0, (0x1001,), ((0x1003,),)).alignment(1) == 16   # alone
    with pytest.raises(ValueError, match="row 3 is not in this table"):
        description.alignment(3)


def test_translate_refuses_a_peer_or_row_outside_the_table():
    table = tt.pack_table(_description())
    with pytest.raises(ValueError, match="peer rank 3 is outside a world of 3"):
        tt.translate_address(table, 0, 3)
    with pytest.raises(ValueError, match="row 3 is outside a table of 3 rows"):
        tt.translate_address(table, 0, 0, 3)


def test_a_description_refuses_unmapped_ranks_and_bad_shapes():
    with pytest.raises(ValueError, match=r"row 1 has no address for rank\(s\) \[2\]"):
        tt.TableDescription(0, (1, 2, 3), ((4, 5, 0),))
    with pytest.raises(ValueError, match="memory 0 names 2 bases for 3 ranks"):
        tt.TableDescription(0, (1, 2, 3), ((4, 5),))
    with pytest.raises(ValueError, match="rank 3 is outside a world of 3"):
        tt.TableDescription(3, (1, 2, 3), ((4, 5, 6),))
    with pytest.raises(ValueError, match="needs the window's bases"):
        tt.TableDescription(0, (1,), ())


def test_a_missing_triton_is_refused_in_one_line(monkeypatch):
    def missing(name):
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "version", missing)
    with pytest.raises(Unsupported) as caught:
        require_triton()
    message = str(caught.value)
    assert "\n" not in message
    assert message == ("ipcshare.triton needs Triton 3.0 or newer, which is not installed "
                       "here (pip install triton)")
    # The device functions are refused the same way, on first use.
    with pytest.raises(Unsupported, match="needs Triton 3.0 or newer"):
        _ = ipt.put


@pytest.mark.parametrize("version", ["2.3.1", "2.1.0+git1234", "1.0", "2.9rc1"])
def test_an_old_triton_is_refused_naming_both_versions(version):
    with pytest.raises(Unsupported) as caught:
        require_triton(version)
    assert str(caught.value) == (f"ipcshare.triton needs Triton 3.0 or newer; Triton {version} "
                                 "is installed (pip install -U triton)")


@pytest.mark.parametrize("version", ["3.0.0", "3.9.0", "3.10.0+git8a1b", "4.0", "3.0.0rc1"])
def test_a_new_enough_triton_passes(version):
    assert require_triton(version) == version


def test_host_memory_is_refused_in_one_line():
    with pytest.raises(Unsupported) as caught:
        check_can_spin(device_memory=False, time_sliced_gpus={}, rank=0, world_size=2)
    assert str(caught.value) == ("ipcshare.triton runs Triton kernels on GPU memory: this group "
                                 "uses host memory (use a GPU backend: cuda-ipc or cuda-vmm)")


def test_ranks_taking_turns_on_a_gpu_are_refused_naming_them_and_mps():
    sliced = {"GPU-1234": [0, 2]}
    with pytest.raises(Unsupported) as caught:
        check_can_spin(device_memory=True, time_sliced_gpus=sliced, rank=2, world_size=4)
    message = str(caught.value)
    assert "\n" not in message
    assert message.startswith("ranks 0, 2 take turns on GPU GPU-1234 (shared without MPS)")
    assert "nvidia-cuda-mps-control -d" in message
    # A rank with a GPU of its own in the same job is not refused (its peers are).
    check_can_spin(device_memory=True, time_sliced_gpus=sliced, rank=1, world_size=4)


def test_more_ranks_than_barrier_words_are_refused():
    with pytest.raises(WindowError, match="barrier_all has words for at most 64"):
        check_can_spin(device_memory=True, time_sliced_gpus={}, rank=0, world_size=65)


def test_importing_the_package_imports_neither_triton_nor_torch_nor_mpi():
    code = ("import sys, ipcshare.triton as t; t.device_view; t.pack_table; "
            "print(sorted(m for m in ('triton', 'torch', 'mpi4py', 'cuda') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == "[]"


def test_the_triton_words_lie_in_the_user_words_above_the_communicators():
    assert layout.GUEST_RESULT_SLOT < layout.TRITON_BARRIER_SLOT_BASE
    assert layout.USER_SLOT_BASE <= layout.TRITON_BARRIER_SLOT_BASE
    assert (layout.TRITON_BARRIER_SLOT_BASE + layout.TRITON_BARRIER_RANKS
            == layout.TRITON_EPOCH_SLOT)
    assert layout.TRITON_EPOCH_SLOT < layout.TRITON_USER_SLOT_BASE < layout.ERROR_SLOT


def test_the_device_functions_use_signal_cuh_s_ordering_instructions():
    # The release store and the acquire load of signal.cuh's put_signal / load_acquire,
    # and block_signal's system fence (__threadfence_system is fence.sc.sys).
    release = re.search(r'"(st\.release\.sys\.global\.u64) ', _SIGNAL_HEADER)[1]
    acquire = re.search(r'"(ld\.acquire\.sys\.global\.u64) ', _SIGNAL_HEADER)[1]
    assert "__threadfence_system();" in _SIGNAL_HEADER
    for instruction in (release, acquire, "fence.sc.sys", "%globaltimer"):
        assert instruction in _DEVICE_SOURCE, instruction


def test_the_device_functions_read_the_pad_words_from_the_layout():
    # No number of the layout copied into the device module: it reads them by name.
    for name in ("TRITON_BARRIER_SLOT_BASE", "TRITON_EPOCH_SLOT", "ERROR_SLOT"):
        assert f"_layout.{name}" in _DEVICE_SOURCE
    for value in (layout.TRITON_BARRIER_SLOT_BASE, layout.TRITON_EPOCH_SLOT,
                  layout.ERROR_SLOT):
        assert not re.search(rf"\b{value}\b", _DEVICE_SOURCE), value


def test_ranks_taking_turns_on_a_gpu_name_it_as_nvidia_smi_does():
    raw = bytes.fromhex("7d9991a71c3bc0a1110de498594d6c74")
    with pytest.raises(Unsupported) as caught:
        check_can_spin(device_memory=True, time_sliced_gpus={raw: [0, 1]}, rank=1, world_size=2)
    assert str(caught.value).startswith(
        "ranks 0, 1 take turns on GPU GPU-7d9991a7-1c3b-c0a1-110d-e498594d6c74 (shared without "
        "MPS)")
