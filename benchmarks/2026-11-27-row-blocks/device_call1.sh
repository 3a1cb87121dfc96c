source .gpu/setup.sh
export PYTHONPATH=$PWD/tests:$PYTHONPATH
mkdir -p $OUT /tmp/new
cp fuse_attn/kernels/hopper_forward.py tests/test_hopper_forward.py tests/test_hopper_backward.py /tmp/new/
cp .gpu/v16/old_fwd.py fuse_attn/kernels/hopper_forward.py; cp .gpu/v16/head_tests/*.py tests/
timeout 200 python3 -m pytest -x -q -p no:cacheprovider tests/test_hopper_forward.py tests/test_hopper_backward.py 2>&1 | tail -n 3 | tee $OUT/gpu_tests_head.log
cp /tmp/new/hopper_forward.py fuse_attn/kernels/; cp /tmp/new/test_hopper_*.py tests/
timeout 330 python3 .gpu/v16/rb_ab.py 2>&1 | tee $OUT/rb_ab.log
