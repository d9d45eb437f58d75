"""Sampler throughput: ours vs transformers generate, and continuous vs static batching.

    python benchmarks/sampler/sampler_bench.py  # issue-13 shape, text report
    python benchmarks/sampler/sampler_bench.py --temperature 1 --json # one JSON line on stdout
    python benchmarks/sampler/sampler_bench.py --model HF_DIR --batch 32 --prompt-len 32 \
        --new-tokens 256 --temperature 0 --json
    python benchmarks/sampler/sampler_bench.py --quick  # small shapes, seconds
    python benchmarks/sampler/sampler_bench.py --quick --preset tiny_qwen3_moe  # an MoE policy

Without --model a random Qwen3 checkpoint is written with transformers (hidden 512, 4
layers, 8 heads of 64, 2 kv heads, MLP 1024, vocab 32000, untied: 41.7M params) and loaded
by both sides, so both run the same weights. `--preset NAME` writes a random checkpoint of
a models.config preset instead (e.g. tiny_qwen3_moe: a Qwen3-MoE, which transformers runs
as Qwen3MoeForCausalLM); for an MoE model every FLOP count below takes the ACTIVE
parameters (`ModelConfig.num_params(active=True)`: router, the top-k experts a token runs).
Measured in this run on this machine:

1. Decode throughput at a fixed batch (default 32 random 32-token prompts x 256 new tokens,
   no early stop): ours (jitted decode chunks, compile excluded by a warm-up run with the
   same shapes) vs `transformers` generate (also after a warm-up, in its own process): on
   torch CPU the best of 1 thread and torch's default thread count; where JAX runs on a
   GPU, on that same GPU in the same dtype (`--hf-device`; JAX then preallocates only
   HF_SHARED_JAX_FRACTION of it unless XLA_PYTHON_CLIENT_MEM_FRACTION says otherwise, so
   torch's weights and KV cache fit beside it). At temperature T > 0 both
   sample from softmax(logits / T) with top-k and top-p off. The sides alternate and the
   best of --repeats runs of each is kept: on a shared machine torch's OpenMP threads slow
   down badly whenever the cores are oversubscribed. At temperature 0, greedy_match is the
   fraction of generated tokens equal to transformers' (position by position).
2. The compute limit: the best float32 matmul FLOP/s measured here with JAX (a 2048^3 dot)
   over 2 N FLOPs per token, N the parameters that take part in a matmul (all but an
   untied input embedding); our tokens/s as a fraction of it. Attention's own FLOPs (a few
   percent at these lengths) are not counted, so the fraction is slightly understated.
3. The weight-matmul floor (`floor_program`): a loop of decode steps that run only the
   model's weight matmuls (every layer's projections and the LM head, at the batch's rows,
   through XLA's default kernels) and the cheap elementwise work that chains them. Its
   tokens/s bound any decode built on these kernels, so floor / transformers bounds the
   ratio from part 1. On CPU it sits well under the compute limit: at 32 rows each weight
   is read from memory once per step for only 32 multiply-adds, and the matmul kernels
   run well below the 2048^3 dot's FLOP rate.
4. Continuous vs static batching on a mixed-length workload: per-request token budgets
   spread over 10x. Static = waves of `slots` requests, each wave waits for its longest
   sequence; continuous = the same sampler and slots refilled as sequences finish.
   Goal >= 1.5x.
5. On a GPU/TPU: the decode step's achieved fraction of the HBM-bandwidth roofline (bytes
   of weights and live KV cache read per step / step time / peak bandwidth).
6. With --profile: one more fixed-batch run under JAX's profiler, and the fraction of its
   wall time that the GPU's streams were busy (the union of their kernels' intervals), with
   the busy and wall milliseconds per decode step: the rest is the GPU idling on the host;
   and the time per decode step by kernel family and by kernel (`gpu_profile.py`).

`--decode-attention` picks decode's paged attention (`paged_attention.AUTO_IMPL`): on a GPU
"auto" runs the Pallas Triton kernel over the page pool, "gather" XLA's gather of the rows'
pages (the path before it); on CPU "triton" runs the kernel in interpret mode (slow, for
smoke runs only). `--triton-config` sets the Triton kernel's block configuration (the GPU
suite passes the fastest of its kernel sweep where that is not `paged_triton`'s defaults).

Goals (issue 13, 2-core CPU, float32): >= 2.0x transformers greedy, >= 2.5x at temperature
1, >= 35% of the compute limit, greedy tokens identical.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import tempfile
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)  # benchmarks.* and jaxrl_scale from this tree

# pylint: disable=wrong-import-position
from benchmarks.common import gpu_profile  # noqa: E402
from benchmarks.common import random_checkpoint  # noqa: E402
from benchmarks.common.phases import Phases  # noqa: E402
from benchmarks.sampler import hf_baseline  # noqa: E402
from benchmarks.sampler.floor import floor_program, matmul_floor  # noqa: E402,F401
from benchmarks.train.train_step_bench import matmul_peak  # noqa: E402
# pylint: enable=wrong-import-position


def peak_gbps(device_kind: str) -> float | None:
  """The HBM bandwidth (GB/s) of the part whose device kind is exactly `device_kind`
  (`jaxrl_scale.plan.chips.DEVICE_PEAKS`), for the roofline line; None if unknown (then
  no roofline fraction unless --hbm-gbps gives the peak)."""
  from jaxrl_scale.plan import chips  # pylint: disable=g-import-not-at-top

  peaks = chips.device_peaks(device_kind)
  return None if peaks is None else peaks.hbm_bandwidth / 1e9


# JAX's share of a GPU that transformers shares (--hf-device cuda): the rest holds torch's
# weights and its KV cache (batch 256 x 640 positions of Qwen3-0.6B: about 19 GiB).
HF_SHARED_JAX_FRACTION = 0.45


def _parse() -> argparse.Namespace:
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
  p.add_argument("--quick", action="store_true", help="small shapes for a fast check")
  p.add_argument("--model", default=None,
                 help="a Hugging Face checkpoint directory (default: a random Qwen3)")
  p.add_argument("--preset", default=None,
                 help="instead of --model: a random checkpoint of this models.config preset "
                      "with a Hugging Face form (e.g. tiny_qwen3_moe); the shape flags are "
                      "ignored")
  p.add_argument("--hidden", type=int, default=512)
  p.add_argument("--layers", type=int, default=4)
  p.add_argument("--heads", type=int, default=8)
  p.add_argument("--kv-heads", type=int, default=2)
  p.add_argument("--intermediate", type=int, default=1024)
  p.add_argument("--vocab", type=int, default=32000)
  p.add_argument("--batch", type=int, default=32)
  p.add_argument("--new-tokens", type=int, default=256)
  p.add_argument("--prompt-len", type=int, default=32)
  p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
  p.add_argument("--chunk", type=int, default=32, help="decode steps per jitted chunk")
  p.add_argument("--requests", type=int, default=256, help="mixed workload size")
  p.add_argument("--slots", type=int, default=32, help="slots for the mixed workload")
  p.add_argument("--min-tokens", type=int, default=24, help="mixed workload shortest budget")
  p.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
  p.add_argument("--repeats", type=int, default=3, help="timed runs per side; best is kept")
  p.add_argument("--skip-hf", action="store_true", help="skip the transformers baseline")
  p.add_argument("--attention", default="auto", choices=("auto", "einsum", "cudnn", "splash"),
                 help="model.attention_impl of prefill (auto: cuDNN on GPU for bf16)")
  p.add_argument("--hf-threads", type=int, default=None,
                 help="torch threads (default: the best of 1 and torch's default; on CUDA "
                      "torch's default)")
  p.add_argument("--hf-device", default="auto", choices=("auto", "cpu", "cuda"),
                 help="where transformers runs (auto: on the GPU when JAX runs on one, "
                      "else the CPU)")
  p.add_argument("--skip-mixed", action="store_true", help="skip the mixed-length workload")
  p.add_argument("--skip-floor", action="store_true",
                 help="skip the compute limit and the weight-matmul floor (parts 2 and 3)")
  p.add_argument("--decode-attention", default="auto", choices=("auto", "gather", "triton"),
                 help="decode's paged attention (auto: the Triton kernel on GPU, the gather "
                      "on CPU)")
  p.add_argument("--triton-config", default=None,
                 help="the Triton kernel's block configuration, e.g. "
                      "kv_tokens_per_block=32,num_warps=8,num_stages=1,target_programs=1024 "
                      "(default: paged_triton's constants)")
  p.add_argument("--save-tokens", default=None,
                 help="write the fixed-batch run's generated tokens here (.npy, [batch, new])")
  p.add_argument("--profile", action="store_true",
                 help="one more run under the profiler: the GPU-busy fraction of decode")
  p.add_argument("--hbm-gbps", type=float, default=None, help="peak HBM bandwidth, GB/s")
  p.add_argument("--json", action="store_true",
                 help="print one JSON line on stdout (the report goes to stderr)")
  args = p.parse_args()
  if args.quick:
    args.hidden, args.layers, args.vocab, args.intermediate = 128, 2, 2048, 256
    args.heads, args.kv_heads = 4, 2
    args.batch, args.new_tokens, args.requests, args.slots = 8, 64, 64, 8
    args.prompt_len, args.min_tokens, args.chunk, args.repeats = 8, 12, 8, 2
  if args.temperature < 0:
    p.error("--temperature must be >= 0")
  try:
    args.triton_config = triton_config(args.triton_config)
  except ValueError as e:
    p.error(f"--triton-config: {e}")
  if args.model is not None and not os.path.isdir(args.model):
    p.error(f"--model {args.model}: not a directory")
  if args.model is not None and args.preset is not None:
    p.error("--model and --preset exclude each other")
  return args


def _write_preset(name: str, path: str) -> None:
  """A random checkpoint (std 0.02 init, seed 0) of preset `name`, in Hugging Face form."""
  from jaxrl_scale.models import config as model_config
  from jaxrl_scale.models import hf_io, transformer

  try:
    cfg = model_config.preset(name)
  except ValueError as e:
    sys.exit(f"--preset: {e}")
  if cfg.num_experts and cfg.family != "qwen3_moe":  # shape-only (models/config.py)
    sys.exit(f"--preset {name}: has no Hugging Face form")
  hf_io.save_hf_model(transformer.create_model(cfg, seed=0), cfg, path)


def _write_checkpoint(args, path: str) -> None:
  """A random float32 Qwen3 of the shape flags (`random_checkpoint.write_qwen3`)."""
  random_checkpoint.write_qwen3(
      path, "float32", vocab_size=args.vocab, hidden_size=args.hidden,
      intermediate_size=args.intermediate, num_hidden_layers=args.layers,
      num_attention_heads=args.heads, num_key_value_heads=args.kv_heads,
      head_dim=args.hidden // args.heads, max_position_embeddings=4096, bos_token_id=1,
      eos_token_id=2, pad_token_id=0, tie_word_embeddings=False)


def _sampler(model, args, slots: int, max_new: int):
  from jaxrl_scale.config import SamplerConfig
  from jaxrl_scale.generation import engine

  bucket = 1 << (args.prompt_len - 1).bit_length()
  cfg = SamplerConfig(num_slots=slots, max_new_tokens=max_new, temperature=args.temperature,
                      top_k=0, top_p=1.0, decode_chunk=args.chunk, prompt_buckets=(bucket,))
  return engine.Sampler(model, cfg, eos_ids=())  # no EOS: every row runs its full budget


def _timed(sampler, requests, repeats: int = 1) -> tuple[float, list]:
  """Best wall time over `repeats` runs (the machine may be shared), and the outputs."""
  best = float("inf")
  for _ in range(repeats):
    sampler.reset_stats()
    start = time.perf_counter()
    outs = sampler.generate(requests)
    best = min(best, time.perf_counter() - start)
  return best, outs


def _roofline(sampler, model_cfg, args, step_seconds: float, live_len: float,
              ) -> tuple[str, dict]:
  """(report line, JSON fields): the decode step against the HBM-bandwidth roofline."""
  import jax

  device = jax.devices()[0]
  if device.platform == "cpu":
    return "roofline: skipped (CPU run; HBM roofline applies to GPU/TPU)", {}
  peak = args.hbm_gbps
  if peak is None:
    peak = peak_gbps(device.device_kind)
  if peak is None:
    return f"roofline: unknown peak bandwidth for {device.device_kind}; pass --hbm-gbps", {}
  # Every weight is read once per step, except an untied input embedding: a gather of the
  # batch's rows.
  param_bytes = sum(
      x.nbytes for path, x in jax.tree.leaves_with_path(sampler.params)
      if model_cfg.tie_embeddings or "embed_tokens" not in jax.tree_util.keystr(path))
  itemsize = sampler._state.cache.kv.dtype.itemsize
  kv_bytes = (2 * model_cfg.num_layers * sampler.num_slots * live_len * model_cfg.num_kv_heads
              * model_cfg.head_dim * itemsize)
  step_bytes = param_bytes + kv_bytes
  achieved = step_bytes / step_seconds / 1e9
  roofline_tps = args.batch * peak * 1e9 / step_bytes
  line = (f"roofline: {achieved:.0f} GB/s of {peak:.0f} GB/s peak = {achieved / peak:.1%} "
          f"(weights {param_bytes / 1e6:.1f} MB + live KV {kv_bytes / 1e6:.1f} MB per step; "
          f"at the peak: {roofline_tps:.0f} tokens/s, ours {args.batch / step_seconds:.0f})")
  return line, dict(hbm_gbps_peak=peak, hbm_gbps_achieved=round(achieved, 1),
                    roofline_tok_s=round(roofline_tps, 1),
                    fraction_of_roofline=round(achieved / peak, 4))


# --triton-config's keys: the `paged_triton` constant each one sets.
TRITON_CONFIG = {"kv_tokens_per_block": "KV_TOKENS_PER_BLOCK", "num_warps": "NUM_WARPS",
                 "num_stages": "NUM_STAGES", "target_programs": "TARGET_PROGRAMS"}


def triton_config(text: str | None) -> dict[str, int]:
  """--triton-config "k=v,..." as {key: int}; ValueError naming a bad part."""
  out = {}
  for part in filter(None, (text or "").split(",")):
    key, sep, value = part.partition("=")
    if not sep or key not in TRITON_CONFIG:
      raise ValueError(f"{part!r} is not KEY=N with KEY one of {', '.join(TRITON_CONFIG)}")
    try:
      out[key] = int(value)
    except ValueError:
      raise ValueError(f"{part!r}: {value!r} is not an integer") from None
    if out[key] < 1:
      raise ValueError(f"{part!r}: must be >= 1")
  return out


def set_triton(config: dict[str, int]) -> dict:
  """Sets `paged_triton`'s block constants (read when the decode programs are traced);
  returns what the decode then runs with."""
  from jaxrl_scale.models import paged_triton  # pylint: disable=g-import-not-at-top

  for key, value in config.items():
    setattr(paged_triton, TRITON_CONFIG[key], value)
  return {k: getattr(paged_triton, v) for k, v in TRITON_CONFIG.items()}


def main() -> int:
  args = _parse()
  phases = Phases()
  if not args.skip_hf and args.hf_device != "cpu":
    # transformers may share the GPU: JAX would otherwise take 75% of it up front. The
    # decode's own arrays (weights, the page pool) are sized by the config, not by this.
    os.environ.setdefault("XLA_PYTHON_CLIENT_MEM_FRACTION", str(HF_SHARED_JAX_FRACTION))
  import jax

  from jaxrl_scale.generation import records
  from jaxrl_scale.models import hf_io, paged_attention

  if args.decode_attention != "auto":  # read when the decode programs are traced
    paged_attention.AUTO_IMPL = args.decode_attention
  triton = set_triton(args.triton_config)
  report: dict = {}
  log_file = sys.stderr if args.json else sys.stdout

  def log(line: str) -> None:
    print(line, file=log_file, flush=True)

  phases.log = log
  phases.lap("imports")

  path = args.model
  if path is None:
    path = tempfile.mkdtemp(prefix="sampler_bench_")
    if args.preset is not None:
      _write_preset(args.preset, path)
    else:
      _write_checkpoint(args, path)
    phases.lap("checkpoint")
  model, model_cfg = hf_io.load_hf_model(path, param_dtype=args.dtype)
  phases.lap("load")
  if args.attention != model_cfg.attention_impl:
    model_cfg = dataclasses.replace(model_cfg, attention_impl=args.attention)
    model.cfg = model_cfg  # read by the layer loop at trace time (prefill's attention)
  n_params = model_cfg.num_params()
  embed = model_cfg.vocab_size * model_cfg.hidden_size
  # An MoE token runs its top-k experts only: FLOPs follow the active parameters.
  matmul_params = (model_cfg.num_params(active=True)
                   - (0 if model_cfg.tie_embeddings else embed))
  device = f"{jax.devices()[0].device_kind} x{len(jax.devices())}"
  name = args.model or (f"random {args.preset}" if args.preset else "random qwen3")
  report.update(device=device, cpu_cores=os.cpu_count(), model=name,
                params=n_params, active_params=model_cfg.num_params(active=True),
                dtype=args.dtype, batch=args.batch,
                prompt_len=args.prompt_len, new_tokens=args.new_tokens,
                temperature=args.temperature, chunk=args.chunk, attention=args.attention)
  experts = (f", {model_cfg.experts_per_token} of {model_cfg.num_experts} experts: "
             f"{model_cfg.num_params(active=True) / 1e6:.2f}M active"
             if model_cfg.num_experts else "")
  log(f"device: {device}; model: {name} hidden={model_cfg.hidden_size} "
      f"layers={model_cfg.num_layers} vocab={model_cfg.vocab_size} "
      f"({n_params / 1e6:.2f}M params{experts}, {args.dtype}); temperature {args.temperature}")

  rng = np.random.default_rng(0)
  prompts = rng.integers(3, model_cfg.vocab_size, size=(args.batch, args.prompt_len))
  prompts = prompts.astype(np.int64)

  # 1. Fixed-batch decode throughput. Ours and transformers alternate, best of each kept, so
  # both sides see the same background load on a shared machine.
  sampler = _sampler(model, args, args.batch, args.new_tokens)
  phases.lap("sampler")
  decode_impl = paged_attention.paged_impl(sampler.mesh, model_cfg.head_dim,
                                           sampler.cfg.page_size)
  report["decode_attention"] = decode_impl
  log(f"decode attention: {decode_impl} (--decode-attention {args.decode_attention})")
  if decode_impl == "triton":
    report["triton"] = triton
    log(f"triton kernel: {triton}")
  reqs = [records.Request(p.tolist(), prompt_id=i) for i, p in enumerate(prompts)]
  # transformers first: an impossible --hf-device fails before our compile.
  hf = None
  if not args.skip_hf:
    device = hf_baseline.device_for(args.hf_device, jax.default_backend())
    report["hf_device"] = device
    try:
      hf = hf_baseline.HF(path, args.dtype, device)
    except hf_baseline.HFFailed as e:
      hf = hf_baseline.failed(e, report, log)
    phases.lap("hf_load")
  # torch on the CPU gets its best of one thread and its default count: with the cores
  # oversubscribed (a shared machine), one thread is often several times faster than
  # OpenMP's default. On a GPU the thread count only feeds kernel launches: the default.
  hf_threads = [] if hf is None else (
      [args.hf_threads] if args.hf_threads else
      [hf.default_threads] if hf.device == "cuda" else sorted({1, hf.default_threads}))
  _timed(sampler, reqs)  # compile
  phases.lap("compile")
  try:
    for t in hf_threads:
      hf.generate(prompts, 4, t, args.temperature)  # warm-up
  except hf_baseline.HFFailed as e:
    hf, hf_threads = hf_baseline.failed(e, report, log), []
  if not args.skip_hf:
    phases.lap("hf_warmup")
  ours_s = float("inf")
  hf_s = {t: float("inf") for t in hf_threads}
  hf_tokens = None
  total = args.batch * args.new_tokens
  live_len = args.prompt_len + args.new_tokens / 2  # a row's average length while decoding

  def step_seconds(seconds: float) -> float:  # of the last generate (its stats)
    return seconds / max(sampler.stats.chunks * args.chunk, 1)

  for i in range(args.repeats):
    seconds, outs = _timed(sampler, reqs)
    ours_s = min(ours_s, seconds)
    phases.lap("timed")
    # Logged now, not only after transformers' turn: a run killed at its time limit while
    # transformers generates still says what ours did (gpu_suite_report.parse_sampler).
    fraction = _roofline(sampler, model_cfg, args, step_seconds(seconds),
                         live_len)[1].get("fraction_of_roofline")
    log(f"[decode] ours, run {i + 1}: {total / seconds:.0f} tokens/s"
        + (f" ({fraction:.1%} of the HBM roofline)" if fraction is not None else ""))
    try:
      for t in hf_threads:
        seconds, hf_tokens = hf.generate(prompts, args.new_tokens, t, args.temperature)
        hf_s[t] = min(hf_s[t], seconds)
    except hf_baseline.HFFailed as e:
      hf, hf_threads = hf_baseline.failed(e, report, log), []
    if not args.skip_hf:
      phases.lap("hf_timed")
  assert all(o.num_tokens == args.new_tokens for o in outs)
  if args.save_tokens:  # e.g. to compare two decode attention paths' greedy tokens
    np.save(args.save_tokens, np.asarray([o.tokens for o in outs], np.int32))
  ours_tps = total / ours_s
  report["ours_tok_s"] = round(ours_tps, 1)
  log(f"[decode] ours: {total} tokens in {ours_s:.2f} s = {ours_tps:.0f} tokens/s "
      f"(batch {args.batch}, {args.new_tokens} new tokens, chunk {args.chunk})")
  if hf is not None:
    hf.close()
    for t in hf_threads:
      log(f"[decode] transformers generate (torch {hf.device.upper()}, {t} thread(s), own "
          f"process): "
          f"{hf_s[t]:.2f} s = {total / hf_s[t]:.0f} tokens/s")
    hf_tps = total / min(hf_s.values())
    # Issue 13 (CPU, float32): 2x greedy, 2.5x sampled; issue 34 (the same GPU): 5x.
    goal = 5.0 if hf.device == "cuda" else 2.5 if args.temperature > 0 else 2.0
    report.update(hf_tok_s=round(hf_tps, 1), ratio=round(ours_tps / hf_tps, 3),
                  hf_threads=min(hf_s, key=hf_s.get))
    log(f"[decode] RATIO ours / best transformers = {ours_tps / hf_tps:.2f}x "
        f"(goal >= {goal}x)")
    if args.temperature == 0:
      ours_tokens = np.asarray([o.tokens for o in outs])
      match = float(np.mean(ours_tokens == hf_tokens))
      report["greedy_match"] = round(match, 5)
      log(f"[decode] greedy tokens equal to transformers': {match:.2%} (goal 100%)")
  if not args.skip_floor:
    report.update(_limits(args, model_cfg, matmul_params, ours_tps,
                          None if hf is None else hf_tps, log))
    phases.lap("floor")
  line, fields = _roofline(sampler, model_cfg, args, step_seconds(ours_s), live_len)
  report.update(fields)
  log(line)
  if args.profile:
    report.update(_profiled(sampler, reqs, args, log))
    phases.lap("profile")

  if not args.skip_mixed:
    report.update(_mixed(args, model, prompts, rng, log))
    phases.lap("mixed")
  report["phases_s"] = phases.seconds
  log(phases.line())
  if args.json:
    print(json.dumps(report), flush=True)
  return 0


def _limits(args, model_cfg, matmul_params: int, ours_tps: float, hf_tps: float | None,
            log) -> dict:
  """Parts 2 and 3: the compute limit and the weight-matmul floor, as report fields."""
  flops = matmul_peak(2048, dtype=args.dtype)
  limit = flops / (2 * matmul_params)
  report = dict(matmul_gflop_s=round(flops / 1e9, 1), compute_limit_tok_s=round(limit, 1),
                fraction_of_limit=round(ours_tps / limit, 4))
  log(f"[decode] compute limit: {flops / 1e9:.0f} GFLOP/s (best {args.dtype} 2048^3 matmul) / "
      f"(2 x {matmul_params / 1e6:.1f}M matmul params) = {limit:.0f} tokens/s; "
      f"ours = {ours_tps / limit:.1%} of it (goal >= 35%)")
  floor = matmul_floor(model_cfg, args.batch, args.dtype)
  report.update(matmul_floor_tok_s=round(floor, 1), fraction_of_floor=round(ours_tps / floor, 4))
  line = (f"[decode] weight matmuls alone (no attention or sampling, batch {args.batch}): "
          f"{floor:.0f} tokens/s = {floor / limit:.1%} of the compute limit; "
          f"ours = {ours_tps / floor:.1%} of it")
  if hf_tps is not None:
    report["floor_over_hf"] = round(floor / hf_tps, 3)
    line += f"; it is {floor / hf_tps:.2f}x transformers (no decode on these kernels beats that)"
  log(line)
  return report


def _profiled(sampler, reqs, args, log) -> dict:
  """Part 6: one fixed-batch run under the profiler; the GPU's busy share of its wall time
  and the kernels that took it, per decode step (prefill included; `gpu_profile`)."""
  sampler.reset_stats()
  return gpu_profile.profile(lambda: sampler.generate(reqs),
                             lambda: sampler.stats.chunks * args.chunk, log, "sampler_bench",
                             unit="decode step, prefill included")


def _mixed(args, model, prompts, rng, log) -> dict:
  """Continuous vs static batching, same sampler and slots, on a mixed-length workload."""
  from jaxrl_scale.generation import records

  budgets = np.exp(rng.uniform(np.log(args.min_tokens), np.log(args.new_tokens),
                               size=args.requests)).astype(int)
  work = [records.Request(prompts[i % args.batch].tolist(), prompt_id=i,
                          max_new_tokens=int(b)) for i, b in enumerate(budgets)]
  mixed = _sampler(model, args, args.slots, args.new_tokens)
  mixed.generate(work[:2 * args.slots])  # compile every admission size used below
  for k in (1, 2, 4, 8, 16, 32):
    if k < args.slots:
      mixed.generate(work[:k])
  cont_s, cont = _timed(mixed, work, args.repeats)
  cont_util = mixed.stats.slot_utilisation
  static_s = float("inf")
  for _ in range(args.repeats):
    start = time.perf_counter()
    static_tokens = static_capacity = 0
    for i in range(0, len(work), args.slots):
      mixed.reset_stats()
      mixed.generate(work[i:i + args.slots])  # a wave: nothing refills until all finish
      static_tokens += mixed.stats.tokens
      static_capacity += mixed.stats.slot_steps
    static_s = min(static_s, time.perf_counter() - start)
  tokens = int(budgets.sum())
  assert sum(o.num_tokens for o in cont) == tokens
  log(f"[mixed] {args.requests} requests, budgets {budgets.min()}..{budgets.max()} tokens "
      f"(mean {budgets.mean():.0f}), {args.slots} slots")
  log(f"[mixed] continuous: {cont_s:.2f} s = {tokens / cont_s:.0f} tokens/s, "
      f"slot utilisation {cont_util:.0%}")
  log(f"[mixed] static:     {static_s:.2f} s = {tokens / static_s:.0f} tokens/s, "
      f"slot utilisation {static_tokens / max(static_capacity, 1):.0%}")
  log(f"[mixed] RATIO continuous / static = {static_s / cont_s:.2f}x (goal >= 1.5x)")
  return {"continuous_over_static": round(static_s / cont_s, 3)}


if __name__ == "__main__":
  try:
    sys.exit(main())
  except hf_baseline.UsageError as e:
    print(f"sampler_bench: {e}", file=sys.stderr)
    sys.exit(2)
