"""torch's analysis of which arguments a traced kernel writes, kept per generated kernel and argument signature
(fuse_attn/kernels/generated/access_analysis.py).

Each scenario runs in a fresh process compiling for sm90 without a GPU (the analysis runs Triton's front end, which
the interpreter's patches break): launches traced through ``launch`` (as the attention ops trace theirs), functionalized
by ``make_fx``, counting torch's TTIR generations.
"""

from __future__ import annotations

import torch
from torch.fx.experimental.proxy_tensor import make_fx

from fuse_attn.kernels.generated import launch
from tests.support.compile_job_kernel import copy_kernel
from tests.support.sm90_compiles import compile_for_sm90, in_a_fresh_process


def _counting_ttir_generations() -> list:
    from torch._higher_order_ops import triton_kernel_wrap

    generations, generate = [], triton_kernel_wrap.generate_ttir

    def counted(kernel, kwargs, *args):
        generations.append({name: getattr(value, "dtype", value) for name, value in kwargs.items()})
        return generate(kernel, kwargs, *args)

    triton_kernel_wrap.generate_ttir = counted
    return generations


def _traced_copies(launch_copy, dtypes) -> torch.fx.GraphModule:
    def copies(x):
        outputs = []
        for dtype in dtypes:
            y = torch.empty(64, device=x.device)
            launch_copy({"X": x.to(dtype), "Y": y, "n": 64, "BLOCK": 64})
            outputs.append(y)
        return outputs

    return make_fx(torch.func.functionalize(copies), tracing_mode="fake")(torch.randn(64, device="meta"))


def _cloned(graph: torch.fx.GraphModule) -> list:
    return [node.kwargs["tensors_to_clone"] for node in graph.graph.nodes
            if node.target is torch.ops.higher_order.triton_kernel_wrapper_functional]


def launches_of_one_signature_are_analysed_once(_):
    compile_for_sm90()
    generations = _counting_ttir_generations()
    graph = _traced_copies(lambda args: launch.launch(copy_kernel, (1,), args),
                           [torch.bfloat16, torch.bfloat16, torch.float16, torch.bfloat16])
    assert _cloned(graph) == [["Y"]] * 4  # what torch's analysis found: the kernel writes Y only
    assert [g["X"] for g in generations] == [torch.bfloat16, torch.float16]  # a new signature: analysed anew


def test_launches_of_one_signature_are_analysed_once():
    in_a_fresh_process(__name__, "launches_of_one_signature_are_analysed_once", "")


def launches_with_a_config_are_analysed_once_per_config(_):
    # A launch with options (num_warps, num_stages) reaches torch's analysis as a new single-config Autotuner around
    # the kernel each time (torch's TritonHOPifier): the kernel's analysis is kept per signature and config still.
    from fuse_attn.kernels.tuning import KernelConfig

    compile_for_sm90()
    generations = _counting_ttir_generations()
    four_warps, eight_warps = KernelConfig(64, 64, 4, 2), KernelConfig(64, 64, 8, 2)
    configs = iter([four_warps, four_warps, eight_warps, four_warps])
    graph = _traced_copies(lambda args: launch.launch(copy_kernel, (1,), args, next(configs)), [torch.bfloat16] * 4)
    assert _cloned(graph) == [["Y"]] * 4
    assert len(generations) == 2  # (four warps, eight warps)


def test_launches_with_a_config_are_analysed_once_per_config():
    in_a_fresh_process(__name__, "launches_with_a_config_are_analysed_once_per_config", "")


def test_the_traces_and_inductors_launches_of_one_signature_share_an_answer():
    # the trace analyses a launch of fake tensors, Inductor's lowering one of TensorBoxes: torch reads both alike
    from torch._inductor import ir
    from torch._subclasses.fake_tensor import FakeTensorMode

    from fuse_attn.kernels.generated import access_analysis

    access_analysis.remember(copy_kernel)
    with FakeTensorMode():
        fake = torch.empty(64, dtype=torch.bfloat16)
    box = ir.TensorBox.create(ir.InputBuffer(name="x", layout=ir.FixedLayout(torch.device("cpu"), torch.bfloat16, [64])))
    traced, lowered = ({"X": x, "Y": x, "n": 64, "BLOCK": 64} for x in (fake, box))
    assert access_analysis._key(copy_kernel, traced, None) == access_analysis._key(copy_kernel, lowered, None)
    real = dict(traced, X=torch.empty(64, dtype=torch.bfloat16))  # (read as it is: its alignment may matter)
    assert access_analysis._key(copy_kernel, real, None) != access_analysis._key(copy_kernel, traced, None)


def other_kernels_are_analysed_by_torch_each_time(_):
    compile_for_sm90()
    from triton.runtime.jit import JITFunction

    from fuse_attn.kernels.generated import access_analysis

    access_analysis.remember(copy_kernel)  # (torch's analysis is wrapped from here on)
    other = JITFunction(copy_kernel.fn)
    generations = _counting_ttir_generations()
    graph = _traced_copies(lambda args: torch.library.wrap_triton(other)[(1,)](**args), [torch.bfloat16] * 3)
    assert _cloned(graph) == [["Y"]] * 3
    assert len(generations) == 3


def test_other_kernels_are_analysed_by_torch_each_time():
    in_a_fresh_process(__name__, "other_kernels_are_analysed_by_torch_each_time", "")
