"""The Gluon forward and backward of attention masked by a mask tensor of the heads (``[Z or 1, 1, M, N]``) whose tiles
are classified per call from its values (the ``MASK_BLOCKS`` paths of fuse_attn/kernels/hopper/ over the lists
``mask_tiles.MaskTiles`` makes: a mask built before a graph break, as FSDP's and DDP's blocks receive Hugging Face's
padding + causal mask).

On the CPU: which specs the kernels take and the compiled path's wiring. On an sm90 GPU: output, lse and the
gradients of q, k and v against fp64 under the 2x rule, with rows the mask hides wholly."""

from __future__ import annotations

import pytest
import torch

from fuse_attn.kernels.hopper.common import hopper_reasons, masks_by_a_summary
from fuse_attn.kernels.hopper.mask_tiles import MaskTiles, reference_mask_tiles
from fuse_attn.score_program import ScoreProgramBuilder, ScoreTensor
from fuse_attn.spec import AttentionSpec
from tests.support.compiled_modules import INTERPRETER_SESSION
from tests.support.gluon_op import (fake_qk, gluon_compile_trains_as_eager, gluon_op_matches_fp64_on_random_inputs,
                                    hopper)

MASK = (False, True, False, False)  # a [Z, 1, M, N] tensor
FINFO_MIN = torch.finfo(torch.bfloat16).min
FORMS = ("added", "bool", "bool_zero")


def mask_spec(form: str, head_dim: int = 128, gqa_group: int = 1, softcap: bool = False) -> AttentionSpec:
    """A mask passed in as models' blocks receive it: "added", ``s + mask`` (0 / finfo.min, Hugging Face's eager
    form); "bool", ``where(mask, s, -inf)`` (SDPA's), "bool_zero" the same with ``empty_rows="zero"``. ``softcap``:
    a tanh softcap before the mask (Gemma-2's)."""
    b = ScoreProgramBuilder()
    s = b.add("score")
    if softcap:
        s = b.add("mul", b.add("tanh", b.add("div", s, b.const(50.0))), b.const(50.0))
    if form == "added":
        root, tensor = b.add("add", s, b.load(0, "float")), ScoreTensor("bias", "bfloat16", MASK)
    else:
        root, tensor = b.add("where", b.load(0, "bool"), s, b.const(float("-inf"))), ScoreTensor("mask", "bool", MASK)
    return AttentionSpec(dtype="bfloat16", head_dim=head_dim, head_dim_v=head_dim, scale=head_dim ** -0.5,
                         score_program=b.program(root), score_tensors=(tensor,), gqa_group=gqa_group,
                         empty_rows="zero" if form == "bool_zero" else "nan")


