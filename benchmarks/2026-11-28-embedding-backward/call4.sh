# Fourth device call: BERT-base with padding, training at N1024, fuse_attn with and without the few-row table
# gradient (MAX_ROWS set to 0 turns the rewrite off), in one process each, on one machine.
set -x
source .gpu/setup.sh
export PYTHONPATH=$PWD/tests:$PWD:$PYTHONPATH
for rows in 64 0; do
  timeout 120 python3 -c "
import runpy, sys
import fuse_attn.kernels.embedding_backward as eb
eb.MAX_ROWS = $rows
print('MAX_ROWS', eb.MAX_ROWS)
sys.argv = ['bench_models.py', '--models', 'bert-padded', '--modes', 'train', '--lengths', '1024', '--variants', 'fuse_attn', '--out', '$OUT/rows$rows']
runpy.run_path('tools/bench_models.py', run_name='__main__')
" 2>&1 | grep -E "MAX_ROWS|tokens/s|device"
done
