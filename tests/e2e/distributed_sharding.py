"""(Run by tests/e2e/test_distributed.py under torchrun, 2 CPU processes, gloo, through distributed_examples.py.) The
fused op on DTensors: q, k, v sharded on heads (GQA 4 query heads over 2 kv heads, so each rank keeps one whole group)
or on the batch, a learned [1, H, M, N] bias, causal; output and the gradients of q, k, v and the bias equal to the
unsharded op's, eagerly and compiled; heads that do not divide over the ranks run replicated. Then tensor parallelism of an unmodified
Hugging Face LLaMA (eager attention, GQA 4/2) compiled with backend="fuse_attn": ``parallelize_module`` shards the
q/k/v projections column-wise (each rank its heads) and the output projection row-wise; every attention fused, the
loss and every parameter gradient equal to the unsharded model's; and an attention written on DTensors, which is
left unfused with its reason. Prints one line per case; exits 1 on a mismatch."""

import sys

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Partial, Replicate, Shard, distribute_tensor

from fuse_attn.kernels import flash_attention
from fuse_attn.spec import AttentionSpec, CausalMask
from fuse_attn.score_program import ScoreProgramBuilder, ScoreTensor
from tests.support.interpreter_patching import skip_repatching_inside_a_launch

# (query heads, kv heads, placement of q/k/v, dropout) -> placements expected of the output and of the bias gradient
CASES = [
    (4, 2, Shard(1), 0.0, Shard(1), Shard(1)),
    (4, 2, Shard(0), 0.0, Shard(0), Partial()),  # the bias is shared by the batch rows: each rank holds its share
    (3, 3, Shard(1), 0.0, Replicate(), Replicate()),  # 3 heads over 2 ranks: gathered, run replicated
    (4, 2, Shard(1), 0.25, Replicate(), Replicate()),  # dropout: replicated, the unsharded op's keep-mask
]


def main(argv=None) -> int:
    skip_repatching_inside_a_launch()  # as in the test session: the same bits, a third less interpreter time
    owns_group = not dist.is_initialized()  # (tests/e2e/distributed_examples.py makes it for several runs)
    if owns_group:
        dist.init_process_group("gloo")
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    b = ScoreProgramBuilder()
    program = b.program(b.add("add", b.add("score"), b.add("load", value=0)))
    failures = 0
    for compiled in (False, True):
        for heads, kv_heads, placement, dropout_p, out_placement, bias_grad_placement in CASES:
            spec = AttentionSpec(dtype="float32", head_dim=8, head_dim_v=8, scale=0.3, causal=CausalMask(),
                                 gqa_group=heads // kv_heads, score_program=program, dropout_p=dropout_p,
                                 score_tensors=(ScoreTensor("bias", "float32", (True, False, False, False)),))
            g = torch.Generator().manual_seed(0)
            q = torch.randn(2, heads, 6, 8, generator=g)
            k, v = (torch.randn(2, kv_heads, 6, 8, generator=g) for _ in range(2))
            bias, dout = torch.randn(1, heads, 6, 6, generator=g), torch.randn(2, heads, 6, 8, generator=g)
            plain = [t.clone().requires_grad_() for t in (q, k, v, bias)]
            seed = torch.tensor(12345) if dropout_p else None
            expected = flash_attention(*plain[:3], spec, [plain[3]], dropout_seed=seed)
            expected_grads = torch.autograd.grad(expected, plain, dout)

            bias_placement = placement if placement == Shard(1) else Replicate()
            sharded = [distribute_tensor(t, mesh, [placement]).requires_grad_() for t in (q, k, v)]
            sharded.append(distribute_tensor(bias, mesh, [bias_placement]).requires_grad_())
            dseed = None if seed is None else distribute_tensor(seed, mesh, [Replicate()])
            fn = lambda q, k, v, bias: flash_attention(q, k, v, spec, [bias], dropout_seed=dseed)  # noqa: E731
            out = (torch.compile(fn, backend="fuse_attn") if compiled else fn)(*sharded)
            grads = torch.autograd.grad(out, sharded, distribute_tensor(dout, mesh, [placement]))
            errors = [float((a.full_tensor() - e).abs().max()) for a, e in zip((out, *grads), (expected, *expected_grads))]
            placements = (out.placements[0], grads[3].placements[0])
            ok = max(errors) < 1e-5 and placements == (out_placement, bias_grad_placement)
            failures += not ok
            if dist.get_rank() == 0:
                print(f"{'compiled' if compiled else 'eager'} heads {heads}/{kv_heads} {placement} dropout {dropout_p}: "
                      f"out {placements[0]}, "
                      f"bias grad {placements[1]}, max error {max(errors):.2g}{'' if ok else ' FAILED'}")
    failures += tensor_parallel_llama(mesh)
    failures += softmax_on_dtensors(mesh)
    if owns_group:
        dist.destroy_process_group()
    return 1 if failures else 0


