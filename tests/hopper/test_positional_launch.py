"""The launcher of the Gluon ops and of the generated kernels launched eagerly (fuse_attn/kernels/positional_launch.py:
PositionalLaunch; the descriptors: hopper/common.py tma_descriptor): after the first call of a specialization, a call
is the compiled kernel's positional ``run``; whatever Triton specializes a kernel on (a constexpr's value, an int's
class, a tensor's dtype or alignment, a descriptor's block, the options, the device) takes Triton's own launch again.
A fake kernel stands in for Triton's (no GPU needed); the GPU tests run the real kernels through it
(test_hopper_forward.py, test_hopper_backward.py, test_hopper_packed_documents.py)."""

from __future__ import annotations

import inspect
import types

import pytest
import torch

from fuse_attn.kernels import positional_launch
from fuse_attn.kernels.hopper import common
from fuse_attn.kernels.hopper.common import tma_descriptor
from fuse_attn.kernels.positional_launch import PositionalLaunch


class FakeCompiled:
    def __init__(self, runs):
        self.function, self.packed_metadata, self.runs = "function", "metadata", runs

    def run(self, *launch):
        self.runs.append(launch)


class FakeKernel:
    """A kernel of params (desc, ptr, n, scale, flag, BLOCK: constexpr): ``kernel[grid](*args)`` records the JIT launch
    and returns a compiled kernel that records its positional runs."""

    params = [types.SimpleNamespace(num=i, is_constexpr=i == 5) for i in range(6)]

    def __init__(self):
        self.jit, self.runs = [], []

    def __getitem__(self, grid):
        def launch(*args, **options):
            self.jit.append((grid, args, options))
            return FakeCompiled(self.runs)
        return launch


def kernel_params(kernel) -> list:
    """A kernel's parameters as Triton's JIT lists them (num, is_constexpr), from its signature under the
    interpreter (whose kernels list none)."""
    params = getattr(kernel, "params", None)
    if params is not None:
        return params
    return [types.SimpleNamespace(num=i, is_constexpr="constexpr" in str(p.annotation))
            for i, p in enumerate(inspect.signature(kernel.fn).parameters.values())]


@pytest.fixture
def gpu(monkeypatch):
    """CUDA initialized, device 0 current, its stream 7."""
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch._C, "_cuda_getCurrentRawStream", lambda device: 7, raising=False)


def args(n=64, block=128, dtype=torch.bfloat16, ptr_offset=0, rows=64):
    x = torch.zeros(4, 2, 128, 64, dtype=dtype)
    ptr = torch.zeros(64, dtype=torch.float32)[ptr_offset:]
    return (tma_descriptor(x, rows), ptr, n, 0.5, False, block)


def test_the_second_call_of_a_specialization_runs_the_compiled_kernel_positionally(gpu):
    kernel = FakeKernel()
    launch = PositionalLaunch(kernel)
    first, second = args(), args()
    launch((3, 2), *first, num_warps=4)
    launch((5,), *second, num_warps=4)
    assert [(grid, options) for grid, _, options in kernel.jit] == [((3, 2), {"num_warps": 4})]
    (run,) = kernel.runs
    assert run[:8] == (5, 1, 1, 7, "function", "metadata", None, None) and run[8] is None
    assert run[9:] == second  # every argument, the constexpr too, as Triton's own launch passes them


@pytest.mark.parametrize("change", [
    dict(block=64),  # a constexpr's value
    dict(n=1), dict(n=65), dict(n=2**31), dict(n=2**63),  # an int's class: 1, not a multiple of 16, i64, u64
    dict(ptr_offset=1),  # a pointer not 16-byte aligned
    dict(dtype=torch.float16), dict(rows=128),  # a descriptor's dtype, its block
])
def test_what_triton_specializes_on_takes_its_own_launch(gpu, change):
    kernel = FakeKernel()
    launch = PositionalLaunch(kernel)
    launch((1,), *args(), num_warps=4)
    launch((1,), *args(**change), num_warps=4)
    assert len(kernel.jit) == 2 and not kernel.runs
    launch((1,), *args(**change), num_warps=4)  # (and that specialization is kept in turn)
    assert len(kernel.jit) == 2 and len(kernel.runs) == 1


def test_64_bit_ints_of_triton_s_two_types_take_a_launch_each(gpu):
    kernel = FakeKernel()
    launch = PositionalLaunch(kernel)
    for n in (2**32, 2**64 - 16, -2**32, 2**33):  # i64, u64, i64 again, i64 again
        launch((1,), *args(n=n))
    assert len(kernel.jit) == 2 and len(kernel.runs) == 2


