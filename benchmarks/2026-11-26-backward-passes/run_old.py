# Run a tool against the committed package copied to .gpu/old_pkg (git archive HEAD fuse_attn): the editable
# install's import hook is removed first, so `import fuse_attn` finds the old copy.
import runpy, sys
sys.meta_path = [f for f in sys.meta_path if "editable" not in repr(f).lower() and "editable" not in type(f).__name__.lower()]
import os
sys.path.insert(0, os.environ.get("OLD_PKG", ".gpu/old_pkg"))
import fuse_attn  # noqa
print("package:", fuse_attn.__file__, flush=True)
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
