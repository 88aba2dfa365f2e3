"""HostKVCache: the per-rank HiCache host pool, sized, checked and allocated as SGLang does by
version (sglang-hicache.md sections 1.2, 2.2-2.5).  Memory is allocated AND committed for real."""

import ctypes
import mmap
import os

from sglang.srt import utils

PAGE = mmap.PAGESIZE


def pow2_ceil(n: int) -> int:
    """c10::llvm::PowerOf2Ceil (PyTorch's CachingHostAllocator rounding, <= 0.5.4)."""
    return 1 if n <= 1 else 1 << (n - 1).bit_length()


def host_pool_tokens(host_size_gb: int, ratio: float, device_tokens: int, bpt: int, page_size: int, version) -> int:
    """Tokens of the host pool: section 1.2 (size beats ratio) and 2.2 (page alignment)."""
    if host_size_gb > 0:
        size = int(host_size_gb * 1e9 // bpt)
    else:
        size = int(device_tokens * ratio)
    if version <= (0, 5, 5):
        size = size - (size % page_size)  # aligned down
    else:
        page_num = size // page_size + 1  # aligned up, plus one page
        size = page_num * page_size
    return size


def committed_bytes(requested: int, version) -> int:
    """Host bytes a pool really commits (section 2.5)."""
    return pow2_ceil(requested) if version <= (0, 5, 4) else requested


class HostKVCache:
    def __init__(self, args: dict, version, bpt: int, device_tokens: int, ranks_per_host: int, logger,
                 size_override_tokens=None):
        self.logger = logger
        self.version = version
        self.size_per_token = bpt
        page_size = args["page_size"]
        if size_override_tokens is not None:
            self.size = size_override_tokens
        else:
            self.size = host_pool_tokens(args["hicache_size"], args["hicache_ratio"], device_tokens, bpt, page_size, version)

        # 0.4.9 - 0.5.14: assertion; 0.5.15+: warning (section 2.3)
        if version <= (0, 5, 14):
            assert self.size > device_tokens, "The host memory should be larger than the device memory with the current protocol"
        elif self.size <= device_tokens:
            logger.warning(
                "HiCache host KV pool (%d tokens) is smaller than the device pool (%d tokens);"
                "L2 cache effectiveness is reduced. Consider increasing --hicache-ratio (or --hicache-size)."
                % (self.size, device_tokens)
            )

        # host-memory check (section 2.4)
        requested_bytes = self.size * self.size_per_token
        available = utils.mem_available()
        if version >= (0, 5, 21):
            try:
                headroom = utils.cgroup_headroom()
            except utils.CgroupDiscoveryError:
                headroom = None
            if headroom is not None:
                available = min(available, headroom)
        available_bytes = available - utils.HICACHE_HOST_MEMORY_RESERVE_BYTES
        if version >= (0, 5, 19):
            available_bytes = available_bytes // max(ranks_per_host, 1)
        if requested_bytes > available_bytes:
            raise ValueError(
                "Not enough host memory available. Requesting "
                "%.2f GB but only have %.2f GB free. Please reduce the "
                "size of the hierarchical cache." % (requested_bytes / 1e9, available_bytes / 1e9)
            )
        logger.info("Allocating %.2f GB host memory for hierarchical KV cache." % (requested_bytes / 1e9))
        self.requested_bytes = requested_bytes
        self.committed_bytes = committed_bytes(requested_bytes, version)
        self.buffer = self._alloc(self.committed_bytes)

    def _alloc(self, nbytes: int):
        v = self.version
        populate = getattr(mmap, "MAP_POPULATE", 0x8000)
        try:
            if v <= (0, 5, 4):
                # torch.empty(pin_memory=True) -> cudaHostAlloc of the power-of-two size: shared, resident
                buf = mmap.mmap(-1, nbytes, flags=mmap.MAP_SHARED | populate)
            elif v <= (0, 5, 14):
                # torch.empty (pageable, anonymous private) + cudaHostRegister: faults in every page
                buf = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | populate)
            else:
                # alloc_mmap(): anonymous MAP_SHARED | MAP_POPULATE (Shmem), then cudaHostRegister
                buf = mmap.mmap(-1, nbytes, flags=mmap.MAP_SHARED | populate)
        except OSError as e:
            if v <= (0, 5, 14) and v > (0, 5, 4):
                raise RuntimeError(
                    "[enforce fail at alloc_cpu.cpp:117] data. DefaultCPUAllocator: not enough memory: "
                    "you tried to allocate %d bytes." % nbytes
                ) from e
            raise RuntimeError("CUDA error: out of memory (host allocation of %d bytes: %s)" % (nbytes, e)) from e
        # MAP_POPULATE prefaults; make sure every page is really committed (one write per page if
        # the kernel skipped any, e.g. no MAP_POPULATE support).
        self._touch_if_needed(buf, nbytes)
        if os.environ.get("SGLANG_STANDIN_MLOCK") == "1":
            view = ctypes.c_char.from_buffer(buf)
            addr = ctypes.addressof(view)
            del view  # release the buffer export so that destroy() can munmap
            utils.libc().mlock(ctypes.c_void_p(addr), ctypes.c_size_t(nbytes))
        return buf

    @staticmethod
    def _touch_if_needed(buf, nbytes: int):
        if os.environ.get("SGLANG_STANDIN_FORCE_TOUCH") != "1":
            return
        step = PAGE
        for off in range(0, nbytes, step):
            buf[off] = 1

    def destroy(self):
        """HostKVCache.destroy(): unregister and free the buffers (graceful shutdown)."""
        buf, self.buffer = getattr(self, "buffer", None), None
        if buf is not None:
            try:
                buf.close()
            except (BufferError, ValueError):
                pass
