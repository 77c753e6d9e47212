"""The CUDA device of the weight path: driver VMM for weights, registered host memory, torch tensors.

Imported only when a CUDA tensor is adopted (torch and cuda-bindings are optional extras).

- Weights live in a VMM range: cuMemAddressReserve once; cuMemCreate + cuMemMap + cuMemSetAccess
  for the physical memory; release = cuMemUnmap + cuMemRelease with the reservation kept; resume =
  cuMemCreate + cuMemMap at the same addresses. Measured on the H200 (bench/probe_cooperative.py):
  an 8 GiB range released before the CUDA checkpoint comes back at the same address after CRIU +
  CUDA restore in 1.4 ms, and a CUDA graph captured on it before the checkpoint replays and reads
  the new memory.
- Host buffers are anonymous memory (huge pages asked for) registered with cuMemHostRegister: ordinary
  process memory for CRIU, pinned for DMA. Measured: registrations survive the checkpoint and the
  restore, and copy at 55 GB/s right after it.
- Tensors over VMM memory come from `__cuda_array_interface__` (zero copy).
"""

from __future__ import annotations

import os
from typing import Any

from podsnap.workload import _mem
from podsnap.workload._errors import WeightsError

CU_STREAM_NON_BLOCKING = 1
CU_EVENT_DISABLE_TIMING = 2


class _CudaArray:
    """Exposes raw device memory to torch (the tensor keeps this object, and so the device, alive)."""

    def __init__(self, addr: int, nbytes: int, owner: object) -> None:
        self.__cuda_array_interface__ = {"shape": (nbytes,), "typestr": "|u1", "data": (addr, False), "version": 2}
        self.owner = owner


