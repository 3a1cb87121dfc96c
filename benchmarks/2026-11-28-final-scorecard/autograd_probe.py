"""What torch.library.register_autograd's wrapper costs a step on its own: two trivial CPU ops shaped as the Gluon
forward and backward ops (a clone each), an eager torch.autograd.grad step through register_autograd, the same
through a plain torch.autograd.Function, and the two ops called alone; 3000 steps each. Run on any machine:
python autograd_probe.py"""
import time, torch
lib = torch.library.Library("probe", "FRAGMENT")
lib.define("f(Tensor q, Tensor k, Tensor v, str spec) -> (Tensor, Tensor)")
lib.define("fb(Tensor d, Tensor q, Tensor k, Tensor v, Tensor o, Tensor l, str spec, Tensor? dl=None) -> (Tensor, Tensor, Tensor)")
def f(q, k, v, spec): return q.clone(), q.new_empty(q.shape[:3])
def fb(d, q, k, v, o, l, spec, dl=None): return d.clone(), k.clone(), v.clone()
lib.impl("f", f, "CPU"); lib.impl("fb", fb, "CPU")
@torch.library.register_fake("probe::f")
def _(q, k, v, spec): return q.new_empty(q.shape), q.new_empty(q.shape[:3])
def setup(ctx, inputs, output):
    q, k, v, spec = inputs; ctx.save_for_backward(q, k, v, *output); ctx.spec = spec
def bwd(ctx, do, dl):
    q, k, v, o, l = ctx.saved_tensors
    dq, dk, dv = torch.ops.probe.fb(do, q, k, v, o, l, ctx.spec, dl)
    return dq, dk, dv, None
torch.library.register_autograd("probe::f", bwd, setup_context=setup)
class F(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v):
        o, l = torch.ops.probe.f(q, k, v, "s"); ctx.save_for_backward(q, k, v, o, l); return o
    @staticmethod
    def backward(ctx, do):
        q, k, v, o, l = ctx.saved_tensors
        return torch.ops.probe.fb(do, q, k, v, o, l, "s", None)
q, k, v, do = (torch.randn(1, 2, 8, 8) for _ in range(4))
leaves = [t.requires_grad_() for t in (q.clone(), k.clone(), v.clone())]
def t(fn, n=3000):
    fn(); s = time.perf_counter()
    for _ in range(n): fn()
    return (time.perf_counter() - s) / n * 1e6
print("register_autograd step us", t(lambda: torch.autograd.grad(torch.ops.probe.f(*leaves, "s")[0], leaves, do)))
print("autograd.Function step us", t(lambda: torch.autograd.grad(F.apply(*leaves), leaves, do)))
with torch.no_grad():
    print("ops alone us", t(lambda: (torch.ops.probe.f(*leaves, "s"), torch.ops.probe.fb(do, *leaves, q, q[..., 0], "s"))))
