"""ViT (or any zoo model) in fp32 on the CPU, per weight draw: the worst gradient error of ours (backend fuse_attn) over
the zoo test's eager bound (2x eager + 1e-05), over the bound of the worse of eager and torch.compile default, and
torch.compile default's own over the eager bound. NT: torch threads.
    cd /work/main && NT=2 python benchmarks/2026-11-27-zoo-fp32/zoo_fp32.py vit sdpa 6"""
import copy, sys, os
os.environ["TRITON_INTERPRET"]="1"
sys.path[:0]=["tests","."]
import conftest  # noqa
os.environ["TRITON_INTERPRET"]="0"
import torch, test_model_zoo as z
torch.set_num_threads(int(os.environ.get("NT","2")))
name, attention = sys.argv[1], sys.argv[2]
seeds = range(int(sys.argv[3]))
model_cls, config, inputs, _ = z.MODELS[name]()
config._attn_implementation = attention
def run(module, call, cast, state, seed):
    module.load_state_dict(state); module.zero_grad(set_to_none=True)
    out = z.first_tensor(call(**{k: cast(v) for k, v in inputs.items()}))
    grad = torch.randn(out.shape, generator=torch.Generator().manual_seed(1 + seed), dtype=torch.float64)
    (out * grad.to(out.dtype)).sum().backward()
    return {n: p.grad.clone() for n, p in module.named_parameters() if p.grad is not None}
torch.manual_seed(0)
model = model_cls(config).train()
ref = copy.deepcopy(model).double()
eager = copy.deepcopy(model); ind = copy.deepcopy(model)
ours_c = torch.compile(model, backend="fuse_attn"); ind_c = torch.compile(ind)
worst = {}
for seed in seeds:
    torch.manual_seed(seed); state = model_cls(config).state_dict()
    r = run(ref, ref, lambda v: v.double() if v.is_floating_point() else v, state, seed)
    e = run(eager, eager, lambda v: v, state, seed)
    i = run(ind, ind_c, lambda v: v, state, seed)
    o = run(model, ours_c, lambda v: v, state, seed)
    err = lambda a, n: (a[n].double() - r[n]).abs().max().item()
    ratios = []
    for n in r:
        ratios.append((err(o, n) / (2 * err(e, n) + 1e-5), err(o, n) / (2 * max(err(e, n), err(i, n)) + 1e-5), err(i,n)/(2*err(e,n)+1e-5), n))
    ratios.sort(reverse=True)
    print(seed, "worst ours/eager-bound %.2f  ours/max(eager,inductor)-bound %.2f  inductor/eager-bound %.2f  %s" % ratios[0], "| max over params of 2nd: %.2f" % max(x[1] for x in ratios), "3rd: %.2f" % max(x[2] for x in ratios))
