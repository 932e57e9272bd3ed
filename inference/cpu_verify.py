"""Verify a tree for little more than one token's price on CPUs: two fixes for a multi-token forward.

A verify step feeds the base a handful of tokens (the tree's nodes). Measured on a 2-core Xeon (fp32, SmolLM2):
1. **Linears.** PyTorch hands `F.linear` to MKL's sgemm, whose kernels for 2-16 rows are slow: a 576x576 layer
   took 0.04 ms for one row and 0.41 ms for four. MKL's packed GEMM (the weight reordered once into the kernel's
   own layout; what torch.compile's weight freezing uses on CPU) takes ~0.05 ms for 1-8 rows. One row stays
   with F.linear (gemv; a whole one-token forward was ~10% faster that way), so plain decoding is untouched.
   `pack_linears` swaps each fp32 CPU nn.Linear for a PackedLinear that shares its parameters (state dicts, tied
   weights and `isinstance(..., nn.Linear)` are unchanged) and keeps the packed copy beside them: weight
   memory doubles (fp32 and bf16 alike). Results match F.linear to float rounding (another summation order),
   so a greedy decode may part from an unpacked one at a near-tie, as between any two fp32 kernels: compare
   methods on the same (packed) model, as scripts/bench.py does. Other dtypes (fp16, fp64), GPUs and autograd
   go through F.linear; weights changed after packing are packed again.
   **Bf16** weights take the same road through oneDNN: F.linear reorders a bf16 weight into oneDNN's blocked
   layout on every call; `torch.ops.mkldnn._reorder_linear_weight` does it once (torch.compile's weight
   freezing uses the same pair). Measured on a 2-core AMD EPYC (AVX-512 bf16): a 1536x576 layer 53 -> 28 us
   for one row and 66 -> 43 us for ten, SmolLM2's 49152x576 lm_head 2.9 -> 1.6 ms, so every row count, one
   included, runs packed. There the outputs were bit for bit F.linear's; on a 2-core Xeon with AMX, bias-free
   layers fed more than 32 rows differ from F.linear in the last bf16 bit now and then (another oneDNN kernel),
   so a tuned model's prefill and tree forwards may round differently from an untuned one, as between any two
   bf16 kernels. One row is exact on both (tested), and methods are compared on the same tuned model.
2. **Grouped-query attention.** With an attention mask and more than one query, transformers' SDPA path copies
   the whole KV cache once per query-head group (`repeat_kv`) in every layer (~10 ms of an 8-token SmolLM2
   step); `TRANSFORMERS_SDPA_FORCE_GQA=1` lets PyTorch's CPU kernel read the shared heads instead (same
   numbers, checked bit for bit). Set for the process, unless the user set it, and only for CPU models.

`prepare_cpu_verify(model, heads, ...)` applies both; chat, bench, build_tree and the tuners call it
(`--untuned-cpu` skips it). See scripts/build_tree.py for the per-budget verify costs it gives on your machine.
"""

from __future__ import annotations

import contextlib
import functools
import os

import torch
import torch.nn.functional as F
from torch import nn


def add_untuned_cpu_argument(parser) -> None:
    """The --untuned-cpu switch every decoding script shares (chat, bench, build_tree, the tuners)."""
    parser.add_argument("--untuned-cpu", action="store_true",
                        help="skip the CPU verify tuning of inference/cpu_verify.py (packed fp32/bf16 linears, SDPA GQA)")


def _torch_op_exists(namespace, name: str) -> bool:
    """Whether this PyTorch build registers the operator namespace.name (torch.ops resolves names lazily)."""
    try:
        getattr(namespace, name)
    except (AttributeError, RuntimeError):
        return False
    return True


@functools.cache  # asked on every packed forward; the answer is fixed for the process
def mkl_packing_available() -> bool:
    """This PyTorch was built with MKL and exposes the packed-linear ops (x86 builds do)."""
    return torch.backends.mkl.is_available() and _torch_op_exists(torch.ops.mkl, "_mkl_linear")


@functools.cache
def onednn_bf16_packing_available() -> bool:
    """oneDNN can run bf16 linears from a reordered weight on this CPU (x86 builds, AVX-512 or newer)."""
    return (torch.backends.mkldnn.is_available() and _torch_op_exists(torch.ops.mkldnn, "_reorder_linear_weight")
            and torch.ops.mkldnn._is_mkldnn_bf16_supported())


def packing_kind(weight: torch.Tensor) -> str | None:
    """Which packed path pays for this weight: "mkl" (fp32 on CPU), "onednn" (bf16 on CPU) or None."""
    if weight.device.type != "cpu":
        return None
    if weight.dtype == torch.float32 and mkl_packing_available():
        return "mkl"
    if weight.dtype == torch.bfloat16 and onednn_bf16_packing_available():
        return "onednn"
    return None


_stock_linears = 0  # > 0 inside stock_linears(): PackedLinear runs F.linear


@contextlib.contextmanager
def stock_linears():
    """Inside the block every PackedLinear runs plain F.linear, as transformers does without this module.

    Benchmarks time HF `generate` this way too (`hf_unpacked`), so a run shows what the packing itself gives
    a user beside what speculation gives on the packed model. The switch is process-wide, not per thread."""
    global _stock_linears
    _stock_linears += 1
    try:
        yield
    finally:
        _stock_linears -= 1


