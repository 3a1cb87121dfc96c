"""(Run by tests/e2e/test_distributed.py under torchrun, 2 CPU processes, gloo, through distributed_examples.py.)
Context parallelism (fuse_attn/context_parallel.py): the sequence sharded over the ranks, each rank's output rows and
the gradients (summed over the ranks) equal to the unsharded attention's.

* The op: ring_attention against flash_attention on the whole sequence -- plain, causal (load-balanced and
  contiguous shards), a sliding window across the shards' boundaries, ALiBi written with q_idx / kv_idx and learned
  per-head slopes, GQA, a finfo.min key padding vector (travelling with K/V; a batch row with every key padded),
  SDPA's bool padding + causal mask (the band in the score program: the pairs past it skipped), and dropout (run on the gathered sequence: the unsharded keep-mask).
* A causal attention compiled with dynamic=True (a symbolic length: run on the gathered sequence).
* An uneven sequence (23 positions over 2 ranks, ContextParallel(sequence_length=23)): shard_sequence cuts it as
  tensor_split does, the op and a compiled attention run on the gathered sequence; without sequence_length,
  shard_sequence refuses it.
* Shards of different lengths on the ranks (cut by hand): refused by the ring's guard, not computed.
* An unmodified Hugging Face LLaMA (eager attention, and its default SDPA calls; GQA), compiled with backend="fuse_attn" and the context_parallel
  option, on its sequence sharded: every attention fused as a ring; its loss and parameter gradients equal to the
  unsharded model's.

Prints one line per case; exits 1 on a mismatch."""

import sys

import torch
import torch.distributed as dist

from fuse_attn.graph.context_parallel import ContextParallel, gather_sequence, ring_attention, shard_sequence
from fuse_attn.kernels import flash_attention
from fuse_attn.report import collect_reports
from fuse_attn.spec import AttentionSpec, CausalMask
from fuse_attn.score_program import ScoreProgramBuilder, ScoreTensor

TOLERANCE = 2e-5  # fp32: the ring merges partial outputs in fp32; the unsharded op's rounding differs by a few ulps


def spec_and_tensors(case: str, heads: int, n: int, g: torch.Generator):
    """The spec of a case and its score tensors (whole sequence), with whether each needs a gradient."""
    b = ScoreProgramBuilder()
    s = b.add("score")
    causal, tensors, program, infos, dropout = CausalMask(), [], (), (), 0.0
    if case == "plain":
        causal = None
    elif case == "window":
        causal = CausalMask(window=5)
    elif case == "alibi":  # s + slope_h * (kv_idx - q_idx), learned slopes
        slope = b.add("load", value=0)
        program = b.program(b.add("add", s, b.add("mul", slope, b.add("to_float", b.add("sub", b.add("kv_idx"),
                                                                                          b.add("q_idx"))))))
        infos = (ScoreTensor("bias", "float32", (True, False, True, True)),)
        tensors = [(torch.rand(1, heads, 1, 1, generator=g), True)]
    elif case == "padding":  # Hugging Face's eager form: finfo.min where the key is padding, batch row 1 all padding
        keep = torch.ones(2, 1, 1, n, dtype=torch.bool)
        keep[0, ..., 3:9] = False
        keep[1] = False
        program = b.program(b.add("add", s, b.add("where", b.add("load", value=0), b.const(0.0),
                                                  b.const(torch.finfo(torch.float32).min))))
        infos = (ScoreTensor("mask", "bool", (False, True, True, False)),)
        tensors = [(keep, False)]
    elif case == "sdpa padding":  # SDPA's bool form: the band in the program, -inf, rows of no key 0
        keep = torch.ones(2, 1, 1, n, dtype=torch.bool)
        keep[0, ..., :5] = False
        keep[1, ..., 20:] = False
        visible = b.add("logical_and", b.add("le", b.add("kv_idx"), b.add("q_idx")), b.add("load", value=0))
        program = b.program(b.add("where", b.add("logical_not", visible), b.const(float("-inf")), s))
        infos = (ScoreTensor("mask", "bool", (False, True, True, False)),)
        tensors, causal = [(keep, False)], None
    elif case == "dropout":
        dropout = 0.3
    spec = AttentionSpec(dtype="float32", head_dim=8, head_dim_v=8, scale=0.35, causal=causal, score_program=program,
                         score_tensors=infos, gqa_group=2 if case == "gqa" else 1, dropout_p=dropout,
                         empty_rows="zero" if case == "sdpa padding" else "nan")
    return spec, tensors


