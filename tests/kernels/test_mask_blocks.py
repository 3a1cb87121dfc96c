"""Tiles classified per call from a mask tensor of unknown values (``AttentionSpec.mask_blocks``,
``launch.mask_block_args``), or from the bounds of a predicate of integer vectors (packed documents): empty tiles
skipped, full ones run without the score program, in the forward, dQ and dK/dV kernels, with the results of the whole
computation. Kernels through the Triton interpreter; the interpreter configs' tiles are 32 x 16 (forward, dQ) and
16 query x 32 key rows (dK/dV)."""

import dataclasses
import os

import pytest
import torch
from expecttest import TestCase

from fuse_attn.kernels import plan
from fuse_attn.kernels import score_program_eval, tuning, flash_attention

from fuse_attn.kernels.generated import launch
from fuse_attn.score_program import MASKING_FILL_LIMIT, ScoreProgramBuilder, ScoreTensor, program_text, subprogram
from fuse_attn.spec import AttentionSpec, CausalMask
from tests.support.graph_capture import rewrite_reports, verdict_lines
from tests.support.cases import make_case, run_and_check

pytestmark = [pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning",
                                         "ignore:divide by zero encountered:RuntimeWarning",
                                         "ignore:overflow encountered:RuntimeWarning"),
              pytest.mark.skipif(os.environ["TRITON_INTERPRET"] != "1", reason="needs a TRITON_INTERPRET=1 session")]

FMIN = torch.finfo(torch.float32).min


def additive(b, s, loads):
    return b.add("add", s, loads[0])


def mask_case(mask: torch.Tensor, Z=2, H=2, D=16, dtype=torch.float32, gqa=1, dropout_p=0.0, seed=0):
    """q, k, v and the spec of ``s + mask`` for a ``[Z or 1, 1, M, N]`` mask (no gradient), the mask in ``dtype``."""
    M, N = mask.shape[-2:]
    q, k, v, _, spec = make_case(Z=Z, H=H, M=M, N=N, D=D, dtype=dtype, bias=(mask.shape[0], 1, M, N), gqa=gqa,
                                 program=additive, seed=seed, dropout_p=dropout_p)
    assert plan.mask_blocks(spec)[:2] == (0, "fill")
    # Hugging Face fills with the model dtype's finfo.min (fp32's would round to -inf in bf16)
    mask = torch.where(mask == FMIN, torch.finfo(dtype).min, mask).to(dtype)
    return q, k, v, [mask], spec


def bool_program(hidden: str, fill: float):
    """``where(mask, s, fill)`` (hidden where False) or ``where(mask, fill, s)`` (hidden where True)."""
    b = ScoreProgramBuilder()
    s, mask, c = b.add("score"), b.add("load", value=0), b.const(fill)
    return b.program(b.add("where", mask, s, c) if hidden == "false" else b.add("where", mask, c, s))


def softcap_plus_mask():
    b = ScoreProgramBuilder()
    capped = b.add("mul", b.add("tanh", b.add("div", b.add("score"), b.const(50.0))), b.const(50.0))
    return b.program(b.add("add", capped, b.add("load", value=0)))


def floored(b, s, loads):
    """``maximum(s + mask, finfo.min)``: fsmt's and grounding-dino's clamp after the mask."""
    return b.add("maximum", b.add("add", s, loads[0]), b.const(FMIN))


def causal_fill(M, N, fill=FMIN, Z=1):
    i, j = torch.arange(M)[:, None], torch.arange(N)[None, :]
    return torch.where(j <= i, 0.0, fill).expand(Z, 1, M, N).clone()


def padded_causal(M, N, lengths, fill=FMIN):
    """Hugging Face's padding + causal mask: key j of batch row z visible iff j <= i and j < lengths[z]."""
    mask = causal_fill(M, N, fill, Z=len(lengths))
    for z, n in enumerate(lengths):
        mask[z, :, :, n:] = fill
    return mask


def random_holes(Z, M, N, hidden_row):
    mask = torch.where(torch.rand(Z, 1, M, N, generator=torch.Generator().manual_seed(3)) < 0.6, 0.0, FMIN)
    mask[:, :, hidden_row] = FMIN  # uniform over every key in eager: its query block must not skip any
    return mask


