"""Whether a device's host memory is apart from it (:func:`memory_model`): where a plan's swapped-out tensors live,
so whether plans may swap and what the budget check counts. Imports no torch: the workflow reads it at start."""

from __future__ import annotations

from dataclasses import dataclass

HOST_MEMORY = ("shared", "separate")

_NOTES = {
    ("cpu", "shared"): "a CPU standing in for an accelerator: host and device memory are the same RAM, so a swap "
                       "frees nothing; plans are recompute-only and the budget check counts everything the process "
                       "holds (peak_bytes_process)",
    ("cpu", "separate"): "a CPU standing in for an accelerator whose host memory is declared separate: plans may "
                         "swap; their host copies sit in the same RAM but count as host bytes, not against the "
                         "budget (checked on the allocator's bytes)",
    ("cuda", "separate"): "device memory apart from host memory: the budget checks device bytes "
                          "(max_memory_allocated); host copies are pinned host bytes, reported apart",
    ("cuda", "shared"): "host memory declared shared with the device: plans are recompute-only and the budget "
                        "check counts device and pinned host bytes together",
}


@dataclass(frozen=True)
class MemoryModel:
    """Where a device's swapped-out tensors live: in ``separate`` host memory (CUDA: pinned host RAM apart
    from the device's), or in ``shared`` memory (the CPU: the host is the same RAM, so a swap saves nothing)."""

    device_type: str
    host_memory: str

    @property
    def swaps(self) -> bool:
        """Whether a plan may swap: only where host memory is apart from the device's."""
        return self.host_memory == "separate"

    def to_dict(self) -> dict[str, str | bool]:
        return {"device_type": self.device_type, "host_memory": self.host_memory, "swaps": self.swaps,
                "note": _NOTES[self.device_type, self.host_memory]}


def memory_model(device_type: str, host_memory: str | None = None) -> MemoryModel:
    """The memory model of a device of ``device_type`` (cpu, cuda): ``host_memory`` as configured, else by
    type (cpu: shared, cuda: separate). The one place this is decided (workflow, validation, trainplan.plan)."""
    if device_type not in ("cpu", "cuda"):
        raise ValueError(f"device type {device_type!r}: expected cpu or cuda")
    chosen = host_memory or ("shared" if device_type == "cpu" else "separate")
    if chosen not in HOST_MEMORY:
        raise ValueError(f"host_memory {chosen!r}: expected one of {HOST_MEMORY}")
    return MemoryModel(device_type, chosen)


#: the CPU under the process meter's malloc (``timing.return_freed_memory``): data of at least this many bytes is
#: mapped on its own, in whole pages
CPU_MMAP_THRESHOLD = 64 * 1024
CPU_PAGE = 4096
#: torch's CPU allocator aligns data to 64 bytes (``posix_memalign``): a mapped block's data starts 64 bytes in, a
#: heap block pays its header and padding up to that
CPU_ALIGNMENT = 64
#: the C++ and Python objects each tensor holds besides its data (TensorImpl, StorageImpl, the Python tensor):
#: with the heap's padding, 350-440 B per small tensor on torch 2.13 here (tests/test_execute_meter.py). Counted
#: once per storage, which leaves out the objects of views (a few hundred bytes each)
CPU_TENSOR_OBJECT_BYTES = 400
#: CUDA's caching allocator rounds every block up to a multiple of 512 bytes (``max_memory_allocated`` counts them)
CUDA_BLOCK = 512


def _round_up(n: int, unit: int) -> int:
    return -(-n // unit) * unit


def allocation_bytes(device_type: str, nbytes: int) -> int:
    """The bytes a storage of ``nbytes`` takes where a budget is checked: on the CPU, the resident pages the process
    meter sees (its data rounded up to whole pages from 64 KiB, else to the heap's alignment, plus the tensor's
    objects); on CUDA, the caching allocator's block (a multiple of 512 bytes). A plan counting ``nbytes`` alone
    runs over a budget it meets exactly by about a page per live tensor (Llama ~100M at 4 x 512: 0.96 MiB)."""
    if nbytes <= 0:
        return 0
    if device_type == "cuda":
        return _round_up(nbytes, CUDA_BLOCK)
    if device_type != "cpu":
        raise ValueError(f"device type {device_type!r}: expected cpu or cuda")
    unit = CPU_PAGE if nbytes >= CPU_MMAP_THRESHOLD else CPU_ALIGNMENT
    return _round_up(nbytes + CPU_ALIGNMENT, unit) + CPU_TENSOR_OBJECT_BYTES


def storage_weight(allocation: str | None, nbytes: int) -> int:
    """What a storage of ``nbytes`` weighs in a plan's problem: its allocation size on the device type
    ``allocation`` (:func:`allocation_bytes`), or its data bytes where the problem names none."""
    return allocation_bytes(allocation, nbytes) if allocation else nbytes
