"""The host allocator is pinned to one behaviour before CPU timing (see trainplan.hostalloc)."""

import ctypes
import subprocess
import sys

import pytest

from trainplan.hostalloc import steady_host_allocator

PROBE = """
import ctypes, sys, torch
class Info(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                                               "fsmblks", "uordblks", "fordblks", "keepcost")]
libc = ctypes.CDLL(None)
libc.mallinfo2.restype = Info
if sys.argv[1] == "steady":
    from trainplan.hostalloc import steady_host_allocator
    print(steady_host_allocator(), file=sys.stderr)
before = libc.mallinfo2().hblkhd
blocks = [torch.empty(64 * 2**20, dtype=torch.uint8) for _ in range(4)]
print(libc.mallinfo2().hblkhd - before)
"""


def mmapped_growth(mode: str) -> int:
    """Bytes glibc serves by mmap while a fresh process allocates four 64 MiB tensors."""
    out = subprocess.run([sys.executable, "-c", PROBE, mode], capture_output=True, text=True, check=True)
    return int(out.stdout.strip())


@pytest.mark.skipif(not sys.platform.startswith("linux") or not hasattr(ctypes.CDLL(None), "mallinfo2"),
                    reason="glibc >= 2.33")
def test_large_blocks_come_from_the_heap_not_fresh_mappings():
    assert mmapped_growth("default") >= 4 * 64 * 2**20  # glibc's default: every large block is a new mapping
    assert mmapped_growth("steady") == 0
    assert steady_host_allocator() == "glibc: mmap off, trim off"
