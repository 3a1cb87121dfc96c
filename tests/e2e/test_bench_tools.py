"""Smoke tests of the benchmark and diagnostic tools on a CPU (tools/bench_attention.py measures only on CUDA;
its --plot of an earlier CSV runs here), and the variant modules of tools/bench_variants.py: each one fused and equal
to eager."""

from __future__ import annotations

import csv
import dataclasses
import importlib.util
import os
import subprocess
import sys
from unittest import mock

import pytest
import torch

with mock.patch.dict(os.environ):  # the tool sets FUSE_ATTN_CANDIDATES for its runs; the session keeps conftest's
    from tools.bench_variants import DEFAULT_SIZE, VARIANTS, check_variant, small_size

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def table_rows(stdout):
    """The github-format table's rows as dicts keyed by its header."""
    return tables(stdout)[0]


def tables(stdout):
    """Each github-format table's rows (consecutive lines starting with "|") as dicts keyed by its header."""
    blocks, previous = [], False
    for line in stdout.splitlines():
        if line.startswith("|"):
            if not previous:
                blocks.append([])
            blocks[-1].append(line)
        previous = line.startswith("|")

    def cells(line):
        return [cell.strip() for cell in line.strip("|").split("|")]

    return [[dict(zip(cells(b[0]), cells(line))) for line in b[2:]] for b in blocks]


def run_tool(name, argv, monkeypatch, capsys):
    """``tools/<name>.py`` with ``argv``, called in this process (a process of its own would first spend ~10 s importing
    torch, transformers and the package, which this one holds): its exit status and what it printed. TRITON_INTERPRET=0:
    the fused op takes its plain-PyTorch CPU path (the interpreter would be far slower; the op reads it at run time);
    PYTHONPATH: the repository root, for the processes the tool starts itself. The environment is restored after."""
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")]))
    capsys.readouterr()
    with mock.patch.dict(os.environ):
        status = importlib.import_module(f"tools.{name}").main(argv)
    captured = capsys.readouterr()
    return subprocess.CompletedProcess([name, *argv], status, captured.out, captured.err)


def test_bench_models_tiny_on_cpu_fuses_every_layer(tmp_path, monkeypatch, capsys):
    pytest.importorskip("transformers")
    done = run_tool("bench_models", ["--device", "cpu", "--tiny", "--models", "gpt2", "bert-padded", "mistral-window",
                                     "t5", "phi3", "deepseek-mla", "llama-padded-blocks", "--modes", "infer",
                                     "--variants", "fuse_attn", "sdpa+fuse_attn", "--out", str(tmp_path)],
                    monkeypatch, capsys)
    assert done.returncode == 0, done.stdout + done.stderr
    rows = table_rows(done.stdout)
    assert [(row["model"], row["mode"]) for row in rows] == [("gpt2", "infer"), ("bert-padded", "infer"),
                                                                ("mistral-window", "infer"), ("t5", "infer"),
                                                                ("phi3", "infer"), ("deepseek-mla", "infer"),
                                                                ("llama-padded-blocks", "infer")], done.stdout
    # bert-padded: its padding mask, built in the graph from the attention mask input, fused too; mistral-window:
    # the sliding-window mask the model builds for SDPA; t5: three attentions a layer (the encoder's, and the
    # decoder's self- and cross-attention), the self-attentions with the position bias; phi3: Phi-3's layers (head
    # dim 96 at full size), in this run rather than one of its own; deepseek-mla: latent attention, the q/k head dim
    # (nope + rope parts) not the v head dim; llama-padded-blocks: each layer compiled alone, the padding + causal
    # mask an input of the block's graph, which every layer runs (one graph: one attention fused)
    per_layer = {"t5": 3}
    for row in rows:
        expected = 1 if row["model"] == "llama-padded-blocks" else per_layer.get(row["model"], 1) * int(row["layers"])
        assert int(row["fused"]) == int(row["sdpa fused"]) == expected > 0, done.stdout
        assert float(row["fuse_attn tok/s"].replace(",", "")) > 0 and float(row["sdpa+fuse_attn tok/s"].replace(",", "")) > 0
    assert (tmp_path / "bench_models.csv").read_text().count("\n") == 15  # header and the fourteen cells