class CudaDevice:
    name = "cuda"

    def __init__(self, ordinal: int | None = None) -> None:
        import torch
        from cuda.bindings import driver as cu

        self.torch = torch
        self.cu = cu
        torch.cuda.init()
        self.ordinal = torch.cuda.current_device() if ordinal is None else ordinal
        torch.empty(1, device=f"cuda:{self.ordinal}")  # the primary context exists and is current here
        self._check(cu.cuInit(0), "cuInit")
        ctx = self._check(cu.cuCtxGetCurrent(), "cuCtxGetCurrent")
        if ctx is None or int(ctx) == 0:
            dev = self._check(cu.cuDeviceGet(self.ordinal), "cuDeviceGet")
            ctx = self._check(cu.cuDevicePrimaryCtxRetain(dev), "cuDevicePrimaryCtxRetain")
            self._check(cu.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")
        self.ctx = ctx
        prop = self._prop()
        self._gran = int(
            self._check(
                cu.cuMemGetAllocationGranularity(
                    prop, cu.CUmemAllocationGranularity_flags.CU_MEM_ALLOC_GRANULARITY_RECOMMENDED
                ),
                "cuMemGetAllocationGranularity",
            )
        )

    def _check(self, ret: Any, what: str) -> Any:
        err = ret[0] if isinstance(ret, tuple) else ret
        if int(err) != 0:
            name = getattr(err, "name", str(err))
            raise WeightsError(f"CUDA {what} failed: {name}")
        if isinstance(ret, tuple) and len(ret) > 1:
            return ret[1] if len(ret) == 2 else ret[1:]
        return None

    def _prop(self) -> Any:
        cu = self.cu
        prop = cu.CUmemAllocationProp()
        prop.type = cu.CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED
        prop.location.type = cu.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
        prop.location.id = self.ordinal
        return prop

    # -- VMM ------------------------------------------------------------------------------------
    def granularity(self) -> int:
        return self._gran

    def reserve(self, size: int) -> int:
        return int(self._check(self.cu.cuMemAddressReserve(size, 0, 0, 0), f"cuMemAddressReserve({size})"))

    def map(self, addr: int, size: int) -> object:
        cu = self.cu
        handle = self._check(cu.cuMemCreate(size, self._prop(), 0), f"cuMemCreate({size})")
        try:
            self._check(cu.cuMemMap(addr, size, 0, handle, 0), f"cuMemMap({addr:#x}, {size})")
        except WeightsError:
            cu.cuMemRelease(handle)
            raise
        desc = cu.CUmemAccessDesc()
        desc.location.type = cu.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
        desc.location.id = self.ordinal
        desc.flags = cu.CUmemAccess_flags.CU_MEM_ACCESS_FLAGS_PROT_READWRITE
        self._check(cu.cuMemSetAccess(addr, size, [desc], 1), "cuMemSetAccess")
        return handle

    def unmap(self, addr: int, size: int, handle: object) -> None:
        self._check(self.cu.cuMemUnmap(addr, size), f"cuMemUnmap({addr:#x}, {size})")
        self._check(self.cu.cuMemRelease(handle), "cuMemRelease")

    # -- host memory ----------------------------------------------------------------------------
    def host_alloc(self, size: int) -> int:
        # touched in parallel first: registering fresh memory faults it in on one thread (2.6 s for 8 GiB)
        ptr = _mem.anon_alloc(size, prefault_threads=min(16, os.cpu_count() or 1))
        try:
            self.host_pin(ptr, size)
        except WeightsError:
            _mem.anon_free(ptr, size)
            raise
        return ptr

    def host_pin(self, ptr: int, size: int) -> None:
        self._check(self.cu.cuMemHostRegister(ptr, size, 0), f"cuMemHostRegister({size})")

    def host_free(self, ptr: int, size: int) -> None:
        self.cu.cuMemHostUnregister(ptr)  # already gone is fine: the memory goes anyway
        _mem.anon_free(ptr, size)

    def host_is_pinned(self, ptr: int) -> bool:
        cu = self.cu
        err, value = cu.cuPointerGetAttribute(cu.CUpointer_attribute.CU_POINTER_ATTRIBUTE_MEMORY_TYPE, ptr)
        return int(err) == 0 and int(value) == int(cu.CUmemorytype.CU_MEMORYTYPE_HOST)

    # -- streams --------------------------------------------------------------------------------
    def thread_init(self) -> None:
        self._check(self.cu.cuCtxSetCurrent(self.ctx), "cuCtxSetCurrent")

    def stream(self) -> object:
        return self._check(self.cu.cuStreamCreate(CU_STREAM_NON_BLOCKING), "cuStreamCreate")

    def stream_free(self, stream: object) -> None:
        self.cu.cuStreamDestroy(stream)

    def h2d(self, dst: int, src: int, n: int, stream: object) -> None:
        self._check(self.cu.cuMemcpyHtoDAsync(dst, src, n, stream), "cuMemcpyHtoDAsync")

    def d2h(self, dst: int, src: int, n: int, stream: object) -> None:
        self._check(self.cu.cuMemcpyDtoHAsync(dst, src, n, stream), "cuMemcpyDtoHAsync")

    def record(self, stream: object) -> object:
        cu = self.cu
        ev = self._check(cu.cuEventCreate(CU_EVENT_DISABLE_TIMING), "cuEventCreate")
        self._check(cu.cuEventRecord(ev, stream), "cuEventRecord")
        return ev

    def wait(self, event: object) -> None:
        self._check(self.cu.cuEventSynchronize(event), "cuEventSynchronize")
        self.cu.cuEventDestroy(event)

    def sync(self, stream: object) -> None:
        self._check(self.cu.cuStreamSynchronize(stream), "cuStreamSynchronize")

    def synchronize(self) -> None:
        self._check(self.cu.cuCtxSynchronize(), "cuCtxSynchronize")

    # -- tensors --------------------------------------------------------------------------------
    def accepts(self, array: Any) -> bool:
        return isinstance(array, self.torch.Tensor) and array.is_cuda

    def describe(self, array: Any) -> tuple[int, int, bool]:
        return int(array.numel() * array.element_size()), int(array.data_ptr()), bool(array.is_contiguous())

    def wrap(self, addr: int, like: Any) -> Any:
        nbytes = int(like.numel() * like.element_size())
        raw = self.torch.as_tensor(_CudaArray(addr, nbytes, self), device=like.device)
        return raw.view(like.dtype).view(like.shape)

    def copy_array(self, dst: Any, src: Any) -> None:
        dst.copy_(src)

    def release_cached(self) -> None:
        self.torch.cuda.synchronize()
        self.torch.cuda.empty_cache()