def test_options_and_the_device_are_part_of_the_key(gpu, monkeypatch):
    kernel = FakeKernel()
    launch = PositionalLaunch(kernel)
    launch((1,), *args(), num_warps=4)
    launch((1,), *args(), num_warps=8)
    launch((1,), *args(), num_warps=8, maxnreg=128)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 1)
    launch((1,), *args(), num_warps=4)
    assert len(kernel.jit) == 4 and not kernel.runs


def test_with_launch_hooks_or_before_cuda_is_initialized_every_call_takes_tritons_launch(gpu, monkeypatch):
    kernel = FakeKernel()
    launch = PositionalLaunch(kernel)
    hooks = positional_launch.knobs.runtime.launch_enter_hook  # (a chain of hooks, empty by default)
    hooks.add(print)
    try:
        launch((1,), *args())
        launch((1,), *args())
    finally:
        hooks.remove(print)
    launch((1,), *args())  # (the chain empty again: this specialization kept)
    launch((1,), *args())
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: False)
    launch((1,), *args())
    assert len(kernel.jit) == 4 and len(kernel.runs) == 1


def test_a_generated_kernel_launched_eagerly_runs_positionally_from_its_second_call(gpu):
    """generated.launch.launch, outside a trace (the Gluon ops' tile classes): the kernel's arguments by name, in its
    parameters' order, through one PositionalLaunch a kernel."""
    from fuse_attn.kernels import tuning
    from fuse_attn.kernels.generated import launch

    kernel = FakeKernel()
    kernel.arg_names = ["desc", "ptr", "n", "scale", "flag", "BLOCK"]
    first, second = (dict(zip(reversed(kernel.arg_names), reversed(a))) for a in (args(), args()))
    config = tuning.KernelConfig(64, 64, num_warps=1, num_stages=1)
    launch.launch(kernel, (3, 2), first, config)
    launch.launch(kernel, (3, 2), second, config)
    assert [(grid, options) for grid, _, options in kernel.jit] == [((3, 2), {"num_warps": 1, "num_stages": 1})]
    (run,) = kernel.runs
    assert run[:3] == (3, 2, 1) and run[9:] == tuple(second[name] for name in kernel.arg_names)


def test_a_descriptor_reads_the_tensor_it_is_given_with_the_layout_validated_once():
    x, y = torch.zeros(4, 2, 128, 64, dtype=torch.bfloat16), torch.ones(4, 2, 128, 64, dtype=torch.bfloat16)
    a, b = tma_descriptor(x, 64), tma_descriptor(y, 64)
    assert a.base is x and b.base is y and a.shape == [4, 2, 128, 64] and a.strides == [16384, 8192, 64, 1]
    assert a.block_shape == [1, 1, 64, 64] and a.layout == b.layout
    with pytest.raises(AssertionError, match="16-byte aligned"):  # Triton's own check of a layout, on its first use
        tma_descriptor(torch.zeros(4, 2, 128, 65, dtype=torch.bfloat16)[..., :64], 64)
    with pytest.raises(ValueError, match="16-byte aligned"):  # a misaligned base, checked on every call
        tma_descriptor(torch.zeros(4 * 2 * 128 * 64 + 1, dtype=torch.bfloat16)[1:].view(4, 2, 128, 64), 64)