def test_bench_models_compile_mode_reaches_every_compiled_variant(tmp_path, monkeypatch, capsys):
    """--compile-mode reduce-overhead: the model compiled in that mode (a CPU's Inductor skips the CUDA graphs), its
    training steps each a new step of CUDA graph trees, the CSV's variant named with the mode; every layer fused."""
    pytest.importorskip("transformers")
    done = run_tool("bench_models", ["--device", "cpu", "--tiny", "--models", "gpt2", "--modes", "train", "--variants",
                                     "sdpa+fuse_attn", "--compile-mode", "reduce-overhead", "--out", str(tmp_path)],
                    monkeypatch, capsys)
    assert done.returncode == 0, done.stdout + done.stderr
    (row,) = table_rows(done.stdout)
    assert int(row["sdpa fused"]) == int(row["layers"]) > 0 and "sdpa+fuse_attn@reduce-overhead tok/s" in row, row
    with open(tmp_path / "bench_models.csv", newline="") as f:
        (cell,) = csv.DictReader(f)
    assert cell["variant"] == "sdpa+fuse_attn@reduce-overhead" and float(cell["tokens_per_s"]) > 0, cell


def test_bench_models_compile_time_cold_and_warm_against_inductor_on_the_same_path(tmp_path, monkeypatch, capsys):
    """--compile-time: the first two training steps of each variant in fresh processes, cold caches and then warm
    (the caches the cold process left); the ratio of fuse_attn's time to Inductor's on the same attention path."""
    pytest.importorskip("transformers")
    # (the measured processes are the tool's own: this one only starts them)
    done = run_tool("bench_models", ["--device", "cpu", "--tiny", "--models", "gpt2", "--compile-time", "--variants",
                                     "sdpa+fuse_attn", "sdpa+inductor", "--out", str(tmp_path)], monkeypatch, capsys)
    assert done.returncode == 0, done.stdout + done.stderr
    with open(tmp_path / "bench_models_compile_time.csv", newline="") as f:
        cells = list(csv.DictReader(f))
    assert [(c["variant"], c["caches"]) for c in cells] == [("sdpa+fuse_attn", "cold"), ("sdpa+fuse_attn", "warm"),
                                                            ("sdpa+inductor", "cold"), ("sdpa+inductor", "warm")]
    for cell in cells:
        assert float(cell["first_two_steps_s"]) >= float(cell["first_step_s"]) > 0, cell
    assert [c["fused_attentions"] for c in cells] == ["2", "2", "", ""]  # the tiny GPT-2's two layers
    cold, warm = cells[:2]  # where fuse_attn's part went: the analysis, of it the trace (no tuning on a CPU)
    assert float(cold["first_step_s"]) > float(cold["analysis_s"]) >= float(cold["trace_s"]) > 0, cold
    assert float(warm["first_step_s"]) > float(warm["analysis_s"]) and float(warm["trace_s"]) == 0, warm  # stored
    for cell in (cold, warm):
        assert float(cell["tuning_s"]) == float(cell["compiling_candidates_s"]) == 0, cell
    assert all(c["analysis_s"] == "" for c in cells[2:])
    for cold in (cells[0], cells[2]):  # AOTAutograd's and Inductor's part, for every variant
        assert float(cold["first_step_s"]) > float(cold["joint_trace_s"]) > 0, cold
        assert float(cold["lowering_s"]) > 0 and float(cold["codegen_s"]) > 0, cold
    seconds = {(c["variant"], c["caches"]): float(c["first_two_steps_s"]) for c in cells}
    rows = table_rows(done.stdout)
    assert [row["caches"] for row in rows] == ["cold", "warm"], done.stdout
    for row in rows:  # (the CSV's seconds are rounded to 10 ms, the ratio is of the unrounded ones)
        ratio = seconds["sdpa+fuse_attn", row["caches"]] / seconds["sdpa+inductor", row["caches"]]
        assert abs(float(row["sdpa+fuse_attn / sdpa+inductor"].rstrip("x")) - ratio) <= 0.01, (row, ratio)


