"""The torch.distributed rendezvous: rank 0 binds the store's port itself (port 0) and
announces the port it got, so no port is released and raced for; a store rank 0 cannot
open fails every rank with rank 0's reason."""

from __future__ import annotations

import pytest

from ipcshare.baselines.torch_rendezvous import start_nccl_process_group
from ipcshare.runtime.errors import IpcShareError


class _Comm:
    """One rank's view of an MPI bcast whose root sent ``sent`` (None: this is the root)."""

    def __init__(self, sent=None):
        self.sent = sent

    def bcast(self, value, root=0):
        assert root == 0
        return value if self.sent is None else self.sent


class _Dist:
    def __init__(self, refuse=None):
        self.stores, self.inits, self.refuse = [], [], refuse
        dist = self

        class TCPStore:
            def __init__(self, host, port, size, is_master, wait_for_workers=True,
                         timeout=None):
                if dist.refuse:
                    raise OSError(dist.refuse)
                self.port = 41234 if port == 0 else port
                dist.stores.append((host, port, size, is_master, wait_for_workers, timeout))

        self.TCPStore = TCPStore

    def init_process_group(self, backend, **kwargs):
        self.inits.append((backend, kwargs))


def test_rank_0_binds_port_0_and_the_others_join_the_port_it_got():
    root, other = _Dist(), _Dist()
    start_nccl_process_group(root, _Comm(), rank=0, size=2, device="cuda:0")
    start_nccl_process_group(other, _Comm(sent=(41234, None)), rank=1, size=2,
                             device="cuda:1")
    assert root.stores == [("127.0.0.1", 0, 2, True, False, None)]
    assert other.stores == [("127.0.0.1", 41234, 2, False, True, None)]
    for dist, rank, device in ((root, 0, "cuda:0"), (other, 1, "cuda:1")):
        [(backend, kwargs)] = dist.inits
        assert backend == "nccl"
        assert (kwargs["rank"], kwargs["world_size"], kwargs["device_id"]) == (rank, 2, device)
        assert kwargs["store"].port == 41234


def test_a_store_rank_0_cannot_open_fails_every_rank_with_its_reason():
    message = r"^rank 0 could not open torch.distributed's rendezvous store at h: OSError: " \
              r"address already in use$"
    with pytest.raises(IpcShareError, match=message):
        start_nccl_process_group(_Dist(refuse="address already in use"), _Comm(), rank=0,
                                 size=2, device="cuda:0", host="h")
    other = _Dist()
    with pytest.raises(IpcShareError, match=message):
        start_nccl_process_group(other, _Comm(sent=(None, "OSError: address already in use")),
                                 rank=1, size=2, device="cuda:1", host="h")
    assert other.stores == [] and other.inits == []


def test_a_timeout_bounds_both_stores_waits():
    root, other = _Dist(), _Dist()
    start_nccl_process_group(root, _Comm(), rank=0, size=2, device="cuda:0", timeout=120)
    start_nccl_process_group(other, _Comm(sent=(41234, None)), rank=1, size=2,
                             device="cuda:1", timeout=120)
    assert root.stores[0][-1] == other.stores[0][-1] == 120
