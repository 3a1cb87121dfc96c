"""compile_probe.py on a variant of the template: argv[1] is a Python file defining edit(template text) -> text
(edits/), the rest compile_probe.py's arguments."""
import os, sys, tempfile, importlib.util, pathlib
os.environ["FUSE_ATTN_CACHE_DIR"] = tempfile.mkdtemp()
from fuse_attn.kernels import codegen
spec_file, which, kernels, cfgs = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]
mod = importlib.util.spec_from_file_location("edit", spec_file); edit = importlib.util.module_from_spec(mod); mod.loader.exec_module(edit)
d = pathlib.Path(tempfile.mkdtemp())
(d / codegen.TEMPLATE_NAME).write_text(edit.edit((codegen.TEMPLATE_DIR / codegen.TEMPLATE_NAME).read_text()))
(d / codegen.DECODING_TEMPLATE_NAME).write_text((codegen.TEMPLATE_DIR / codegen.DECODING_TEMPLATE_NAME).read_text())
codegen.TEMPLATE_DIR = d
sys.argv = ["compile_probe", which, kernels, cfgs]
import runpy
runpy.run_path(os.path.join(os.path.dirname(os.path.abspath(__file__)), "compile_probe.py"), run_name="__main__")
