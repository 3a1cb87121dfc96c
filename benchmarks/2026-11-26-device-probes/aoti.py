import faulthandler, sys
faulthandler.enable()
import torch
from torch._inductor import aoti_compile_and_package, aoti_load_package
x = torch.randn(4, 16, device="cuda")
if sys.argv[1] == "compile":
    m = torch.nn.Linear(16, 16).cuda()
    ep = torch.export.export(m, (x,))
    path = aoti_compile_and_package(ep, package_path="/tmp/lin.pt2")
    print("compiled", path, flush=True)
    if len(sys.argv) > 2:
        print("same-process load:", aoti_load_package(path)(x).shape, flush=True)
else:
    print("fresh-process load:", aoti_load_package("/tmp/lin.pt2")(x).shape, flush=True)
