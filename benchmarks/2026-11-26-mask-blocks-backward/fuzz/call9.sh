source .gpu/setup.sh
cp TESTING.md $OUT/TESTING.md
export FUSE_ATTN_FUZZ_PROFILE=long FUSE_ATTN_FUZZ_RECORD=$OUT/TESTING.md TRITON_INTERPRET=0 FUSE_ATTN_AUTOTUNE=0 \
       FUSE_ATTN_SPECIALIZE=0 FUSE_ATTN_FUZZ_ACCUMULATE=1 FUSE_ATTN_FUZZ_CASES=420 FUSE_ATTN_FUZZ_SECONDS=190
for i in $(seq 0 23); do
  FUSE_ATTN_FUZZ_SHARD=$i/24 timeout 260 python3 -m pytest -q -s -p no:cacheprovider tests/test_fuzz.py -k op_cuda > $OUT/shard_$i.log 2>&1 &
done; wait
for i in $(seq 0 23); do tail -2 $OUT/shard_$i.log | tr '\n' ' '; echo; done | cut -c1-200
git diff --no-index TESTING.md $OUT/TESTING.md | head -40