def padded_causal_keep(length: int) -> torch.Tensor:
    """[4, 1, N, N] bool, which keys each row keeps: causal with the batch rows padded to N, 3N/5, 1 and 0 keys, and
    in the third row also the queries 5-9 see no key (every entry of their rows hidden)."""
    keys = torch.arange(length)
    lengths = torch.tensor([length, (3 * length) // 5, 1, 0])
    keep = (keys[None, :] <= keys[:, None])[None] & (keys[None, None, :] < lengths[:, None, None])
    keep[2, 5:10] = False
    return keep[:, None]


def mask_tensor(form: str, keep: torch.Tensor) -> torch.Tensor:
    return torch.zeros(keep.shape, dtype=torch.bfloat16).masked_fill(~keep, FINFO_MIN) if form == "added" else keep


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("head_dim", [64, 128])
def test_the_kernels_take_a_mask_summarized_per_call(form, head_dim, monkeypatch):
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    spec = mask_spec(form, head_dim)
    assert masks_by_a_summary(spec)
    assert hopper_reasons(spec, *fake_qk(256, 256, head_dim=head_dim)) == []


def test_the_kernels_refuse_a_mask_after_another_program(monkeypatch):
    """Their full tiles run the plain scores: a mask over a softcap's scores is the template's."""
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    spec = mask_spec("added", softcap=True)
    assert not masks_by_a_summary(spec)
    reasons = hopper_reasons(spec, *fake_qk(256, 256))
    assert len(reasons) == 1 and "by a mask tensor of the heads'" in reasons[0], reasons


def _random_keep(M: int, N: int, generator: torch.Generator) -> torch.Tensor:
    """[3, 1, M, N] bool: :func:`padded_causal_keep`'s first three rows (cut to M queries and N keys) with a band of
    keys from 40 hidden in the first, and a random tenth of the second's kept entries hidden (scattered partial
    tiles)."""
    keep = padded_causal_keep(max(M, N))[:3, :, :M, :N].clone()
    keep[0, :, :, 40:56] = False
    keep[1] &= torch.rand(keep[1].shape, generator=generator) > 0.1
    return keep


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("M, rows, cols, key_major", [(200, 128, 128, False), (200, 64, 128, True),
                                                      (77, 32, 16, False), (77, 16, 32, True)])
@pytest.mark.parametrize("batch_of_masks", [3, 1])
@pytest.mark.parametrize("more_keys", [0, 53, -30])
def test_the_listing_kernels_match_the_templates_rule(form, M, rows, cols, key_major, batch_of_masks, more_keys):
    """The lists and counts of :class:`MaskTiles` (in Triton's interpreter, or on the GPU) are the template's own
    (``reference_mask_tiles``), for masks of the batch and one the batch shares, as many keys as queries or not, with
    a NaN in a bias's full tile (partial then) and rows that see no key."""
    if not INTERPRETER_SESSION and not torch.cuda.is_available():
        pytest.skip("needs Triton's interpreter (TRITON_INTERPRET=1) or a GPU")
    N = M + more_keys
    g = torch.Generator().manual_seed(M + rows)
    mask = mask_tensor(form, _random_keep(M, N, g))[:batch_of_masks]
    if form == "added":
        mask[0, 0, 3, 2] = float("nan")
    mask = mask.to("cpu" if INTERPRETER_SESSION else "cuda")
    spec = mask_spec(form)
    listed = MaskTiles(spec, [mask], M, N, rows, cols, key_major)([mask])
    lists, counts = reference_mask_tiles(spec, [mask], M, N, rows, cols, key_major)
    assert listed["BlockCounts"].tolist() == counts.tolist()
    assert listed["BlockList"].tolist() == lists.tolist()
    assert (listed["stride_blist_z"] == 0) == (batch_of_masks == 1)


def _masked_attention(q, k, v, mask):
    """A block's attention given Hugging Face's eager mask from outside its graph: 0 / finfo.min, added."""
    return torch.softmax(q @ k.transpose(-1, -2) * q.shape[-1] ** -0.5 + mask, dim=-1) @ v


def test_a_compiled_graph_that_chose_it_trains_on_cpu(monkeypatch):
    """The compiled path where a CPU can run it (tests/support/gluon_op.py): the rewrite emits the Gluon op with the
    mask among its vectors; output and gradients as eager's."""
    g = torch.Generator().manual_seed(0)
    inputs = [torch.randn(4, 2, 30, 64, generator=g, requires_grad=True) for _ in range(3)]
    keep = padded_causal_keep(30)
    mask = torch.zeros(keep.shape).masked_fill(~keep, torch.finfo(torch.float32).min)
    verdicts = gluon_compile_trains_as_eager(monkeypatch, _masked_attention, inputs, mask, generator=g)
    assert masks_by_a_summary(verdicts[0].spec)


# ---- on an sm90 GPU ----------------------------------------------------------------------------------------------------


@hopper
@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("head_dim, length, gqa_group", [(128, 1025, 1), (64, 97, 2), (128, 2051, 2)])
def test_a_summarized_mask_matches_fp64_with_gradients(form, head_dim, length, gqa_group):
    """Output, lse and dq / dk / dv against fp64 under the 2x rule (NaN where eager's are), for the four batch rows of
    :func:`padded_causal_keep`: full tiles, empty ones, partial ones, and rows the mask hides wholly (eager's uniform
    row under finfo.min, NaN or 0 under -inf)."""
    spec = mask_spec(form, head_dim, gqa_group)
    mask = mask_tensor(form, padded_causal_keep(length)).cuda()
    gluon_op_matches_fp64_on_random_inputs(spec, [mask], mask.shape[0], length, seed=length + head_dim)