def test_profile_model_step_tiny_on_cpu(monkeypatch, capsys):
    """tools/profile_model_step.py: a row per variant, in the order given (a variant may repeat), with its host time
    and Dynamo's graphs; the CPU operators' table names each variant's column."""
    pytest.importorskip("transformers")
    # --mode infer: what is checked here (the rows, their order, the tables' columns) is the tool's own and the same in
    # either mode; a training step (bench_models' make_step, run in train mode by the compile-mode and compile-time
    # tests above) adds its backward's compile to each of the three processes
    # (each variant is profiled in a process the tool starts: this one only starts them)
    done = run_tool("profile_model_step", ["--device", "cpu", "--tiny", "--model", "gpt2", "--mode", "infer",
                                           "--variants", "sdpa+fuse_attn", "fuse_attn", "sdpa+fuse_attn", "--top", "5"],
                    monkeypatch, capsys)
    assert done.returncode == 0, done.stdout + done.stderr
    summary, operators = tables(done.stdout)
    assert [row["variant"] for row in summary] == ["sdpa+fuse_attn", "fuse_attn", "sdpa+fuse_attn"], done.stdout
    assert all(float(row["host ms"]) > 0 and int(row["graphs"]) >= 1 for row in summary), done.stdout
    assert list(operators[0])[1:] == ["1: sdpa+fuse_attn", "2: fuse_attn", "3: sdpa+fuse_attn"] and len(operators) == 5


def test_bench_models_tiny_gemma2_on_cpu_fuses_every_layer(tmp_path, monkeypatch, capsys):
    # Gemma-2 (softcapped scores, sliding and global layers) runs on eager attention only (bench_models refuses its
    # sdpa path, which ignores the softcap), so a run of its own (Phi-3, which has both, runs in
    # test_bench_models_tiny_on_cpu_fuses_every_layer's run); gpt-oss (learned sinks, sliding and full layers), which
    # transformers gives no sdpa path, and Gemma-4 (global layers' heads twice the sliding ones'), in the same run
    pytest.importorskip("transformers")
    done = run_tool("bench_models", ["--device", "cpu", "--tiny", "--models", "gemma2", "gpt-oss", "gemma4",
                                     "--modes", "infer", "--variants", "fuse_attn", "--out", str(tmp_path)],
                    monkeypatch, capsys)
    assert done.returncode == 0, done.stdout + done.stderr
    rows = table_rows(done.stdout)
    assert [row["model"] for row in rows] == ["gemma2", "gpt-oss", "gemma4"], done.stdout
    for row in rows:
        assert int(row["fused"]) == int(row["layers"]) > 0, done.stdout


def test_bench_decode_tiny_on_cpu(tmp_path, monkeypatch, capsys):
    pytest.importorskip("transformers")
    # The op part (our op and the SDPA backends a CPU runs) and generate with fuse_attn (every attention fused,
    # no graph compiled while timing); plain-PyTorch CPU path as above.
    done = run_tool("bench_decode", ["--device", "cpu", "--tiny", "--variants", "fuse_attn", "--out", str(tmp_path)],
                    monkeypatch, capsys)
    assert done.returncode == 0, done.stdout + done.stderr
    op_csv = (tmp_path / "bench_decode_op.csv").read_text().splitlines()
    assert op_csv[0].startswith("B,H,H_kv,D,N,kernel") and any(",fuse_attn,op dispatch," in line for line in op_csv)
    op, generate = tables(done.stdout)
    assert len(op) == 1 and float(op[0]["fuse_attn us"]) > 0, done.stdout
    assert len(generate) == 1, done.stdout
    row = generate[0]
    assert row["variant"] == "fuse_attn" and int(row["fused"]) > 0 and float(row["tok/s"]) > 0
    warmup, timed = (int(n) for n in row["graphs compiled (warm-up + timed)"].split("+"))
    assert warmup >= 1 and timed == 0, done.stdout


