# Type stub of fmha_native's public API (PEP 561; py.typed marks the package typed).
# Arrays are typed Any: NumPy arrays, torch tensors, CuPy arrays and other DLPack
# producers are all accepted, and results come back as the caller's kind of array.
from typing import Any, Literal, Optional, Sequence, Tuple, TypedDict, Union, final, overload

from . import distributed as distributed
from . import reference as reference

__version__: str
__all__ = ["FmhaError", "Tensor", "combine", "explain", "forward", "info", "reference",
           "__version__"]

_Array = Any
_Device = Optional[Literal["cpu", "gpu", "cuda", "hip"]]

class FmhaError(RuntimeError):
    """A GPU runtime failure (a bad launch, an unusable device)."""

@final
class Tensor:
    """An output fmha_native allocated for a DLPack producer it does not know."""
    shape: Tuple[int, ...]
    ndim: int
    dtype: Any
    device: Any
    def __dlpack__(self, *, stream: Optional[int] = ..., max_version: Optional[Tuple[int, int]] = ...,
                   dl_device: Optional[Tuple[int, int]] = ..., copy: Optional[bool] = ...) -> Any: ...
    def __dlpack_device__(self) -> Tuple[int, int]: ...

class _GateItem(TypedDict):
    met: bool
    why: str

class _DeviceInfo(TypedDict):
    ordinal: int
    name: str
    arch: str
    sm_count: int

class _Info(TypedDict):
    version: str
    backends: list[str]
    devices: list[_DeviceInfo]
    cpu_threads: int
    cpu_simd: str

@overload
def forward(q: _Array, k: _Array, v: _Array, *, causal: bool = False,
            softmax_scale: Optional[float] = None, num_splits: int = 0,
            return_lse: Literal[True] = True, out: Optional[_Array] = None,
            lse: Optional[_Array] = None, device: _Device = None, stream: Optional[int] = None,
            cache_seqlens: Optional[_Array] = None, k_new: Optional[_Array] = None,
            v_new: Optional[_Array] = None, max_seqlen_k: Optional[int] = None,
            block_table: Optional[_Array] = None, cu_seqlens_q: Optional[_Array] = None,
            cu_seqlens_k: Optional[_Array] = None, max_seqlen_q: Optional[int] = None,
            window: Optional[Tuple[int, int]] = None, softcap: float = 0.0,
            sinks: Optional[_Array] = None, out_dtype: Any = None,
            kv_dtype: Optional[str] = None,
            k_scale: Union[float, _Array, None] = None,
            v_scale: Union[float, _Array, None] = None) -> Tuple[_Array, _Array]: ...
@overload
def forward(q: _Array, k: _Array, v: _Array, *, causal: bool = False,
            softmax_scale: Optional[float] = None, num_splits: int = 0,
            return_lse: Literal[False], out: Optional[_Array] = None,
            lse: Optional[_Array] = None, device: _Device = None, stream: Optional[int] = None,
            cache_seqlens: Optional[_Array] = None, k_new: Optional[_Array] = None,
            v_new: Optional[_Array] = None, max_seqlen_k: Optional[int] = None,
            block_table: Optional[_Array] = None, cu_seqlens_q: Optional[_Array] = None,
            cu_seqlens_k: Optional[_Array] = None, max_seqlen_q: Optional[int] = None,
            window: Optional[Tuple[int, int]] = None, softcap: float = 0.0,
            sinks: Optional[_Array] = None, out_dtype: Any = None,
            kv_dtype: Optional[str] = None,
            k_scale: Union[float, _Array, None] = None,
            v_scale: Union[float, _Array, None] = None) -> _Array: ...
@overload
def forward(q: _Array, k: _Array, v: _Array, *, causal: bool = False,
            softmax_scale: Optional[float] = None, num_splits: int = 0,
            return_lse: bool = True, out: Optional[_Array] = None,
            lse: Optional[_Array] = None, device: _Device = None, stream: Optional[int] = None,
            cache_seqlens: Optional[_Array] = None, k_new: Optional[_Array] = None,
            v_new: Optional[_Array] = None, max_seqlen_k: Optional[int] = None,
            block_table: Optional[_Array] = None, cu_seqlens_q: Optional[_Array] = None,
            cu_seqlens_k: Optional[_Array] = None, max_seqlen_q: Optional[int] = None,
            window: Optional[Tuple[int, int]] = None, softcap: float = 0.0,
            sinks: Optional[_Array] = None, out_dtype: Any = None,
            kv_dtype: Optional[str] = None,
            k_scale: Union[float, _Array, None] = None,
            v_scale: Union[float, _Array, None] = None) -> Union[_Array, Tuple[_Array, _Array]]: ...

def explain(q: _Array, k: _Array, v: _Array, *, causal: bool = False,
            softmax_scale: Optional[float] = None, num_splits: int = 0,
            return_lse: bool = True, out: Optional[_Array] = None,
            lse: Optional[_Array] = None, device: _Device = None, stream: Optional[int] = None,
            cache_seqlens: Optional[_Array] = None, k_new: Optional[_Array] = None,
            v_new: Optional[_Array] = None, max_seqlen_k: Optional[int] = None,
            block_table: Optional[_Array] = None, cu_seqlens_q: Optional[_Array] = None,
            cu_seqlens_k: Optional[_Array] = None, max_seqlen_q: Optional[int] = None,
            window: Optional[Tuple[int, int]] = None, softcap: float = 0.0,
            sinks: Optional[_Array] = None, out_dtype: Any = None,
            kv_dtype: Optional[str] = None,
            k_scale: Union[float, _Array, None] = None,
            v_scale: Union[float, _Array, None] = None) -> dict[str, Any]: ...

def combine(outs: Union[_Array, Sequence[_Array]], lses: Union[_Array, Sequence[_Array]], *,
            out: Optional[_Array] = None,
            lse: Optional[_Array] = None, stream: Optional[int] = None,
            sinks: Optional[_Array] = None) -> Tuple[_Array, _Array]: ...

def info() -> _Info: ...
