# Where the device's AOTInductor loader crashes: native backtrace of the segfault, toolchain versions.
g++ --version | head -1; which clang++ g++-12 g++-13 g++-14 2>/dev/null
python3 -c "import torch; print('cxx11 abi', torch._C._GLIBCXX_USE_CXX11_ABI, torch.__config__.show().splitlines()[1:4])"
strings -a $(python3 -c "import torch,os;print(os.path.dirname(torch.__file__))")/lib/libtorch_cpu.so | grep -m2 "GCC: ("
ldd --version | head -1
gcc -shared -fPIC -O1 -o /tmp/segv.so benchmarks/2026-11-26-aoti-loader/segv.c && echo built segv.so
python3 - <<'PY'
import torch
from torch._inductor import aoti_compile_and_package
m = torch.nn.Linear(16, 16).cuda(); x = torch.randn(4, 16, device="cuda")
print(aoti_compile_and_package(torch.export.export(m, (x,)), package_path="/tmp/lin.pt2"))
PY
LD_PRELOAD=/tmp/segv.so python3 -c "
import torch
from torch._inductor import aoti_load_package
print('loaded output', aoti_load_package('/tmp/lin.pt2')(torch.randn(4, 16, device='cuda')).shape)
" 2>&1 | grep -v -i warn | c++filt | cut -c1-300 | tail -30