def tensor_parallel_llama(mesh) -> int:
    """The tensor-parallel case of the module docstring; 1 on a mismatch."""
    import transformers
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    from fuse_attn.report import collect_reports

    config = transformers.LlamaConfig(hidden_size=32, intermediate_size=64, num_attention_heads=4, num_key_value_heads=2,
                                      num_hidden_layers=2, vocab_size=64, use_cache=False)
    config._attn_implementation = "eager"
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config)
    sharded = transformers.LlamaForCausalLM(config)
    sharded.load_state_dict(model.state_dict())
    ids = torch.randint(0, 64, (2, 16), generator=torch.Generator().manual_seed(0))
    expected_loss = model(input_ids=ids, labels=ids).loss
    expected_loss.backward()
    plan = {"q_proj": ColwiseParallel(), "k_proj": ColwiseParallel(), "v_proj": ColwiseParallel(),
            "o_proj": RowwiseParallel()}
    for layer in sharded.model.layers:
        parallelize_module(layer.self_attn, mesh, plan)
    torch._dynamo.reset()
    with collect_reports() as reports:
        loss = torch.compile(sharded, backend="fuse_attn")(input_ids=ids, labels=ids).loss
    loss.backward()
    fused = sum(v.fused for r in reports for v in r.verdicts)
    errors = [float((loss - expected_loss).abs())]
    for (name, p), (_, e) in zip(sharded.named_parameters(), model.named_parameters()):
        grad = p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad
        errors.append(float((grad - e.grad).abs().max()))
    ok = max(errors) < 1e-5 and fused == config.num_hidden_layers
    if dist.get_rank() == 0:
        print(f"tensor parallel llama (heads over {mesh.size()} ranks), compiled: fused {fused} of "
              f"{config.num_hidden_layers} attentions, loss and gradients max error {max(errors):.2g}"
              f"{'' if ok else ' FAILED'}")
    return 0 if ok else 1


def softmax_on_dtensors(mesh) -> int:
    """An attention written out on DTensors (heads sharded) compiled with the backend: not fused -- only attentions
    on local tensors are -- with that reason in the report, and the result still the unsharded one. 1 on a mismatch."""
    from fuse_attn.report import collect_reports

    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(2, 4, 6, 8, generator=g) for _ in range(3))
    expected = torch.softmax(q @ k.transpose(-1, -2) * 0.3, -1) @ v
    sharded = [distribute_tensor(t, mesh, [Shard(1)]) for t in (q, k, v)]
    torch._dynamo.reset()
    with collect_reports() as reports:
        out = torch.compile(lambda q, k, v: torch.softmax(q @ k.transpose(-1, -2) * 0.3, -1) @ v,
                            backend="fuse_attn")(*sharded)
    verdicts = [v for r in reports for v in r.verdicts]
    error = float((out.full_tensor() - expected).abs().max())
    ok = (len(verdicts) == 1 and not verdicts[0].fused and "on DTensors" in verdicts[0].reason and error < 1e-5)
    if dist.get_rank() == 0:
        print(f"softmax on DTensors, compiled: {'; '.join(v.line() for v in verdicts)}; max error {error:.2g}"
              f"{'' if ok else ' FAILED'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
