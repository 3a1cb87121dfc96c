# Device-side setup: vendored wheels to /tmp/site, the package in editable mode (its torch_dynamo_backends entry
# point registers backend="fuse_attn"), compiled kernels (not the interpreter).
python3 -m pip install -q --no-deps --target /tmp/site .whl/*.whl 2>&1 | grep -v -i warn
export PYTHONPATH=/tmp/site:${PYTHONPATH:-}
python3 -m pip install -q --no-deps --no-build-isolation -e . 2>&1 | grep -v -i warn | tail -3
export TRITON_INTERPRET=0 FUSE_ATTN_CACHE_DIR=/tmp/fa_cache
python3 -c "import torch, triton, transformers, fuse_attn; print(torch.cuda.get_device_name(), 'torch', torch.__version__, 'triton', triton.__version__, 'transformers', transformers.__version__, fuse_attn.__file__)"
python3 -c "import torch._dynamo as d; assert 'fuse_attn' in d.list_backends(), 'backend not registered'"