# The variants whose score change is a dense [1, H, N, N] tensor in the model itself (a learned bias, a precomputed
# ALiBi buffer): the kernels load it.
DENSE_BY_DESIGN = {"dense_bias", "alibi_causal_precomputed"}


@pytest.mark.parametrize("name", list(VARIANTS))
def test_bench_variants_module_is_fused_and_matches_eager(name):
    """Each benchmarked variant module, compiled with fuse_attn on the CPU in fp32 (kernels in Triton's interpreter
    under TRITON_INTERPRET=1): its attention fused, output and gradients (q, k, v, the learned bias) within the 2x
    rule of eager's against fp64. A benchmark row of an unfused variant would time Inductor, not our kernels."""
    variant = VARIANTS[name]
    # head dim 16 (the default's 128 scaled down; MLA's 192 / 128 to 24 / 16), but the variants about head dims 256
    # and 512 keep theirs
    head_dim = {256: 256, 512: 512, 192: 24}.get(variant.default.head_dim, 16)
    size = small_size(variant.default, 64, head_dim)
    # at most 16 query heads, keeping the variant's GQA group and at least 2 kv heads: gpt-oss's group of 8 on
    # small_size's 4 kv heads would be 32 heads, each one more program per block in the interpreter
    kv_heads = max(2, min(size.kv_heads, 16 // size.group))
    size = dataclasses.replace(size, heads=size.group * kv_heads, kv_heads=kv_heads)
    result = check_variant(variant, size, "cpu")
    assert result.fused >= 1, "\n".join(result.verdicts)
    if name == "padding_causal_mask_input":  # a mask of unknown values: its tiles classified per call
        assert all("tiles classified per call" in verdict for verdict in result.verdicts), "\n".join(result.verdicts)
    elif name not in DENSE_BY_DESIGN:  # masks built from indices or a padding vector: nothing [.., M, N] is loaded
        assert not any("M,N]" in verdict for verdict in result.verdicts), "\n".join(result.verdicts)
    assert result.ok, "; ".join(result.comparisons)


def test_attention_precision_compares_each_captured_call_on_cpu():
    pytest.importorskip("transformers")
    # fuse_attn's kernels in the interpreter on the CPU (the tool sets it where no GPU is)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")]))
    env.pop("TRITON_INTERPRET", None)
    command = [sys.executable, os.path.join(ROOT, "tools", "attention_precision.py"), "--device", "cpu",
               "--model", "t5-relative-bias", "--seeds", "3"]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    rows = table_rows(done.stdout)
    # T5's two encoder attentions, each by our kernels, the eager math and SDPA's CPU kernels
    assert sorted((row["call"], row["implementation"]) for row in rows) == sorted(
        (call, label) for call in ("0", "1") for label in ("fuse_attn", "eager math", "sdpa (cpu default)", "sdpa math"))
    for row in rows:  # every gradient there (the mask is T5's learned position bias), each a bf16-sized error
        assert all(0 < float(row[column]) < 0.1 for column in ("out", "dq", "dk", "dv", "dmask")), done.stdout


def test_bench_attention_plots_a_csv_without_a_gpu(tmp_path):
    """`--skip-check --skip-speed --plot` only draws the CSV of earlier runs: it must not need CUDA (without
    matplotlib, as in CI, it says so and exits 0). The CSV: the rows of benchmarks/results.csv that
    tools/bench_attention.py measured (the generated template and SDPA cuDNN on an H200), in the tool's own columns."""
    from tools.bench_attention import CSV_COLUMNS

    methods = {"fuse_attn template": "ours", "cudnn": "SDPA cuDNN"}  # results.csv's names -> the tool's
    with open(os.path.join(ROOT, "benchmarks", "results.csv"), newline="") as f:
        measured = [row for row in csv.DictReader(f)
                    if row["case"].startswith("bench_attention/") and row["implementation"] in methods]
    assert {row["implementation"] for row in measured} == set(methods), "results.csv lacks bench_attention rows"
    with open(tmp_path / "bench_attention.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, CSV_COLUMNS, extrasaction="ignore")
        writer.writeheader()
        for row in measured:
            _, name, mode, shape = row["case"].split("/")
            sizes = shape.split()
            B, H, N, D = (int(size[1:]) for size in sizes[:4])
            mask, _, mod = name.partition("+")
            dtype = sizes[4] if len(sizes) > 4 else "bfloat16"
            writer.writerow({"B": B, "H": H, "N": N, "D": D, "causal": int(mask == "causal"),
                             "score_mod": mod or "none", "score_program": mod or "none", "mode": mode, "dtype": dtype,
                             "method": methods[row["implementation"]], "median_ms": row["ms"], "TF/s": row["tflops"],
                             "peak_bytes_above_inputs": "", "gpu": row["gpu"], "torch": row["torch"],
                             "triton": row["triton"], "date": row["date"]})
    result = subprocess.run([sys.executable, "tools/bench_attention.py", "--out", str(tmp_path), "--skip-check",
                             "--skip-speed", "--plot"], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr
    if importlib.util.find_spec("matplotlib") is None:
        assert "matplotlib is not installed" in result.stdout, result.stdout
    else:
        assert os.path.getsize(tmp_path / "bench_attention.png") > 0


def test_bench_host_overhead_chains_attentions_into_one_graph():
    """tools/bench_host_overhead.py --chain K: a compiled method's call is one graph of K fused attentions, each
    one's output the next one's queries (eager's answer)."""
    import fuse_attn
    from tools.bench_host_overhead import CausalAttention, Chain

    chain = Chain(CausalAttention(16), 3)
    q, k, v = (torch.randn(1, 2, 16, 8) for _ in range(3))
    report = fuse_attn.explain(chain, q, k, v)
    assert len(report.graphs) == 1 and len(report.fused) == 3 and not report.not_fused, str(report)
    expected = q
    for _ in range(3):
        expected = CausalAttention(16)(expected, k, v)
    torch.testing.assert_close(torch.compile(chain, backend="fuse_attn")(q, k, v), expected)


def test_bench_csv_turns_host_overhead_and_candidate_rows_into_results_rows(tmp_path):
    """tools/bench_csv.py reads the CSVs of bench_host_overhead (two results rows a measurement: wall and GPU time, us
    turned into ms) and bench_candidates (a row a candidate), with the columns those tools write."""
    from tools.bench_csv import results_rows

    host = tmp_path / "bench_host_overhead.csv"
    host.write_text("B,H,N,D,dtype,mode,chain,method,wall_us,gpu_us,gpu,torch,triton,date\n"
                    "8,12,1024,64,bfloat16,fwd,12,fuse_attn Gluon,133.0,42.5,H200,2.11,3.6,2026-11-29\n"
                    "8,12,1024,64,bfloat16,fwd,12,SDPA cuDNN,61.0,47.0,H200,2.11,3.6,2026-11-29\n")
    rows = results_rows(str(host), "abc1234")
    assert [(r["case"], r["implementation"], r["ms"]) for r in rows] == [
        ("bench_host_overhead/causal chain12 wall/fwd/B8 H12 N1024 D64", "fuse_attn Gluon", "0.13300"),
        ("bench_host_overhead/causal chain12 gpu/fwd/B8 H12 N1024 D64", "fuse_attn Gluon", "0.04250"),
        ("bench_host_overhead/causal chain12 wall/fwd/B8 H12 N1024 D64", "SDPA cuDNN", "0.06100"),
        ("bench_host_overhead/causal chain12 gpu/fwd/B8 H12 N1024 D64", "SDPA cuDNN", "0.04700")]
    assert [r["ratio"] for r in rows[:2]] == ["0.459", "1.106"]  # (cuDNN's time / ours, per case)

    candidates = tmp_path / "bench_candidates.csv"
    candidates.write_text("model,Z,H,H_kv,N,D,causal,mode,candidate,ms,device,torch,triton,date\n"
                          "gpt2-small,8,12,12,1024,64,True,fwd,triton untuned,0.06541,H200,2.11,3.6,2026-11-29\n"
                          "bert-base,32,12,12,512,64,False,fwd,gluon,,H200,2.11,3.6,2026-11-29\n")
    rows = results_rows(str(candidates), "abc1234")
    assert [(r["case"], r["implementation"], r["ms"], r["gpu"]) for r in rows] == [
        ("bench_candidates/gpt2-small/fwd/B8 H12 Hkv12 N1024 D64 causal", "triton untuned", "0.06541", "H200")]


def test_bench_csv_turns_plain_attention_rows_into_results_rows(tmp_path):
    """benchmarks/plain_attention.py's CSV: a results row an implementation, GPU ms and TF/s, the kv heads in the case
    where they differ from the query heads (GQA)."""
    from tools.bench_csv import results_rows

    plain = tmp_path / "plain_attention.csv"
    plain.write_text("B,H,H_kv,N,D,causal,mode,implementation,config,gpu_ms,wall_ms,tflops,ratio,gpu,torch,triton,date\n"
                     '2,64,8,8192,128,1,fwd,fuse_attn,"(64, 128, 3, 2)",3.7441,3.70,587.2,1.040,H200,2.11,3.6,2026-11-30\n'
                     "2,64,8,8192,128,1,fwd,cudnn,,3.8934,3.85,564.7,,H200,2.11,3.6,2026-11-30\n"
                     '4,16,16,4096,64,0,fwd+bwd,fuse_attn,"(128, 64, 2, 2)",1.5,1.6,320.0,1.026,H200,2.11,3.6,2026-11-30\n')
    rows = results_rows(str(plain), "abc1234")
    assert [(r["case"], r["implementation"], r["ms"], r["tflops"], r["ratio"]) for r in rows] == [
        ("plain_attention/causal/fwd/B2 H64 Hkv8 N8192 D128", "fuse_attn", "3.7441", "587.2", "1.040"),
        ("plain_attention/causal/fwd/B2 H64 Hkv8 N8192 D128", "cudnn", "3.8934", "564.7", ""),
        ("plain_attention/unmasked/fwd+bwd/B4 H16 N4096 D64", "fuse_attn", "1.5", "320.0", "1.026")]


def test_bench_csv_turns_compile_times_into_results_rows(tmp_path):
    """bench_models --compile-time's CSV: a results row a variant and cache state, the first two steps in ms."""
    from tools.bench_csv import results_rows

    path = tmp_path / "bench_models_compile_time.csv"
    path.write_text("model,B,N,variant,caches,first_two_steps_s,first_step_s,fused_attentions,analysis_s,trace_s,"
                    "tuning_s,compiling_candidates_s,device,torch,triton,transformers,date\n"
                    "llama-1b,4,4096,fuse_attn,cold,48.13,47.93,16,15.02,1.71,12.75,0.00,H200,2.11,3.6,5.17,2026-11-29\n"
                    "llama-1b,4,4096,sdpa+inductor,cold,34.16,33.87,,,,,,H200,2.11,3.6,5.17,2026-11-29\n"
                    "llama-1b,4,4096,sdpa+inductor,warm,error,,,,,,,H200,2.11,3.6,5.17,2026-11-29\n")
    rows = results_rows(str(path), "abc1234")
    assert [(r["case"], r["implementation"], r["ms"], r["ratio"]) for r in rows] == [
        ("bench_models_compile_time/llama-1b/cold/B4 N4096", "fuse_attn", "48130", "0.710"),
        ("bench_models_compile_time/llama-1b/cold/B4 N4096", "sdpa+inductor", "34160", "")]