def check_op(case: str, load_balance: bool, cp_group) -> bool:
    cp = ContextParallel(group=cp_group, load_balance=load_balance)
    g = torch.Generator().manual_seed(0)
    heads, n = 4, 24
    spec, tensors = spec_and_tensors(case, heads, n, g)
    kv_heads = heads // spec.gqa_group
    q = torch.randn(2, heads, n, 8, generator=g)
    k, v = (torch.randn(2, kv_heads, n, 8, generator=g) for _ in range(2))
    dout = torch.randn(2, heads, n, 8, generator=g)
    seed = torch.tensor(777) if spec.dropout_p else None
    whole = [t.clone().requires_grad_() for t in (q, k, v)] + [t.clone().requires_grad_(grad) for t, grad in tensors]
    expected = flash_attention(*whole[:3], spec, whole[3:], dropout_seed=seed)
    wanted = [t for t in whole if t.requires_grad]
    expected_grads = torch.autograd.grad(expected, wanted, dout)

    local = [shard_sequence(t, 2, cp).detach().requires_grad_() for t in (q, k, v)]
    local_tensors = [(shard_sequence(t, 3, cp) if t.shape[3] != 1 else t).detach().requires_grad_(grad)
                     for t, grad in tensors]
    out = ring_attention(*local, spec, local_tensors, dropout_seed=seed, cp=cp)
    mine = [t for t in local + local_tensors if t.requires_grad]
    grads = torch.autograd.grad(out, mine, shard_sequence(dout, 2, cp))
    errors = [float((gather_sequence(out.detach(), 2, cp) - expected.detach()).abs().max())]
    for grad, t, e in zip(grads, mine, expected_grads):
        if t.shape[2] == 1 and (t.dim() < 4 or t.shape[3] == 1):  # not sharded (per-head slopes): summed over ranks
            dist.all_reduce(grad)
            errors.append(float((grad - e).abs().max()))
        else:
            errors.append(float((gather_sequence(grad, 2 if t.shape[2] != 1 else 3, cp) - e).abs().max()))
    ok = max(errors) < TOLERANCE and not any(e != e for e in errors)
    if dist.get_rank() == 0:
        layout = "load-balanced" if load_balance else "contiguous"
        print(f"op {case} {layout}: max error {max(errors):.2g}{'' if ok else ' FAILED'}")
    return ok


def check_dynamic(cp: ContextParallel) -> bool:
    """A causal attention written out (the mask from position comparisons: a tril of symbolic size would be a loaded
    [n, n] mask, which cannot be sharded), compiled with dynamic=True under the option: the symbolic length cannot
    make the ring's constant offsets, so it runs on the gathered sequence; two lengths."""
    def attention(q, k, v):
        n = q.shape[-2]
        s = (q @ k.transpose(-2, -1)) * 0.35
        positions = torch.arange(n)
        s = s.masked_fill(positions[None, :] > positions[:, None], float("-inf"))
        return torch.softmax(s, -1) @ v

    compiled = torch.compile(attention, backend="fuse_attn", dynamic=True,
                             options={"fuse_attn.context_parallel": cp})
    errors = []
    with collect_reports() as reports:
        for n in (16, 24):
            q, k, v = (torch.randn(2, 4, n, 8, generator=torch.Generator().manual_seed(n + i)).requires_grad_()
                       for i in range(3))
            expected = attention(q, k, v)
            local = [shard_sequence(t, 2, cp).detach().requires_grad_() for t in (q, k, v)]
            out = compiled(*local)
            errors.append(float((gather_sequence(out.detach(), 2, cp) - expected.detach()).abs().max()))
    fused = sum(len(r.fused) for r in reports)
    ok = max(errors) < TOLERANCE and fused >= 1
    if not ok and dist.get_rank() == 0:
        print("\n".join(v.line() for r in reports for v in r.not_fused))
    if dist.get_rank() == 0:
        print(f"compiled dynamic=True (gathered), lengths 16 and 24: {fused} fused, max error {max(errors):.2g}"
              f"{'' if ok else ' FAILED'}")
    return ok


