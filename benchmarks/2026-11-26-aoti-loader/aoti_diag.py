"""Where does the device's AOTInductor loader crash? Each step in its own process (a segfault ends only that step)."""
import subprocess, sys, textwrap
steps = {
 "compile cuda Linear": """
    import torch
    from torch._inductor import aoti_compile_and_package
    m = torch.nn.Linear(16, 16).cuda(); x = torch.randn(4, 16, device="cuda")
    print(aoti_compile_and_package(torch.export.export(m, (x,)), package_path="/tmp/lin.pt2"))
 """,
 "list package": """
    import zipfile; z = zipfile.ZipFile("/tmp/lin.pt2"); [print(n) for n in z.namelist()]; z.extractall("/tmp/lin_x")
 """,
 "ldd of the .so": """
    import glob, subprocess; so = glob.glob("/tmp/lin_x/**/*.so", recursive=True); print(so)
    print(subprocess.run(["ldd", so[0]], capture_output=True, text=True).stdout)
 """,
 "dlopen the .so (ctypes), no torch": """
    import glob, ctypes; so = glob.glob("/tmp/lin_x/**/*.so", recursive=True)[0]
    lib = ctypes.CDLL(so); print("dlopen ok", lib)
 """,
 "dlopen the .so after import torch": """
    import torch, glob, ctypes; so = glob.glob("/tmp/lin_x/**/*.so", recursive=True)[0]
    lib = ctypes.CDLL(so); print("dlopen ok")
    h = ctypes.c_void_p()
    rc = lib.AOTInductorModelContainerCreateWithDevice(ctypes.byref(h), ctypes.c_size_t(1), b"cuda", None)
    print("container create rc", rc, h)
 """,
 "AOTIModelPackageLoader directly": """
    import torch
    loader = torch._C._aoti.AOTIModelPackageLoader("/tmp/lin.pt2", "model", False, 1, -1)
    print("loader ok", loader.get_call_spec())
 """,
 "load with aoti_load_package": """
    import torch
    from torch._inductor import aoti_load_package
    print(aoti_load_package("/tmp/lin.pt2")(torch.randn(4, 16, device="cuda")).shape)
 """,
 "cpu Linear compile + load": """
    import torch
    from torch._inductor import aoti_compile_and_package, aoti_load_package
    m = torch.nn.Linear(16, 16); x = torch.randn(4, 16)
    p = aoti_compile_and_package(torch.export.export(m, (x,)), package_path="/tmp/lin_cpu.pt2")
    print(aoti_load_package(p)(x).shape)
 """,
}
for name, body in steps.items():
    code = "import faulthandler; faulthandler.enable()\n" + textwrap.dedent(body)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=200)
    out = (r.stdout + r.stderr).strip().splitlines()
    print(f"== {name}: rc {r.returncode}")
    for line in [l for l in out if "Warning" not in l][-14:]:
        print("   ", line[:220])
