"""The rewrite as a pass on an exported program, for ``torch.export`` flows (AOTInductor packages among them).

    ep = torch.export.export(model, args, kwargs)
    ep = fuse_attn.fuse_exported(ep)    # each attention -> torch.ops.fuse_attn.flash_attention, in place
    path = torch._inductor.aoti_compile_and_package(ep)   # on a GPU: the generated kernels inside the package
    model = torch._inductor.aoti_load_package(path)       # runs without re-tracing (fuse_attn must be importable)

The program's graph is matched and rewritten by the backend's own matcher
(:func:`fuse_attn.graph.rewrite.rewrite_attention`) with the same verdicts: published to
:func:`fuse_attn.collect_reports` and logged. Registered buffers and lifted
constants are read from the program, so masks built from them are evaluated as in the backend. Export adds
``aten._assert_tensor_metadata`` checks after dtype conversions; those on intermediate values (the softmax's cast
back to the model's dtype, say) would count as users of the attention weights and are removed first -- the values
they check are fixed by the graph itself; the checks on the program's inputs stay.

An exported program's forward is traced without its backward, so SDPA's candidates (:mod:`fuse_attn.kernels.dispatch`)
are timed forward only. The Gluon forward on Hopper is no candidate here: its op is a Python custom op, which has no
AOTInductor lowering.
"""

from __future__ import annotations

import torch
from torch.export import ExportedProgram

from fuse_attn.backend import capture_requested
from fuse_attn.graph.nodes import MatchContext
from fuse_attn.graph.rewrite import rewrite_attention
from fuse_attn.kernels import dispatch
from fuse_attn.report import publish


def fuse_exported(ep: ExportedProgram) -> ExportedProgram:
    """Replace every attention of ``ep``'s graph with the fused op, in place; returns ``ep``."""
    gm = ep.graph_module
    _drop_intermediate_metadata_asserts(gm.graph)
    with dispatch.set_aside(dispatch.GLUON, "an exported program: the Gluon forward's op is a Python custom op, "
                                            "with no AOTInductor lowering"):
        report = rewrite_attention(gm, MatchContext(constant_inputs=_constant_inputs(ep), gm=gm),
                                   capture=capture_requested())
    publish(report)
    return ep


def _constant_inputs(ep: ExportedProgram) -> dict:
    """Placeholder -> value of the program's buffers and lifted tensor constants."""
    signature = ep.graph_signature
    values = {**ep.state_dict, **ep.constants}
    names = {**signature.inputs_to_buffers, **signature.inputs_to_lifted_tensor_constants}
    return {node: values[names[node.name]] for node in ep.graph_module.graph.nodes
            if node.op == "placeholder" and names.get(node.name) in values}


def _drop_intermediate_metadata_asserts(graph: torch.fx.Graph) -> None:
    for node in list(graph.nodes):
        if node.target is torch.ops.aten._assert_tensor_metadata.default and node.args[0].op != "placeholder":
            graph.erase_node(node)
