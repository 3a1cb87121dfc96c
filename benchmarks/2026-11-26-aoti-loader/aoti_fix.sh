# Does the AOTInductor loader's std::regex crash go away when the package's .so binds its own template code?
lib=$(python3 -c "import torch,os;print(os.path.dirname(torch.__file__))")/lib
echo "regex _Compiler symbols exported by libtorch_cpu: $(nm -D --defined-only $lib/libtorch_cpu.so | c++filt | grep -c '__detail::_Compiler<')"
nm -D --defined-only $lib/libtorch_cpu.so | c++filt | grep '__detail::_Compiler<' | head -3 | cut -c1-160
mkdir -p /tmp/symb /tmp/inl
printf '#!/bin/sh\nexec /usr/bin/g++ "$@" -Wl,-Bsymbolic\n' > /tmp/symb/g++
printf '#!/bin/sh\nexec /usr/bin/g++ "$@" -fvisibility-inlines-hidden\n' > /tmp/inl/g++
chmod +x /tmp/symb/g++ /tmp/inl/g++
try() {  # $1 CXX, $2 package path
  CXX=$1 timeout 150 python3 -c "
import torch
from torch._inductor import aoti_compile_and_package
m = torch.nn.Linear(16, 16).cuda(); x = torch.randn(4, 16, device='cuda')
print('compiled', aoti_compile_and_package(torch.export.export(m, (x,)), package_path='$2'))" 2>&1 | grep -E "^compiled|Error" | tail -2
  timeout 60 python3 -c "
import torch
from torch._inductor import aoti_load_package
print('LOADED AND RAN', aoti_load_package('$2')(torch.randn(4, 16, device='cuda')).shape)" > /tmp/load.log 2>&1
  rc=$?; grep -E "LOADED|Error|error" /tmp/load.log | tail -2; echo "  CXX=$1: load rc $rc"
  [ $rc = 0 ] && [ ! -f /tmp/aoti_cxx_ok ] && echo $1 > /tmp/aoti_cxx_ok
}
try /tmp/symb/g++ /tmp/symb.pt2
try /tmp/inl/g++ /tmp/inl.pt2
try g++-12 /tmp/gxx12.pt2