def check_llama(cp: ContextParallel, attention: str) -> bool:
    import transformers

    rank, world = cp.rank_and_size()
    torch.manual_seed(0)
    config = transformers.LlamaConfig(hidden_size=32, intermediate_size=64, num_attention_heads=4,
                                      num_key_value_heads=2, num_hidden_layers=2, vocab_size=64,
                                      max_position_embeddings=64, use_cache=False, pad_token_id=0)
    config._attn_implementation = attention
    model = transformers.LlamaForCausalLM(config)
    n = 24
    tokens = torch.randint(0, 64, (2, n), generator=torch.Generator().manual_seed(1))
    labels = torch.cat([tokens[:, 1:], torch.full((2, 1), -100)], 1)  # next token, shifted over the whole sequence
    positions = torch.arange(n).expand(2, n)

    def loss_of(logits, labels):
        return torch.nn.functional.cross_entropy(logits.flatten(0, 1), labels.flatten(), reduction="sum")

    expected = loss_of(model(input_ids=tokens, position_ids=positions).logits, labels)
    expected_grads = torch.autograd.grad(expected, list(model.parameters()))

    compiled = torch.compile(model, backend="fuse_attn", options={"fuse_attn.context_parallel": cp})
    # the position ids and an all-ones padding mask, sharded like the tokens: the model's positions (RoPE) are then
    # global, and Hugging Face reads no packed sequences from position ids that jump between the shard's chunks
    with collect_reports() as reports:
        logits = compiled(input_ids=shard_sequence(tokens, 1, cp), position_ids=shard_sequence(positions, 1, cp),
                          attention_mask=torch.ones(2, n // world, dtype=torch.long)).logits
    loss = loss_of(logits, shard_sequence(labels, 1, cp))
    grads = torch.autograd.grad(loss, list(model.parameters()))
    total = loss.detach().clone()
    dist.all_reduce(total)
    errors = [abs(float(total - expected.detach()))]
    for grad, e in zip(grads, expected_grads):
        grad = grad.clone()
        dist.all_reduce(grad)
        errors.append(float((grad - e).abs().max()))
    fused = [v for r in reports for v in r.verdicts if v.fused]
    rings = [v for v in fused if v.runs and "context parallel over 2 ranks" in v.runs]
    ok = max(errors) < 1e-4 and len(rings) == len(fused) == config.num_hidden_layers
    if rank == 0:
        print(f"llama {attention} attention, context parallel ({'load-balanced' if cp.load_balance else 'contiguous'}): "
              f"{len(rings)} of {config.num_hidden_layers} attentions fused as a ring, loss {float(expected.detach()):.4f}, "
              f"max error (loss, gradients) {max(errors):.2g}{'' if ok else ' FAILED'}")
    return ok


def check_uneven_shards(cp: ContextParallel) -> bool:
    """Shards of different lengths on the ranks (cut by hand, not by shard_sequence): refused with the guard's message,
    not computed."""
    rank = dist.get_rank()
    g = torch.Generator().manual_seed(0)
    local = 8 if rank == 0 else 6
    q, k, v = (torch.randn(1, 2, local, 8, generator=g) for _ in range(3))
    spec = AttentionSpec(dtype="float32", head_dim=8, head_dim_v=8, scale=0.3, causal=CausalMask())
    try:
        ring_attention(q, k, v, spec, cp=cp)
    except RuntimeError as e:
        refused = "shards of different lengths" in str(e)
    else:
        refused = False
    if rank == 0:
        print(f"op uneven shards: {'refused' if refused else 'computed FAILED'}")
    return refused


def check_uneven_sequence(load_balance: bool, cp_group) -> bool:
    """A causal attention over 23 positions on 2 ranks (ContextParallel(sequence_length=23)): the op and the same
    attention written out and compiled, each rank's output rows and the gradients equal to the unsharded ones."""
    rank = dist.get_rank()
    n = 23
    cp = ContextParallel(group=cp_group, load_balance=load_balance, sequence_length=n)
    g = torch.Generator().manual_seed(3)
    q, k, v, dout = (torch.randn(2, 4, n, 8, generator=g) for _ in range(4))
    spec = AttentionSpec(dtype="float32", head_dim=8, head_dim_v=8, scale=0.35, causal=CausalMask())
    whole = [t.clone().requires_grad_() for t in (q, k, v)]
    expected = flash_attention(*whole, spec)
    expected_grads = torch.autograd.grad(expected, whole, dout)

    def attention(q, k, v):
        s = (q @ k.transpose(-2, -1)) * 0.35
        positions = torch.arange(q.shape[-2])
        return torch.softmax(s.masked_fill(positions[None, :] > positions[:, None], float("-inf")), -1) @ v

    compiled = torch.compile(attention, backend="fuse_attn", options={"fuse_attn.context_parallel": cp})
    errors, fused = [], 0
    for run in (lambda *t: ring_attention(*t, spec, cp=cp), compiled):
        local = [shard_sequence(t, 2, cp).detach().requires_grad_() for t in (q, k, v)]
        with collect_reports() as reports:
            out = run(*local)
        fused += sum(len(r.fused) for r in reports)
        grads = torch.autograd.grad(out, local, shard_sequence(dout, 2, cp))
        errors.append(float((gather_sequence(out.detach(), 2, cp) - expected.detach()).abs().max()))
        errors += [float((gather_sequence(grad, 2, cp) - e).abs().max()) for grad, e in zip(grads, expected_grads)]
    try:
        shard_sequence(q, 2, ContextParallel(group=cp_group, load_balance=load_balance))
        refused = False
    except ValueError as e:
        refused = "sequence_length=23" in str(e)
    ok = max(errors) < TOLERANCE and fused == 1 and refused
    if rank == 0:
        layout = "load-balanced" if load_balance else "contiguous"
        print(f"uneven sequence of {n}, {layout}: op and compiled ({fused} fused) max error {max(errors):.2g}; "
              f"without sequence_length {'refused' if refused else 'sharded'}{'' if ok else ' FAILED'}")
    return ok


def main(argv=None) -> int:
    owns_group = not dist.is_initialized()  # (tests/e2e/distributed_examples.py makes it for several runs)
    if owns_group:
        dist.init_process_group("gloo")
    cp_group = dist.new_group(list(range(dist.get_world_size())))  # not the default group: the group is carried
    results = [check_op(case, load_balance, cp_group)
               for case, load_balance in [("plain", True), ("causal", True), ("causal", False), ("window", True),
                                          ("alibi", True), ("gqa", True), ("padding", True), ("padding", False),
                                          ("sdpa padding", True),
                                          ("dropout", True)]]
    results.append(check_dynamic(ContextParallel()))
    results += [check_llama(ContextParallel(), attention) for attention in ("eager", "sdpa")]
    results += [check_uneven_sequence(load_balance, cp_group) for load_balance in (True, False)]
    results.append(check_uneven_shards(ContextParallel(load_balance=False)))
    if owns_group:
        dist.destroy_process_group()
    return 0 if all(results) else 1


if __name__ == "__main__":
    sys.exit(main())
