"""Host memory the user already has, shared without a copy: the shared file mapping that
holds an array (a memfd, ``multiprocessing.shared_memory``, a file in /dev/shm) is found
in /proc/self/maps, reopened as a descriptor and mapped by peers. Private memory (what
numpy and malloc hand out) has no such file, and is refused with that reason."""

from __future__ import annotations

import dataclasses
import mmap
import os
import stat
import struct

from ..runtime.errors import BackendError
from ..runtime.owned_fd import OwnedFd
from .base import Exported

__all__ = ["FileMapping", "find_mapping", "parse_maps_line", "reopen_mapping",
           "export_host_range", "map_host_range", "EXISTING_HOST_HEADER"]

# magic, format version, file offset of the shared span, its bytes, the file's device
# and inode (peers check that the descriptor is the file named).
EXISTING_HOST_HEADER = struct.Struct("!4sHQQQQ")
_MAGIC = b"IPCE"
_VERSION = 1
_PAGE = mmap.PAGESIZE
_PRIVATE_FIX = ("allocate it with comm.empty(), or in shared memory "
                "(multiprocessing.shared_memory, a memfd mapped MAP_SHARED)")


@dataclasses.dataclass(frozen=True)
class FileMapping:
    """One line of /proc/self/maps."""

    start: int
    end: int
    shared: bool
    file_offset: int
    device: int     # as os.stat's st_dev
    inode: int
    path: str

    def spell(self) -> str:
        what = self.path or "anonymous memory"
        kind = "shared" if self.shared else "private"
        return f"a {kind} mapping of {what} [0x{self.start:x}, 0x{self.end:x})"


def parse_maps_line(line: str) -> FileMapping:
    """A /proc/<pid>/maps line as a FileMapping.

    Raises:
        ValueError: not a maps line.
    """
    fields = line.split(maxsplit=5)
    start, end = (int(part, 16) for part in fields[0].split("-"))
    major, minor = (int(part, 16) for part in fields[3].split(":"))
    path = fields[5].strip() if len(fields) > 5 else ""
    return FileMapping(start=start, end=end, shared=fields[1][3] == "s",
                       file_offset=int(fields[2], 16), device=os.makedev(major, minor),
                       inode=int(fields[4]), path=path)


def find_mapping(ptr: int, nbytes: int, *, maps: str = "/proc/self/maps") -> FileMapping:
    """The mapping that holds all of ``[ptr, ptr + nbytes)``.

    Raises:
        BackendError: the range is not mapped, lies in private memory, or spans
            mappings (naming them and what to do instead).
    """
    end = ptr + max(nbytes, 1)
    covering: list[FileMapping] = []
    with open(maps) as lines:
        for line in lines:
            mapping = parse_maps_line(line)
            if mapping.start < end and ptr < mapping.end:
                covering.append(mapping)
    if not covering:
        raise BackendError(f"the array at 0x{ptr:x} lies in no mapping of this process")
    private = [m for m in covering if not m.shared or m.inode == 0]
    if private:
        # Said first: private memory is the cause, even where the array also crosses into
        # a neighbouring mapping (the heap and anonymous memory next to it, say).
        raise BackendError(
            f"the array lies in {private[0].spell()}, which another process cannot map "
            f"(host memory of numpy or malloc is private): {_PRIVATE_FIX}")
    if len(covering) > 1:
        raise BackendError(
            f"the array [0x{ptr:x}, 0x{end:x}) is not contiguous in one shared mapping: it "
            f"spans {len(covering)} mappings ({'; '.join(m.spell() for m in covering)})")
    return covering[0]


def reopen_mapping(mapping: FileMapping) -> OwnedFd:
    """A descriptor of the file behind ``mapping``: an open descriptor of this process
    (a memfd's owner usually keeps one), else /proc/self/map_files (needs
    CAP_CHECKPOINT_RESTORE), else the file's path (a file of /dev/shm).

    Raises:
        BackendError: none of them opens the same file.
    """
    def same_file(fd: int) -> bool:
        info = os.fstat(fd)
        return (info.st_dev, info.st_ino) == (mapping.device, mapping.inode)

    with os.scandir("/proc/self/fd") as entries:
        numbers = [int(entry.name) for entry in entries if entry.name.isdigit()]
    for number in numbers:
        try:
            if stat.S_ISREG(os.fstat(number).st_mode) and same_file(number):
                return OwnedFd(os.dup(number))
        except OSError:
            continue  # the directory's own descriptor, closed since the listing
    tried = []
    for path in (f"/proc/self/map_files/{mapping.start:x}-{mapping.end:x}",
                 mapping.path.removesuffix(" (deleted)")):
        if not path.startswith("/"):
            continue
        try:
            fd = OwnedFd(os.open(path, os.O_RDWR | os.O_CLOEXEC))
        except OSError as exc:
            tried.append(f"{path}: {exc.strerror}")
            continue
        if same_file(fd.fileno()):
            return fd
        fd.close()
        tried.append(f"{path}: another file now")
    raise BackendError(f"the array lies in {mapping.spell()}, but no descriptor of it is open "
                       f"and it cannot be reopened ({'; '.join(tried) or 'no path'}): keep "
                       f"its descriptor open, or {_PRIVATE_FIX}")


def export_host_range(ptr: int, nbytes: int) -> tuple[Exported, int]:
    """Export the pages of shared file memory that hold ``[ptr, ptr + nbytes)``: the
    payload and descriptor for peers, and the array's offset in what they map.

    Raises:
        BackendError: the memory cannot be shared (naming why).
    """
    mapping = find_mapping(ptr, nbytes)
    first = ptr - (ptr - mapping.start) % _PAGE
    last = min(mapping.end, -(-(ptr + max(nbytes, 1)) // _PAGE) * _PAGE)
    file_offset = mapping.file_offset + (first - mapping.start)
    fd = reopen_mapping(mapping)
    payload = EXISTING_HOST_HEADER.pack(_MAGIC, _VERSION, file_offset, last - first,
                                        mapping.device, mapping.inode)
    return Exported(payload=payload, fd=fd), ptr - first


def map_host_range(payload: bytes, fd: OwnedFd | None) -> mmap.mmap:
    """Map, shared, the span a peer exported with ``export_host_range`` (the caller
    closes ``fd``; the mapping keeps its own reference to the file).

    Raises:
        BackendError: malformed payload, missing or wrong descriptor, a file shorter than
            the span (touching it would be a SIGBUS), or mmap failed.
    """
    payload = bytes(payload)
    if len(payload) != EXISTING_HOST_HEADER.size:
        raise BackendError(f"registered host memory handle has {len(payload)} bytes, "
                           f"expected {EXISTING_HOST_HEADER.size}")
    magic, version, file_offset, span, device, inode = EXISTING_HOST_HEADER.unpack(payload)
    if magic != _MAGIC or version != _VERSION:
        raise BackendError("not a registered host memory handle of this ipcshare version")
    if fd is None:
        raise BackendError("registered host memory arrived without its descriptor")
    info = os.fstat(fd.fileno())
    if (info.st_dev, info.st_ino) != (device, inode):
        raise BackendError("the descriptor received is not the file the peer registered")
    if info.st_size < file_offset + span:
        raise BackendError(f"the peer's file holds {info.st_size} bytes, fewer than the "
                           f"{file_offset + span} its registered array needs")
    try:
        return mmap.mmap(fd.fileno(), span, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE,
                         offset=file_offset)
    except OSError as exc:
        raise BackendError(f"mmap of a peer's registered memory failed: {exc.strerror}") from exc