class PackedLinear(nn.Linear):
    """nn.Linear whose inference forward uses a packed copy of the weight (fp32 or bf16, CPU, no autograd)."""

    def _pack(self, kind: str) -> None:
        weight = self.weight.detach()
        # The batch-size argument is a hint: the packed layout serves any number of rows (checked in tests).
        if kind == "mkl":
            self._packed = torch.ops.mkl._mkl_reorder_linear_weight(weight, 1)
        else:
            self._packed = torch.ops.mkldnn._reorder_linear_weight(weight, 1)
        self._packed_from = self._weight_key()
        probe = torch.randn(3, self.in_features, generator=torch.Generator().manual_seed(0)).to(weight.dtype)
        expected = F.linear(probe, weight).float()
        got = self._packed_linear(kind, probe, bias=None).float()
        scale = float(expected.abs().max()) or 1.0
        tolerance = 1e-4 if kind == "mkl" else 1e-2
        if not torch.allclose(got, expected, rtol=tolerance, atol=tolerance * scale):
            raise RuntimeError(f"the packed linear ({kind}) disagrees with F.linear on a {tuple(weight.shape)} "
                               "weight; call pack_linears(..., enabled=False)")

    def _packed_linear(self, kind: str, x: torch.Tensor, bias) -> torch.Tensor:
        if kind == "mkl":
            return torch.ops.mkl._mkl_linear(x, self._packed, self.weight, bias, x.numel() // self.in_features)
        return torch.ops.mkldnn._linear_pointwise(x, self._packed, bias, "none", [], "")

    def _weight_key(self):
        w = self.weight
        return w.data_ptr(), w._version, w.dtype, w.device

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        kind = packing_kind(self.weight)
        if kind is None or _stock_linears or torch.is_grad_enabled() or x.dtype != self.weight.dtype:
            return F.linear(x, self.weight, self.bias)
        # One fp32 row: MKL's gemv streams the weight faster than the packed kernel (~10% of a one-token step).
        if kind == "mkl" and x.numel() <= self.in_features:
            return F.linear(x, self.weight, self.bias)
        if getattr(self, "_packed_from", None) != self._weight_key():  # weights loaded, moved or edited since
            self._pack(kind)
        return self._packed_linear(kind, x, self.bias)


def _packed_copy(linear: nn.Linear) -> PackedLinear:
    packed = PackedLinear(linear.in_features, linear.out_features, bias=linear.bias is not None, device="meta")
    packed.weight = linear.weight  # the same Parameter objects: ties and state dicts survive
    packed.bias = linear.bias
    packed.train(linear.training)
    packed._pack(packing_kind(linear.weight))
    return packed


def pack_linears(*modules: nn.Module | None, enabled: bool = True) -> int:
    """Swap every fp32 or bf16 CPU nn.Linear inside `modules` (None entries skipped) for a PackedLinear; return
    how many were swapped (0 where the packing ops are missing or no weight is fp32/bf16 on CPU)."""
    if not enabled:
        return 0
    replacements = {}  # one PackedLinear per Linear, even where a draft holds the base's lm_head too
    parents = [parent for module in modules if module is not None for parent in module.modules()]
    for parent in parents:
        for name, child in list(parent.named_children()):
            if type(child) is nn.Linear and packing_kind(child.weight) is not None:
                if id(child) not in replacements:
                    replacements[id(child)] = (child, _packed_copy(child))  # keep child alive: ids stay unique
                parent.register_module(name, replacements[id(child)][1])
    return len(replacements)


def packed_count(module: nn.Module) -> int:
    """How many of the module's linears run packed (benchmarks record it beside the dtype)."""
    return sum(isinstance(m, PackedLinear) for m in module.modules())


def share_kv_heads_in_sdpa() -> bool:
    """Ask transformers to pass grouped-query attention to SDPA (enable_gqa) even with a mask; False where the
    user already chose."""
    if "TRANSFORMERS_SDPA_FORCE_GQA" in os.environ:
        return False
    os.environ["TRANSFORMERS_SDPA_FORCE_GQA"] = "1"
    return True


def prepare_cpu_verify(model: nn.Module, *drafts: nn.Module | None, enabled: bool = True) -> dict:
    """Both fixes for a CPU model (a no-op on GPUs): pack the fp32/bf16 linears of the model and its drafts, and let
    SDPA read shared KV heads. Returns what was done, for benchmark records."""
    on_cpu = next(model.parameters()).device.type == "cpu"
    if not enabled or not on_cpu:
        return cpu_verify_settings(model)
    pack_linears(model, *drafts)
    share_kv_heads_in_sdpa()
    return cpu_verify_settings(model)


def cpu_verify_settings(model: nn.Module) -> dict:
    """How many of the model's linears run packed, and whether SDPA shares KV heads under a mask."""
    return {"packed_linears": packed_count(model),
            "sdpa_force_gqa": os.environ.get("TRANSFORMERS_SDPA_FORCE_GQA", "0") == "1"}