def classify(mask, rows, cols):
    """Each tile's class by brute force: 0 full, 1 partial, 2 empty (launch's order)."""
    Z, _, M, N = mask.shape
    hidden = mask[:, 0] <= MASKING_FILL_LIMIT
    keeps = (~hidden).any(-1)  # [Z, M]
    out = torch.empty(Z, -(-M // rows), -(-N // cols), dtype=torch.int32)
    for z in range(Z):
        for r in range(out.shape[1]):
            for c in range(out.shape[2]):
                tile = mask[z, 0, r * rows:(r + 1) * rows, c * cols:(c + 1) * cols]
                inside = tile.shape == (rows, cols)
                if inside and bool((tile == 0).all()):
                    out[z, r, c] = 0
                elif bool((tile <= MASKING_FILL_LIMIT).all()) and bool(keeps[z, r * rows:(r + 1) * rows].all()):
                    out[z, r, c] = 2
                else:
                    out[z, r, c] = 1
    return out


@pytest.mark.parametrize("key_major", [False, True])
@pytest.mark.parametrize("rows, cols, granule", [(16, 16, 16), (16, 32, 16), (32, 16, 8)])
def test_block_lists_match_a_brute_force_classification(key_major, rows, cols, granule):
    # granule < cols: the tiles of a kernel whose key block spans several granules (the backward reads the mask
    # once, at a granule that divides both of its kernels' key blocks)
    mask = padded_causal(45, 53, [53, 20, 0])
    mask[1, :, 7, :] = FMIN  # a row that keeps no visible key: its query block is never skipped
    mask[0, :, 40:45, 0:16] = 3.0  # a partial block below the diagonal
    mask[0, :, 20:24, 40:41] = 0.0  # a single visible key past the diagonal (1 of a 32-key block's granules)
    q, k, v, tensors, spec = mask_case(mask, Z=3)
    granules = launch.mask_granules(spec, tensors, 45, 53, granule)
    args = launch.mask_block_args(granules, 45, 53, rows, cols, key_major, q)
    assert args["MASK_BLOCKS"] and args["stride_blist_z"] > 0
    classes = classify(mask, rows, cols)
    if key_major:
        classes = classes.transpose(1, 2)
    lists, counts = args["BlockList"], args["BlockCounts"]
    for z in range(3):
        for r in range(classes.shape[1]):
            n_run, n_rest = counts[z, r].tolist()
            row = classes[z, r]
            n_full, n_partial = int((row == 0).sum()), int((row == 1).sum())
            listed = lists[z, r].tolist()
            assert sorted(listed) == list(range(len(row)))
            assert [int(row[c]) for c in listed] == sorted(row.tolist())  # full, then partial, then empty
            # the kernels visit the first run of consecutive full blocks as a range, the other full blocks with the
            # partial ones: the run is the longest prefix of the (ascending) full entries without a gap
            full = listed[:n_full]
            assert full == sorted(full) and n_run + n_rest == n_full + n_partial
            assert full[:n_run] == list(range(full[0], full[0] + n_run)) if n_full else n_run == 0
            assert n_run == n_full or full[n_run] != full[0] + n_run

    # the fully padded batch row (length 0) keeps no visible key anywhere: nothing of it is skipped
    assert int((classes[2] == 2).sum()) == 0


def test_a_mask_shared_by_the_batch_has_stride_zero():
    q, k, v, tensors, spec = mask_case(causal_fill(40, 40))
    args = launch.mask_block_args(launch.mask_granules(spec, tensors, 40, 40, 16), 40, 40, 32, 16, False, q)
    assert args["BlockList"].shape == (1, 2, 3) and args["stride_blist_z"] == 0 and args["stride_bcount_z"] == 0


@pytest.mark.parametrize("name, mask", [
    ("causal, finfo.min", causal_fill(97, 97)),
    ("causal, -inf", causal_fill(64, 80, float("-inf"))),
    ("padding + causal", padded_causal(70, 70, [70, 33])),
    ("padding + causal, a batch row of no visible key (uniform rows)", padded_causal(70, 70, [70, 0])),
    ("all zero: every tile full", torch.zeros(2, 1, 33, 47)),
    ("random holes, one row hidden whole", random_holes(2, 50, 61, hidden_row=9)),
])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_results_are_those_of_the_whole_computation(name, mask, dtype):
    # (rows hidden whole take their own statistics in the bf16 backward too, over the listed tiles: IMPRECISE_LSE)
    q, k, v, tensors, spec = mask_case(mask, Z=mask.shape[0] if mask.shape[0] > 1 else 2, dtype=dtype)
    run_and_check(q, k, v, tensors, spec, dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_full_tiles_after_a_gap_run_with_the_predicate(dtype):
    # hidden keys 40-42 split every query block's full tiles (and a bias patch a key block's full query blocks): the
    # first run of full tiles is visited as a range of blocks, the full tiles after the gap through the list, with
    # the predicate, as partial ones are
    mask = torch.zeros(2, 1, 70, 97)
    mask[:, :, :, 40:43] = FMIN
    mask[1, :, 20:26, 70:75] = 2.0
    q, k, v, tensors, spec = mask_case(mask, dtype=dtype)
    for rows, cols, key_major in ((32, 16, False), (16, 32, True)):  # the interpreter's forward / dQ and dK/dV tiles
        granules = launch.mask_granules(spec, tensors, 70, 97, 16)
        args = launch.mask_block_args(granules, 70, 97, rows, cols, key_major, q)
        classes = classify(mask, rows, cols)
        n_full = (classes.transpose(1, 2) if key_major else classes).eq(0).sum(-1)
        assert int(args["BlockCounts"][..., 0].sum()) < int(n_full.sum()), (rows, cols)
    run_and_check(q, k, v, tensors, spec, dtype)


def check_with_nan_positions_of_the_semantics(q, k, v, tensors, spec, dtype, nan_rows, seed=1):
    """``run_and_check`` for a case whose results hold NaN: out and the gradients of q, k, v of ours against the
    fp64 reference and eager in ``dtype``, where the expected NaN positions are the semantics' -- ``nan_rows``
    (``[Z, H or 1, M]``, the query rows whose output is NaN) for out, and where the fp64 reference has them for
    everything -- never eager's in ``dtype``. A fully masked row of P is NaN, and each entry of P @ V reads one row
    of P, but torch's bf16 CPU matmul does not keep to that on every CPU: on one with AMX-BF16 (oneDNN's AMX
    kernels) the NaN of row 12 of P also reaches row 11 of P @ V. The fp64 reference's matmuls (BLAS dgemm; AMX
    has no fp64) keep each NaN in its row on any CPU. The 2x rule compares the entries that are finite in the
    reference, eager's error taken over those finite in eager too."""
    from fuse_attn.kernels import reference_attention  # (imported here: the module's import block is shared)
    from tests.support.numerics import FLOOR

    def leaves(cast):
        return [t.detach().to(cast).requires_grad_() for t in (q, k, v)]

    def max_abs(x):
        return x.abs().max().item() if x.numel() else 0.0

    ours_in, ref_in, eager_in = leaves(dtype), leaves(torch.float64), leaves(dtype)
    out = flash_attention(*ours_in, spec, tensors)
    ref, _ = reference_attention(*ref_in, tensors, spec)
    eager, _ = reference_attention(*eager_in, tensors, spec)
    assert torch.equal(ref.isnan(), nan_rows[..., None].expand(ref.shape))
    dout = torch.randn(out.shape, generator=torch.Generator().manual_seed(seed)).to(dtype)
    results = [("out", out, ref, eager)] + list(zip(
        ("dq", "dk", "dv"), torch.autograd.grad(out, ours_in, dout), torch.autograd.grad(ref, ref_in, dout.double()),
        torch.autograd.grad(eager, eager_in, dout)))
    for name, ours, ref64, eag in results:
        assert ours.shape == ref64.shape and ours.dtype == dtype, name
        assert torch.equal(ours.isnan(), ref64.isnan()), f"{name}: NaN positions differ from the fp64 reference's"
        known = ref64.isfinite()
        err = max_abs(ours.double()[known] - ref64[known])
        both = known & eag.isfinite()
        err_eager = max_abs(eag.double()[both] - ref64[both])
        floor = FLOOR[dtype] * max(1.0, max_abs(ref64[known]))
        assert err <= 2 * err_eager + floor, f"{name}: max|ours-ref|={err:.3g} > 2*{err_eager:.3g} + {floor:.3g}"


@pytest.mark.parametrize("hidden", ["false", "true"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("empty_rows", ["nan", "zero"])
def test_bool_masks(hidden, dtype, empty_rows):
    # SDPA's convention (True: visible) and masked_fill's (True: hidden), -inf fill; batch row 1 padded to 30 keys
    # and one of its rows hidden whole (NaN in eager, 0 in SDPA: that query block visits every tile)
    M = N = 70
    visible = padded_causal(M, N, [N, 30]) == 0
    visible[1, :, 12] = False
    mask = visible if hidden == "false" else ~visible
    q, k, v, _, _ = make_case(Z=2, H=2, M=M, N=N, D=16, dtype=dtype)
    spec = AttentionSpec(dtype=str(dtype).split(".")[1], head_dim=16, head_dim_v=16, scale=0.25,
                         score_program=bool_program(hidden, float("-inf")),
                         score_tensors=(ScoreTensor("mask", "bool", (False, True, False, False)),), empty_rows=empty_rows)
    assert plan.mask_blocks(spec)[:2] == (0, hidden)
    # the rows of no visible key: NaN under empty_rows="nan" (eager softmax), 0 under "zero" (SDPA)
    nan_rows = ~visible.any(-1) if empty_rows == "nan" else torch.zeros(2, 1, M, dtype=torch.bool)
    check_with_nan_positions_of_the_semantics(q, k, v, [mask], spec, dtype, nan_rows)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_program_before_the_mask(dtype):
    # Gemma-2's eager order, tanh(s / 50) * 50 + mask: full tiles run the softcap alone, empty ones are skipped
    mask = padded_causal(70, 70, [70, 40])
    q, k, v, _, _ = make_case(Z=2, H=2, M=70, N=70, D=16, dtype=dtype)
    q = q * 8  # scores past the softcap's linear range
    spec = AttentionSpec(dtype=str(dtype).split(".")[1], head_dim=16, head_dim_v=16, scale=0.25,
                         score_program=softcap_plus_mask(),
                         score_tensors=(ScoreTensor("bias", str(dtype).split(".")[1], (False, True, False, False)),))
    assert plan.mask_blocks(spec)[:2] == (0, "fill")
    mask = torch.where(mask == FMIN, torch.finfo(dtype).min, mask).to(dtype)
    run_and_check(q, k, v, [mask], spec, dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_floor_after_the_mask(dtype):
    # maximum(s + mask, finfo.min): an -inf in the mask becomes finfo.min, still hidden; full tiles run s alone
    mask = padded_causal(70, 70, [70, 40], fill=float("-inf"))
    q, k, v, _, spec = make_case(Z=2, H=2, M=70, N=70, D=16, dtype=dtype, bias=(2, 1, 70, 70), program=floored)
    assert plan.mask_blocks(spec)[:2] == (0, "fill")
    assert program_text(plan.unmasked_spec(spec).score_program, ()) == "s"
    run_and_check(q, k, v, [mask.to(dtype)], spec, dtype)


def test_gqa_and_dropout():
    q, k, v, tensors, spec = mask_case(padded_causal(48, 48, [48, 30]), H=4, gqa=2, dropout_p=0.2)
    run_and_check(q, k, v, tensors, spec, torch.float32, dropout_seed=torch.tensor(1234))


def test_a_row_of_only_minus_inf_stays_nan():
    mask = causal_fill(40, 40, float("-inf"), Z=2)
    mask[1, :, 5, :] = float("-inf")  # eager softmax: NaN for that row; not skipped, so computed as NaN
    q, k, v, tensors, spec = mask_case(mask)
    out = flash_attention(q, k, v, spec, tensors)
    assert out[1, :, 5].isnan().all() and not out[0].isnan().any() and not out[1, :, 6:].isnan().any()


@pytest.mark.parametrize("enabled", [True, False])
def test_empty_tiles_are_not_read(enabled, monkeypatch):
    # Keys 32..63 are hidden from query block 0 (rows 0..31) by the causal mask, whole tiles of it: skipped, their
    # NaN values never reach that block's rows. The summaries switched off, those tiles are computed, and 0 * NaN
    # turns the rows NaN -- so the test can tell a skipped tile from a computed one.
    monkeypatch.setenv("FUSE_ATTN_MASK_BLOCKS", "1" if enabled else "0")
    q, k, v, tensors, spec = mask_case(causal_fill(64, 64))
    v = v.clone()
    v[:, :, 48:] = float("nan")
    out = flash_attention(q, k, v, spec, tensors)
    assert out[:, :, :32].isnan().any() != enabled


def test_gradients_of_skipped_tiles(monkeypatch):
    # dK / dV of keys that every query hides are 0 whether their tiles are skipped or computed
    mask = causal_fill(64, 64)
    results = []
    for enabled in ("1", "0"):
        monkeypatch.setenv("FUSE_ATTN_MASK_BLOCKS", enabled)
        q, k, v, tensors, spec = mask_case(mask)
        q, k, v = (t.requires_grad_() for t in (q, k, v))
        out = flash_attention(q, k, v, spec, tensors)
        results.append(torch.autograd.grad(out, (q, k, v), torch.ones_like(out)))
    for a, b in zip(*results):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_which_specs_are_summarized():
    b = ScoreProgramBuilder()
    plain = b.program(b.add("add", b.add("score"), b.add("load", value=0)))

    def spec(program=plain, broadcast=(False, True, False, False), causal=None, role="bias"):
        return AttentionSpec(dtype="float32", head_dim=16, head_dim_v=16, scale=0.25, causal=causal, score_program=program,
                             score_tensors=(ScoreTensor(role, "float32", broadcast),))

    assert plan.mask_blocks(spec()) == plan.MaskBlocks(0, "fill", 0)
    assert plan.mask_blocks(spec(broadcast=(True, True, False, False))) == plan.MaskBlocks(0, "fill", 0)
    assert plan.mask_blocks(spec(broadcast=(False, False, False, False))) is None  # per head: one summary per head
    assert plan.mask_blocks(spec(broadcast=(False, True, True, False))) is None  # a key padding vector (key_padding)
    assert plan.mask_blocks(spec(causal=CausalMask())) is None  # the band already skips blocks, at compile time
    b = ScoreProgramBuilder()
    softcapped = b.program(b.add("tanh", b.add("add", b.add("score"), b.add("load", value=0))))
    assert plan.mask_blocks(spec(program=softcapped)) is None  # where the mask is 0 the program is not s itself
    for fill, kept in ((float("-inf"), True), (FMIN, True), (-1e4, False)):  # -1e4 hides less than the limit
        for hidden in ("false", "true"):
            expected = plan.MaskBlocks(0, hidden, 0) if kept else None
            assert plan.mask_blocks(spec(program=bool_program(hidden, fill), role="mask")) == expected
    for floor, kept in ((FMIN, True), (-1e4, False)):  # a floor above the limit would hide nothing
        for op in ("maximum", "clamp_min"):
            b = ScoreProgramBuilder()
            program = b.program(b.add(op, b.add("add", b.add("score"), b.add("load", value=0)), b.const(floor)))
            assert plan.mask_blocks(spec(program=program)) == (plan.MaskBlocks(0, "fill", 0) if kept else None)
    capped = spec(program=softcap_plus_mask())  # Gemma-2's eager order: the softcap, then the mask
    assert plan.mask_blocks(capped)[:2] == (0, "fill")
    assert program_text(plan.unmasked_spec(capped).score_program, ()) == "tanh(s / 50) * 50"
    b = ScoreProgramBuilder()
    s = b.add("score")
    banded = b.add("where", b.add("le", b.add("kv_idx"), b.add("q_idx")), s, b.const(float("-inf")))
    assert plan.mask_blocks(spec(program=b.program(b.add("add", banded, b.add("load", value=0))))) is None  # masks itself


def test_no_summary_for_a_mask_that_needs_a_gradient():
    q, k, v, tensors, spec = mask_case(causal_fill(40, 40))
    tensors = [tensors[0].clone().requires_grad_()]
    run_and_check(q, k, v, tensors, spec, torch.float32)


@pytest.fixture
def mask_reads(monkeypatch) -> list:
    """The granule of every summary of a mask (every read of it) the launcher makes, in order."""
    reads = []
    summarize = launch.mask_granules
    monkeypatch.setattr(launch, "mask_granules", lambda *args: reads.append(args[4]) or summarize(*args))
    return reads


def test_an_op_call_reads_the_mask_once(mask_reads):
    # one summary per op call: the forward's kernel, and the backward's two kernels from one granule read
    reads = mask_reads
    q, k, v, tensors, spec = mask_case(padded_causal(40, 40, [40, 20]))
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    out = flash_attention(q, k, v, spec, tensors)
    assert len(reads) == 1
    out.sum().backward()
    assert len(reads) == 2 and reads[1] == 16  # the gcd of the dQ kernel's 16 and the dK/dV kernel's 32 keys


@pytest.mark.parametrize("hidden", ["fill", "false", "true"])
def test_the_tuner_times_a_causal_mask(hidden):
    # the tuner's random copy of the mask would leave every tile partial; it gets a causal one of the mask's layout
    if hidden == "fill":
        spec = mask_case(causal_fill(6, 9))[4]
        tuning = torch.randn(1, 1, 6, 9, dtype=torch.bfloat16).expand(3, 1, 6, 9)  # a batch-broadcast mask
    else:
        spec = AttentionSpec(dtype="float32", head_dim=16, head_dim_v=16, scale=0.25, score_program=bool_program(hidden, FMIN),
                             score_tensors=(ScoreTensor("mask", "bool", (False, True, False, False)),))
        tuning = torch.rand(3, 1, 6, 9) < 0.5
    launch.realistic_tuning_masks(spec, [tuning])
    i, j = torch.arange(6)[:, None], torch.arange(9)[None, :]
    visible = (j <= i + 3).expand(3, 1, 6, 9)  # bottom-right aligned, as a KV cache's queries see their keys
    expected = {"fill": torch.where(visible, 0.0, torch.finfo(torch.bfloat16).min).to(torch.bfloat16),
                "false": visible, "true": ~visible}[hidden]
    assert torch.equal(tuning, expected)
    granules = launch.mask_granules(spec, [tuning], 6, 9, 3)
    assert granules.hidden.any() and granules.unchanged.any()  # full and empty tiles to time, not only partial ones


def test_the_summary_compiles_with_symbolic_lengths():
    # Under torch.compile on a GPU the launcher's summary is traced into the graph with symbolic lengths and
    # compiled by Inductor, as the key range is; the same here with Inductor's CPU code.
    spec = mask_case(causal_fill(40, 40))[4]

    def summary(mask):
        granules = launch.mask_granules(spec, [mask], mask.shape[2], mask.shape[3], 8)
        args = launch.mask_block_args(granules, mask.shape[2], mask.shape[3], 32, 16, True, mask)
        return args["BlockList"], args["BlockCounts"]

    compiled = torch.compile(summary, dynamic=True, fullgraph=True)
    for M, N in ((40, 40), (57, 70)):
        mask = padded_causal(M, N, [N, N // 2])
        for a, b in zip(compiled(mask), summary(mask)):
            assert torch.equal(a, b)


class TestVerdicts(TestCase):
    def test_a_mask_from_a_graph_input_is_classified_per_call(self):
        def additive(q, k, v, mask):
            return torch.softmax(q @ k.transpose(-1, -2) * 0.25 + mask, -1) @ v

        def bool_visible(q, k, v, keep):
            return torch.softmax((q @ k.transpose(-1, -2) * 0.25).masked_fill(~keep, float("-inf")), -1) @ v

        q, k, v = (torch.randn(2, 2, 24, 16) for _ in range(3))
        mask = padded_causal(24, 24, [24, 10])
        self.assertExpectedInline(verdict_lines(rewrite_reports(additive, q, k, v, mask)), """fused softmax: float32 D=16 M=24 N=24 scale=0.25 s -> s + bias0[Z,1,M,N] tiles classified per call (bias0)""")
        self.assertExpectedInline(verdict_lines(rewrite_reports(bool_visible, q, k, v, mask == 0)), """fused softmax: float32 D=16 M=24 N=24 scale=0.25 s -> where(mask0[Z,1,M,N], -inf, s) tiles classified per call (mask0)""")

    def test_a_floored_mask_from_a_graph_input(self):
        # fsmt's eager attention: the mask added, then torch.max with finfo.min
        def floored(q, k, v, mask):
            w = q @ k.transpose(-1, -2) * 0.25 + mask
            w = torch.max(w, torch.tensor(torch.finfo(w.dtype).min))
            return torch.softmax(w, -1) @ v

        q, k, v = (torch.randn(2, 2, 24, 16) for _ in range(3))
        mask = padded_causal(24, 24, [24, 10])
        self.assertExpectedInline(verdict_lines(rewrite_reports(floored, q, k, v, mask)), """fused softmax: float32 D=16 M=24 N=24 scale=0.25 s -> maximum(s + bias0[Z,1,M,N], -3.40282e+38) tiles classified per call (bias0)""")

    def test_a_mask_built_in_the_graph_is_read_at_compile_time_instead(self):
        def causal(q, k, v):
            n = q.shape[-2]
            mask = torch.full((n, n), float("-inf")).triu(1)
            return torch.softmax(q @ k.transpose(-1, -2) * 0.25 + mask, -1) @ v

        q, k, v = (torch.randn(2, 2, 24, 16) for _ in range(3))
        self.assertExpectedInline(verdict_lines(rewrite_reports(causal, q, k, v)), """fused softmax: float32 D=16 M=24 N=24 scale=0.25 causal(top_left, diagonal=0)""")


def test_the_tuner_reads_the_mask_once_per_set_of_tuning_tensors(mask_reads, monkeypatch):
    # the tuner times many configs on one set of tensors: the summary and block lists come from its first launch,
    # not from each timed one (their eager torch ops would be timed as host time, alike for every candidate)
    reads, repeated = mask_reads, []

    def tuner(kind, q, kernel_id, common, candidates, bind, m=None, n=None):
        cfg = tuning.INTERPRETER_CONFIGS[kind]
        run = bind()
        run(cfg, False)
        first = len(reads)
        for _ in range(3):  # timed launches of the same config
            run(cfg, False)
        repeated.append((kind, len(reads) - first))
        return cfg

    monkeypatch.setattr(launch, "choose_kernel_config", tuner)
    q, k, v, tensors, spec = mask_case(padded_causal(40, 40, [40, 20]))
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    flash_attention(q, k, v, spec, tensors).sum().backward()
    assert {kind for kind, _ in repeated} == {"fwd", "bwd_dq", "bwd_dkdv"}
    assert all(count == 0 for _, count in repeated), repeated


# ---- a predicate of integer vectors (packed documents) -------------------------------------------------------------
def documents_spec(form: str, dtype=torch.float32, strict=False):
    """Packed documents as Hugging Face's eager attention (``s + where(P, 0, finfo.min)``) or SDPA call
    (``where(~P, -inf, s)``, empty rows 0) computes them, ``P = (pos_k <= pos_q) & (ids_q == ids_k)`` (``<`` where
    ``strict``: each document's first token then sees no key); the tensors from :func:`documents_tensors`."""
    b = ScoreProgramBuilder()
    s = b.add("score")
    pos_k, pos_q, ids_q, ids_k = (b.load(i, "int") for i in range(4))
    keep = b.add("logical_and", b.add("lt" if strict else "le", pos_k, pos_q), b.add("eq", ids_q, ids_k))
    if form == "eager":
        root = b.add("add", s, b.add("where", keep, b.const(0.0), b.const(torch.finfo(dtype).min)))
    else:
        root = b.add("where", b.add("logical_not", keep), b.const(float("-inf")), s)
    rows, cols = (False, True, False, True), (False, True, True, False)
    tensors = tuple(ScoreTensor("int", "int64", broadcast) for broadcast in (cols, rows, rows, cols))
    return AttentionSpec(dtype=str(dtype).split(".")[1], head_dim=16, head_dim_v=16, scale=0.25,
                         score_program=b.program(root), score_tensors=tensors,
                         empty_rows="nan" if form == "eager" else "zero")


def documents_tensors(ids: torch.Tensor) -> list:
    """The loads of :func:`documents_spec` for ``[Z, L]`` document ids: positions restart where the id changes."""
    starts = torch.ones_like(ids, dtype=torch.bool)
    starts[:, 1:] = ids[:, 1:] != ids[:, :-1]
    index = torch.arange(ids.shape[1]).expand_as(ids)
    positions = index - torch.cummax(torch.where(starts, index, 0), -1).values
    return [positions[:, None, None, :], positions[:, None, :, None], ids[:, None, :, None], ids[:, None, None, :]]


def written_out(spec, tensors):
    """A spec's predicate mask written out, ``[Z, 1, M, N]`` (0 where it keeps a key, finfo.min where it hides one),
    and the spec of ``s + mask`` that summarizes it as a tensor: the exact granules to hold the bounded ones to."""
    summarized = plan.mask_blocks(spec)
    Z, M, N = max(t.shape[0] for t in tensors), max(t.shape[2] for t in tensors), max(t.shape[3] for t in tensors)
    s = torch.zeros(Z, 1, M, N)
    indices = score_program_eval.torch_indices(0, M, Z, 1, M, N, s.device)
    predicate = score_program_eval.forward(subprogram(spec.score_program, summarized.predicate),
                                           score_program_eval.TorchOps(s, tensors, indices))[-1]
    keeps = predicate if summarized.hidden == "false" else ~predicate
    b = ScoreProgramBuilder()
    bias = dataclasses.replace(spec, score_program=b.program(b.add("add", b.add("score"), b.add("load", value=0))),
                               score_tensors=(ScoreTensor("bias", "float32", (False, True, False, False)),))
    return torch.where(keeps, 0.0, FMIN).expand(Z, 1, M, N), bias


def assert_granules_are_proofs(spec, tensors, granule, exact_where=()):
    """Where the granules from a predicate's bounds say hidden, unchanged or a row keeping a visible key, the mask
    written out says so too; for the names in ``exact_where``, they say all of it."""
    mask, bias = written_out(spec, tensors)
    M, N = mask.shape[-2:]
    exact = launch.mask_granules(bias, [mask], M, N, granule)
    bounded = launch.mask_granules(spec, tensors, M, N, granule)
    for name in ("hidden", "unchanged", "keeps_visible"):
        ours, truth = getattr(bounded, name), getattr(exact, name)
        assert not (ours & ~truth).any(), name  # never claimed where it does not hold
        if name in exact_where:
            assert torch.equal(ours, truth), name
    return bounded


# ids: documents of 16 and 32 tokens (no granule holds two), and documents of any length, unsorted, an id that comes
# back after another
ALIGNED = torch.tensor([[0] * 16 + [1] * 32 + [2] * 16 + [3] * 16, [5] * 48 + [0] * 32])
ANY = torch.tensor([[0] * 7 + [1] * 20 + [2] * 30 + [3] * 13 + [4] * 10, [3] * 25 + [0] * 9 + [3] * 40 + [1] * 6])


@pytest.mark.parametrize("strict", [False, True])
@pytest.mark.parametrize("granule", [8, 16])
def test_a_predicates_granules_are_proofs(strict, granule):
    """The granules of packed documents from the vectors' bounds are proofs; with no granule holding two documents,
    they are exact (but for a row's visible key where the predicate hides a row's own key: strictly causal)."""
    for ids in (ALIGNED, ANY):
        spec = documents_spec("eager", strict=strict)
        assert plan.mask_blocks(spec)[:2] == (None, "false") and plan.mask_blocks(spec).predicate is not None
        exact = ("hidden", "unchanged") + (() if strict else ("keeps_visible",)) if ids is ALIGNED else ()
        bounded = assert_granules_are_proofs(spec, documents_tensors(ids), granule, exact)
        assert bounded.hidden.any() and bounded.unchanged.any()


def test_interval_ops_bound_every_value():
    """Each op of ``IntervalOps`` (every op of ``plan.PREDICATE_OPS``) on random spans and truths, each holding a
    random value: the result holds torch's op of the values -- so a bool it calls certain is -- with bools taken as
    the integers 0 and 1 where an integer op reads them."""
    g = torch.Generator().manual_seed(0)
    n = 4000

    def span():
        a, b = torch.randint(-6, 7, (2, n), generator=g)
        lo, hi = torch.minimum(a, b), torch.maximum(a, b)
        return score_program_eval.Span(lo, hi), lo + (torch.rand(n, generator=g) * (hi - lo + 1)).long()

    def truth():
        may_be_true, either = torch.rand(2, n, generator=g) < 0.5
        may_be_false = ~may_be_true | either
        may_be_true = may_be_true | either
        value = torch.where(either, torch.rand(n, generator=g) < 0.5, may_be_true)
        return score_program_eval.Truth(may_be_true, may_be_false), value

    ops = score_program_eval.IntervalOps({}, {}, "cpu")
    integer = lambda: span() if torch.rand(1, generator=g) < 0.8 else truth()  # noqa: E731
    cases = [(op, fn, (integer,) * arity) for op, fn, arity in (
        ("neg", torch.neg, 1), ("add", torch.add, 2), ("sub", torch.sub, 2), ("maximum", torch.maximum, 2),
        ("minimum", torch.minimum, 2), ("lt", torch.lt, 2), ("le", torch.le, 2), ("gt", torch.gt, 2),
        ("ge", torch.ge, 2), ("eq", torch.eq, 2), ("ne", torch.ne, 2))]
    cases += [("logical_not", torch.logical_not, (truth,)), ("logical_and", torch.logical_and, (truth, truth)),
              ("logical_or", torch.logical_or, (truth, truth)), ("where", torch.where, (truth, span, span)),
              ("where", torch.where, (truth, truth, truth))]
    assert {op for op, _, _ in cases} == set(plan.PREDICATE_OPS)
    for op, fn, makers in cases:
        for _ in range(20):
            args = [make() for make in makers]
            values = [value.long() if op not in ("logical_not", "logical_and", "logical_or", "where") else value
                      for _, value in args]
            bounds, exact = getattr(ops, op)(*(bound for bound, _ in args)), fn(*values)
            if isinstance(bounds, score_program_eval.Span):
                assert ((bounds.lo <= exact) & (exact <= bounds.hi)).all(), op
            else:
                assert (bounds.may_be_true | ~exact).all() and (bounds.may_be_false | exact).all(), op


# each op of plan.PREDICATE_OPS with the kinds of its operands (s: an integer span, t: a bool's truth)
OP_OPERANDS = {"neg": "s", "add": "ss", "sub": "st", "maximum": "ts", "minimum": "ss", "lt": "ss", "le": "st",
               "gt": "ss", "ge": "ts", "eq": "ss", "ne": "st", "logical_not": "t", "logical_and": "tt",
               "logical_or": "tt", "where": "tss"}


@pytest.mark.parametrize("op", list(OP_OPERANDS) + ["where of truths"])
def test_the_kernels_interval_rules_are_interval_ops(op, tmp_path):
    """Each op's bounds as Triton lines (codegen.TritonIntervalOps, what the tile-classes kernel runs), run in the
    interpreter on random spans and truths, equal IntervalOps' (the reference's) element for element."""
    import importlib.util

    from fuse_attn.kernels.generated import codegen

    assert set(OP_OPERANDS) == set(plan.PREDICATE_OPS)  # (a new op needs its case here)
    kinds = "ttt" if op == "where of truths" else OP_OPERANDS[op]
    name = "where" if op == "where of truths" else op
    g = torch.Generator().manual_seed(0)
    n = 256
    inputs, torch_args, triton_args, params, loads = [], [], [], [], []
    for i, kind in enumerate(kinds):
        if kind == "s":
            a, b = torch.randint(-6, 7, (2, n), generator=g)
            values = (torch.minimum(a, b), torch.maximum(a, b))
            torch_args.append(score_program_eval.Span(*values))
            names = (f"x{i}_lo", f"x{i}_hi")
            triton_args.append(("span", *names))
            loads += [f"{names[0]} = tl.load(X{i}_0 + i)", f"{names[1]} = tl.load(X{i}_1 + i)"]
        else:
            may_be_true, either = torch.rand(2, n, generator=g) < 0.5
            values = (may_be_true | either, ~may_be_true | either)
            torch_args.append(score_program_eval.Truth(*values))
            names = (f"x{i}_t", f"x{i}_f")
            triton_args.append(("truth", *names))
            loads += [f"{names[0]} = tl.load(X{i}_0 + i) != 0", f"{names[1]} = tl.load(X{i}_1 + i) != 0"]
            values = tuple(v.to(torch.int64) for v in values)
        inputs += list(values)
        params += [f"X{i}_0", f"X{i}_1"]
    expected = getattr(score_program_eval.IntervalOps({}, {}, "cpu"), name)(*torch_args)
    ops = codegen.TritonIntervalOps({"q_idx": ("x0_lo", "x0_hi")})
    kind, first, second = getattr(ops, name)(*triton_args)
    assert kind == ("span" if isinstance(expected, score_program_eval.Span) else "truth")
    body = loads + ops.lines + [f"tl.store(Out0 + i, ({first}).to(tl.int64))", f"tl.store(Out1 + i, ({second}).to(tl.int64))"]
    source = "\n".join(["import triton", "import triton.language as tl", "", "", "@triton.jit",
                         f"def rule({', '.join(params)}, Out0, Out1, BLOCK: tl.constexpr):", "    i = tl.arange(0, BLOCK)"]
                        + ["    " + line for line in body]) + "\n"
    path = tmp_path / f"rule_{name}.py"
    path.write_text(source)
    module_spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    outs = [torch.empty(n, dtype=torch.int64) for _ in range(2)]
    module.rule[(1,)](*inputs, *outs, BLOCK=n)
    for ours, theirs in zip(outs, expected):
        assert torch.equal(ours, theirs.to(torch.int64)), (op, source)


@pytest.mark.parametrize("enabled", [True, False])
def test_a_predicates_empty_tiles_are_not_read(enabled, monkeypatch):
    # two documents of 32 tokens: the second one's keys are hidden from the first one's queries, whole tiles of them:
    # skipped, their NaN values never reach those rows (as test_empty_tiles_are_not_read)
    monkeypatch.setenv("FUSE_ATTN_MASK_BLOCKS", "1" if enabled else "0")
    spec = documents_spec("sdpa")
    q, k, v, _, _ = make_case(Z=1, H=2, M=64, N=64, D=16)
    v[:, :, 48:] = float("nan")
    out = flash_attention(q, k, v, spec, documents_tensors(torch.tensor([[0] * 32 + [1] * 32])))
    assert out[:, :, :32].isnan().any() != enabled


@pytest.mark.parametrize("strict", [False, True])
@pytest.mark.parametrize("form", ["eager", "sdpa"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_predicates_tiles_give_the_whole_computation(form, strict, dtype):
    """Output and gradients under the 2x rule with the tiles classified from the vectors: documents of any length,
    unsorted ids, an id coming back; strictly causal, each document's first token sees no key -- eager's uniform
    row over every key (finfo.min) or SDPA's 0 -- so its query block skips nothing. (bf16 rows masked whole with
    finfo.min take their own statistics in the backward, over the listed tiles: the template's IMPRECISE_LSE.)"""
    spec = documents_spec(form, dtype, strict)
    tensors = documents_tensors(torch.tensor([[0] * 40 + [1] * 9 + [2] * 31, [4] * 20 + [2] * 44 + [4] * 16]))
    q, k, v, _, _ = make_case(Z=2, H=2, M=80, N=80, D=16, dtype=dtype)
    granules = launch.mask_granules(spec, tensors, 80, 80, 16)
    visited = int(launch.mask_block_args(granules, 80, 80, 32, 16, False, q)["BlockCounts"].sum())
    assert strict or visited < 2 * 3 * 5  # tiles skipped (of 2 batch rows x 3 query blocks x 5 key blocks)
    check_with_nan_positions_of_the_semantics(q, k, v, tensors, spec, dtype, torch.zeros(2, 1, 80, dtype=torch.bool))


def test_a_predicates_summary_traces_with_symbolic_lengths():
    # as test_the_summary_compiles_with_symbolic_lengths, traced as the op's body is on a GPU: under fake tensors of
    # symbolic lengths (make_fx, as AOTAutograd; not Dynamo), one graph for every length
    from torch.fx.experimental.proxy_tensor import make_fx

    spec = documents_spec("sdpa")

    def summary(*tensors):
        M, N = tensors[1].shape[2], tensors[0].shape[3]
        args = launch.mask_block_args(launch.mask_granules(spec, tensors, M, N, 8), M, N, 32, 16, False, tensors[0])
        return args["BlockList"], args["BlockCounts"]

    traced = make_fx(summary, tracing_mode="symbolic")(*documents_tensors(ALIGNED))
    for ids in (ALIGNED, ANY[:, :77]):
        tensors = documents_tensors(ids)
        for a, b in zip(traced(*tensors), summary(*tensors)):
            assert torch.equal(a, b)


def assert_same_lists(ours: dict, ref: dict, what=None) -> None:
    """The same counts and the same listed blocks (the entries the kernels read: past them, the order is free)."""
    assert torch.equal(ours["BlockCounts"], ref["BlockCounts"]), what
    listed = ours["BlockCounts"].sum(-1)
    for z, outer in zip(*torch.nonzero(listed >= 0, as_tuple=True)):
        n = listed[z, outer]
        assert torch.equal(ours["BlockList"][z, outer, :n], ref["BlockList"][z, outer, :n]), what


@pytest.mark.parametrize("key_major", [False, True])
@pytest.mark.parametrize("rows, cols", [(16, 16), (32, 16), (16, 64)])
@pytest.mark.parametrize("chunk, steps", [(None, None), (2, 1), (2, 2)])
def test_the_tile_classes_kernel_lists_what_its_reference_does(key_major, rows, cols, chunk, steps, monkeypatch):
    """The generated tile-classes kernels (launch.predicate_block_args) against their plain-PyTorch reference
    (the granules of the vectors' bounds, a granule a tile's keys and a row granule its rows, then mask_block_args):
    the same counts and listed blocks for documents aligned to the tiles or not, unsorted, an id coming back, lengths
    no tile divides. Besides the launcher's step of tiles and steps a program (a block's tiles all in one program at
    these lengths), steps of 2 tiles, one or two a program: several programs a block where it has 3 tiles or more
    (16 x 16 tiles: 5), the last to arrive listing it, a last step part past the tiles."""
    if chunk is not None:
        monkeypatch.setattr(launch, "_CLASS_CHUNK", chunk)
        monkeypatch.setattr(launch, "_CLASS_STEPS", steps)
    for form in ("eager", "sdpa"):
        spec = documents_spec(form)
        for ids in (ALIGNED, ANY, ANY[:, :77]):
            tensors = documents_tensors(ids)
            M = N = ids.shape[1]
            ours = launch.predicate_block_args(spec, tensors, M, N, rows, cols, key_major)
            ref = launch.mask_block_args(launch.mask_granules(spec, tensors, M, N, cols, rows), M, N, rows, cols,
                                         key_major, tensors[0])
            assert_same_lists(ours, ref, (form, ids.shape))
            assert (ours["stride_blist_z"], ours["stride_bcount_z"]) == (ref["stride_blist_z"], ref["stride_bcount_z"])
            assert ours["BlockList"].dtype == ours["BlockCounts"].dtype == torch.int32


@pytest.mark.parametrize("key_major", [False, True])
@pytest.mark.parametrize("M, N", [(77, 40), (40, 77)])
def test_the_tile_classes_kernels_list_what_the_reference_does_for_query_and_key_lengths_apart(key_major, M, N):
    """More query blocks than key blocks and fewer (the summaries' launch covers the larger count, its SeesKey the
    query blocks): the same lists as the reference, 16 x 16 tiles (5 and 3 blocks), documents of any length."""
    spec = documents_spec("eager")
    pos_k, pos_q, ids_q, ids_k = documents_tensors(ANY)
    tensors = [pos_k[..., :N], pos_q[..., :M, :], ids_q[..., :M, :], ids_k[..., :N]]
    ours = launch.predicate_block_args(spec, tensors, M, N, 16, 16, key_major)
    ref = launch.mask_block_args(launch.mask_granules(spec, tensors, M, N, 16, 16), M, N, 16, 16, key_major,
                                 tensors[0])
    assert_same_lists(ours, ref, (M, N, key_major))


@pytest.mark.parametrize("key_major", [False, True])
def test_a_prepared_tile_classification_lists_each_calls_own_documents(key_major):
    """launch.TileClasses, prepared once for a signature as the Gluon ops keep it: each call classifies the vectors it
    is given, into lists of its own (a call's lists stay as they were after the next call)."""
    spec = documents_spec("eager")
    prepared = launch.TileClasses(spec, documents_tensors(ALIGNED), 80, 80, 16, 32, key_major)
    calls = [(ids, prepared(documents_tensors(ids))) for ids in (ALIGNED, ANY, ALIGNED)]
    for ids, ours in calls:
        tensors = documents_tensors(ids)
        ref = launch.mask_block_args(launch.mask_granules(spec, tensors, 80, 80, 32, 16), 80, 80, 16, 32, key_major,
                                     tensors[0])
        assert_same_lists(ours, ref, (ids[0, :8].tolist(), key_major))
    assert calls[0][1]["BlockList"] is not calls[2][1]["BlockList"]


def proven_skips(args: dict, keeps: torch.Tensor, rows: int, cols: int, key_major: bool) -> int:
    """Hold block lists to the mask written out (``keeps``, [Z, M, N]): each unlisted tile hides every entry and each
    row of its query block sees a key; each tile of the first run keeps every entry and the run is consecutive.
    Returns how many tiles they skip."""
    skipped = 0
    for z in range(keeps.shape[0]):
        for outer in range(args["BlockList"].shape[1]):
            run, rest = args["BlockCounts"][z, outer].tolist()
            entries = args["BlockList"][z, outer].tolist()
            for position, inner in enumerate(entries):
                r, c = (inner, outer) if key_major else (outer, inner)
                tile = keeps[z, r * rows:(r + 1) * rows, c * cols:(c + 1) * cols]
                if position < run:
                    assert tile.all() and entries[position] == entries[0] + position
                elif position >= run + rest:
                    assert not tile.any() and keeps[z, r * rows:(r + 1) * rows].any(-1).all()
                    skipped += 1
    return skipped


@pytest.mark.parametrize("key_major", [False, True])
def test_the_tile_classes_kernels_skips_and_runs_are_proofs(key_major):
    """Against the mask written out (not the reference): the kernel's unlisted tiles hide every entry and each row of
    their query block sees a key; its first run of full tiles keeps every entry. A strictly causal mask hides each
    row's own key: there a query block's hidden tiles are skipped only in the query-major lists, where the block has a
    full tile (each of its rows keeps that tile's keys), and not in a block holding a document's first token (which
    sees no key). test_a_predicates_tiles_give_the_whole_computation runs such masks."""
    rows, cols = 16, 16
    skips = {}
    for ids in (ALIGNED, ANY):
        for strict in (False, True):
            spec = documents_spec("eager", strict=strict)
            tensors = documents_tensors(ids)
            keeps = written_out(spec, tensors)[0][:, 0] == 0  # [Z, M, N]
            M = N = ids.shape[1]
            args = launch.predicate_block_args(spec, tensors, M, N, rows, cols, key_major)
            skips[ids is ALIGNED, strict] = proven_skips(args, keeps, rows, cols, key_major)
    assert skips[True, False] > 0 and skips[False, False] > 0, skips
    # strict: the blocks of a document's start skip nothing, the others what they hide
    assert skips[True, True] == 0 if key_major else 0 < skips[True, True] < skips[True, False], skips


def every_op_spec():
    """A predicate that keeps each row's own key (``kv_idx == q_idx or ...``) and reaches every op of
    ``plan.PREDICATE_OPS`` over the vectors of :func:`documents_tensors`, bools read as integers too."""
    b = ScoreProgramBuilder()
    s = b.add("score")
    pos_k, pos_q, ids_q, ids_k = (b.load(i, "int") for i in range(4))
    q_idx, kv_idx = b.add("q_idx"), b.add("kv_idx")
    near = b.add("le", b.add("sub", pos_k, b.const(100)), b.add("maximum", pos_q, b.add("neg", ids_k)))
    other = b.add("ne", b.add("minimum", ids_q, b.add("add", ids_k, b.const(1))), ids_k)
    picked = b.add("where", b.add("lt", ids_q, b.const(2)), ids_q, ids_k)  # an integer where
    either = b.add("where", b.add("gt", ids_q, ids_k), b.add("eq", pos_q, pos_k), b.add("ge", ids_k, ids_q))  # a bool one
    flag = b.add("logical_not", b.add("gt", picked, either))  # an integer compared with a bool
    keep = b.add("logical_or", b.add("eq", kv_idx, q_idx), b.add("logical_and", near, b.add("logical_or", other, flag)))
    root = b.add("where", keep, s, b.const(float("-inf")))
    rows, cols = (False, True, False, True), (False, True, True, False)
    tensors = tuple(ScoreTensor("int", "int64", broadcast) for broadcast in (cols, rows, rows, cols))
    spec = AttentionSpec(dtype="float32", head_dim=16, head_dim_v=16, scale=0.25, score_program=b.program(root),
                         score_tensors=tensors)
    used = {node.op for node in spec.score_program}
    assert set(plan.PREDICATE_OPS) <= used, set(plan.PREDICATE_OPS) - used
    return spec


@pytest.mark.parametrize("key_major", [False, True])
def test_the_tile_classes_kernel_bounds_every_predicate_op_as_its_reference(key_major):
    """Each op's bounds as the generated kernel writes them (codegen.TritonIntervalOps) against IntervalOps: the same
    lists and counts, and their skips and runs true of the mask written out."""
    spec = every_op_spec()
    summarized = plan.mask_blocks(spec)
    assert summarized is not None and summarized.predicate is not None
    tensors = documents_tensors(ANY)
    keeps = written_out(spec, tensors)[0][:, 0] == 0
    M = N = ANY.shape[1]
    rows, cols = 16, 16
    ours = launch.predicate_block_args(spec, tensors, M, N, rows, cols, key_major)
    ref = launch.mask_block_args(launch.mask_granules(spec, tensors, M, N, cols, rows), M, N, rows, cols, key_major,
                                 tensors[0])
    assert_same_lists(ours, ref)
    assert ours["BlockCounts"][..., 0].any()  # (runs too)
    assert proven_skips(ours, keeps, rows, cols, key_major) > 0