def test_the_forward_op_prepares_a_signature_once_and_then_only_sets_the_tensors(gpu, monkeypatch):
    """hopper.forward.ForwardCall: the forward of one signature launches the compiled kernel positionally from its
    second call on, with descriptors over that call's tensors, the outputs fresh, and the specialization of its first
    call; a query whose base is not 16-byte aligned is read from an aligned copy, still positionally (a descriptor's
    base is no part of what Triton specializes on)."""
    from fuse_attn.kernels.hopper import forward
    from fuse_attn.spec import AttentionSpec, CausalMask

    kernel = FakeKernel()
    kernel.params = kernel_params(forward._hopper_attn_fwd)
    monkeypatch.setattr(forward, "_launch_forward", PositionalLaunch(kernel))
    spec = AttentionSpec(dtype="bfloat16", head_dim=64, head_dim_v=64, scale=0.125, causal=CausalMask())
    g = torch.Generator().manual_seed(0)

    def qkv():
        return [torch.randn(2, 4, 96, 64, dtype=torch.bfloat16, generator=g) for _ in range(3)]

    first = qkv()
    call = forward.ForwardCall(spec, *first, None)
    outputs = [call(*first, None)]
    second = qkv()
    outputs.append(call(*second, None))
    misaligned = torch.randn(2 * 4 * 96 * 64 + 1, dtype=torch.bfloat16, generator=g)[1:].view(2, 4, 96, 64)
    outputs.append(call(misaligned, *second[1:], None))
    assert len(kernel.jit) == 1 and len(kernel.runs) == 2
    for launch, tensors, (out, lse) in zip([kernel.jit[0][1], kernel.runs[0][9:], kernel.runs[1][9:]],
                                           [first, second, [misaligned, *second[1:]]], outputs):
        q_desc, k_desc, v_desc, out_desc, lse_arg = launch[:5]
        assert k_desc.base is tensors[1] and v_desc.base is tensors[2] and out_desc.base is out and lse_arg is lse
        assert out.shape == (2, 4, 96, 64) and lse.shape == (2, 4, 96) and lse.dtype == torch.float32
        assert torch.equal(q_desc.base, tensors[0]) and q_desc.base.data_ptr() % 16 == 0
        assert q_desc.shape == [2, 4, 96, 64] and q_desc.strides == [24576, 6144, 64, 1]
    scalars = [[a for a in launch[5:] if not isinstance(a, (torch.Tensor, common.TensorDescriptor))]
               for launch in (kernel.jit[0][1], kernel.runs[0][9:], kernel.runs[1][9:])]
    # (the sizes, scale, window, strides and flags; the mask blocks' and vector slots' strides, zeros)
    assert scalars[0] == scalars[1] == scalars[2] and len(scalars[0]) == 49
    assert all(o[0] is not outputs[0][0] for o in outputs[1:])


def test_the_backward_op_prepares_a_signature_once_and_then_only_sets_the_tensors(gpu, monkeypatch):
    """hopper.backward.BackwardCall: from its second call on, each of its launches (delta, the backward, dQ's cast)
    runs its compiled kernel positionally over that call's tensors; a dO whose base is not 16-byte aligned is read
    from an aligned copy, by the delta kernel too, still positionally."""
    from fuse_attn.kernels.hopper import backward
    from fuse_attn.spec import AttentionSpec, CausalMask

    kernels = {}
    for name in ("_launch_delta", "_launch_backward", "_launch_dq_cast"):
        kernel = kernels[name] = FakeKernel()
        kernel.params = kernel_params(getattr(backward, name).kernel)
        monkeypatch.setattr(backward, name, PositionalLaunch(kernel))
    spec = AttentionSpec(dtype="bfloat16", head_dim=64, head_dim_v=64, scale=0.125, causal=CausalMask(), gqa_group=2)
    g = torch.Generator().manual_seed(0)

    def tensors():
        q, dout, out = (torch.randn(2, 4, 96, 64, dtype=torch.bfloat16, generator=g) for _ in range(3))
        k, v = (torch.randn(2, 2, 96, 64, dtype=torch.bfloat16, generator=g) for _ in range(2))
        return dout, q, k, v, out, torch.randn(2, 4, 96, generator=g)

    first = tensors()
    call = backward.BackwardCall(spec, *first[1:4], None, first[0], False)
    results = [call(*first, None, None)]
    second = tensors()
    results.append(call(*second, None, None))
    misaligned = torch.randn(2 * 4 * 96 * 64 + 1, dtype=torch.bfloat16, generator=g)[1:].view(2, 4, 96, 64)
    third = (misaligned, *second[1:])
    results.append(call(*third, None, None))
    assert all(len(kernel.jit) == 1 and len(kernel.runs) == 2 for kernel in kernels.values())
    delta, bwd, cast = kernels.values()
    for i, (inputs, (dq, dk, dv, dbias)) in enumerate(zip([first, second, third], results)):
        delta_args, bwd_args, cast_args = (k.jit[0][1] if i == 0 else k.runs[i - 1][9:] for k in kernels.values())
        dout, q, k, v, out, lse = inputs
        assert delta_args[0] is out and torch.equal(delta_args[1], dout) and delta_args[1].data_ptr() % 16 == 0
        assert [d.base for d in bwd_args[1:3]] == [k, v] and bwd_args[0].base is q
        assert bwd_args[3].base is delta_args[1] and bwd_args[4].base is dk and bwd_args[5].base is dv
        assert bwd_args[6].base is cast_args[0] and cast_args[1] is dq and dbias is None
        assert dq.shape == q.shape and dk.shape == dv.shape == k.shape
