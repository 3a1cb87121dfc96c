# Call 4: issue 17's variant rows on the H200 with the current kernels (FUSE_ATTN_CANDIDATES=triton,gluon: our
# kernels, the Gluon ones where they apply and time faster), against each row's fastest peer of the earlier runs
# (FlexAttention, cuDNN; torch.compile for head dim 256), the rows most in question first; then the generated
# template alone against cuDNN at N4096 (tools/bench_attention.py's "ours" is the template op).
source .gpu/setup.sh
export PYTHONPATH=$PWD/tests:$PWD:$PYTHONPATH
export FUSE_ATTN_CANDIDATES=triton,gluon TORCH_LOGS=fuse_attn
timeout 380 python3 tools/bench_variants.py --out $OUT --methods fuse_attn flex cudnn --variants padding_causal \
    padding_causal_mask_input alibi_causal_precomputed gqa_causal softcap_causal window_causal alibi_from_slopes \
    dense_bias 2>&1 | grep --line-buffered -E "^\[|^\| |failed|WARNING|tuned impl" | sed -u -E "s/^I1.*autotune.py:[0-9]+\] (\[[^]]*\] )?//" | cut -c1-260
timeout 100 python3 tools/bench_variants.py --out $OUT --methods fuse_attn flex torch_compile \
    --variants softcap_causal_d256 2>&1 | grep --line-buffered -E "^\[|^\| |failed|WARNING|tuned impl" | sed -u -E "s/^I1.*autotune.py:[0-9]+\] (\[[^]]*\] )?//" | cut -c1-260
unset FUSE_ATTN_CANDIDATES TORCH_LOGS
timeout 90 python3 tools/bench_attention.py --out $OUT --skip-check --lengths 4096 --batch-tokens 16384 --heads 16 \
    --head-dims 64 128 --methods ours "SDPA cuDNN" 2>&1 | grep --line-buffered -v -i warn | tail -25
