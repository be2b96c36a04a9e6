"""The ``ipcshare`` command line: info, ring, allgather."""
