"""Side by side with Tunix and TRL on the same Hugging Face checkpoint: sampling, GRPO step.

    python benchmarks/peers/peers.py                        # a random Qwen3, written locally
    python benchmarks/peers/peers.py --model DIR --json benchmarks/results/peers_cpu_X.json
    python benchmarks/peers/peers.py --quick                # tiny shapes, a smoke run
    python benchmarks/peers/peers.py --peers trl            # one peer only

Installs nothing: each peer runs in `--peers-python` (default $JAXRL_PEERS_PYTHON, else
/work/peers-venv/bin/python; `pip install -e .[peers]` there brings google-tunix and trl)
when that Python can import it, else it is reported absent in one line. Each side runs in
its own process (`peer_sides.py`, one JSON object a line), and the timed calls alternate
ours, Tunix, TRL, ours, Tunix, TRL (`--rounds`), so only one side computes at a time and
all see the same drift of a shared machine's load. Every call is preceded by one untimed
warm-up call of the same shape (compiles).

Sampling (greedy, float32): generated tokens per second of the library call, at each
`--batches` size, with
  uniform lengths: `batch` prompts of `--prompt-len` ids, EOS off, `--new` tokens each
    (Tunix's best case: its static batch has no idle rows);
  RL lengths: `--rl-waves` x `batch` prompts of 16..prompt-len ids, EOS on, `--new` the cap.
    A random model's greedy text is near-uniform over the vocabulary, so the EOS is a set
    of `vocab / --eos-every` ids (drawn once, seed 0): a completion ends at each token with
    chance ~1/eos-every, the long-tailed, capped lengths of an RL batch.
and the fraction of greedy tokens that agree between the sides (`agreement`). At uniform
lengths each round also times the floor (`sampler_bench.floor_program`: the call's weight
matmuls alone, no attention or cache) and prints each side's share of it (`of_floor`):
a ratio against a peer can be no larger than the floor over the peer's rate.

Train step: `--train-steps` GRPO updates (clip 0.2, no KL, sample average, AdamW lr
`--lr`, eps 1e-15, decay 0.01 on matrices) on one batch of `--train-prompts` x
`--train-group` completions of mixed lengths with recorded log-probs drawn in [-4, -0.5]
(so the clip is active), from the checkpoint's weights on both sides: seconds per step
after the first (compile) and the losses step by step.

TRL's side is its path without vLLM: transformers' `generate` as GRPOTrainer calls it, and
GRPOTrainer's own `compute_loss` (loss "grpo") with backward and the trainer's optimizer.

The whole loop (our `train` against Tunix's GRPOLearner and TRL's GRPOTrainer) is
`loop_compare.py`. Each comparison prints what is not equal between the sides.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if ROOT not in sys.path:
  sys.path.insert(0, ROOT)

import numpy as np  # noqa: E402

SIDES_PY = os.path.join(os.path.dirname(os.path.abspath(__file__)), "peer_sides.py")
DEFAULT_PEERS_PYTHON = "/work/peers-venv/bin/python"

# The random checkpoint: Qwen3-shaped, small enough for a CPU run of a few minutes. An
# initializer range of 0.08 (transformers' default 0.02 gives a model whose greedy text
# repeats one token forever) makes greedy text varied, so agreement means something.
SHAPE = dict(vocab_size=32768, hidden_size=512, intermediate_size=1536, num_hidden_layers=8,
             num_attention_heads=8, num_key_value_heads=4, head_dim=64,
             max_position_embeddings=1024, tie_word_embeddings=True, rope_theta=1000000.0,
             bos_token_id=1, eos_token_id=2, pad_token_id=0, initializer_range=0.08)
QUICK_SHAPE = dict(SHAPE, vocab_size=1024, hidden_size=64, intermediate_size=128,
                   num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
                   head_dim=32, max_position_embeddings=256)

# Differences between the sides that the numbers carry (printed with each comparison).
SAMPLE_UNEQUAL = {
    "tunix": (
        "Tunix's sampler takes text: ids go through a whitespace 'tokenizer' (ids written "
        "out), inside its timed call",
        "Tunix runs the requests in static batches of `batch` rows, each decoding until all "
        "its rows end or the cap; ours keeps `batch` slots busy (continuous batching)",
        "Tunix left-pads every prompt to the largest bucket (prompt-len); ours pads each "
        "prompt to its own bucket (16/32/64...)",
        "ours records per-token logprobs and policy versions (an RL rollout's); Tunix's call "
        "returns tokens only",
        "ours: paged KV cache, decode_chunk steps per jitted call; Tunix: dense KV cache of "
        "prompt-len + cap, one while_loop",
    ),
    "trl": (
        "TRL: transformers' generate in eager PyTorch (CPU torch, its default threads), as "
        "GRPOTrainer calls it without vLLM (disable_compile, default dynamic KV cache); "
        "ours: XLA-compiled JAX",
        "TRL runs the requests in static batches of `batch` rows (GRPOTrainer generates its "
        "whole generation batch in one call), each decoding until all its rows end or the "
        "cap; ours keeps `batch` slots busy (continuous batching)",
        "TRL left-pads each batch to its longest prompt; ours pads each prompt to its own "
        "bucket",
        "TRL's call returns tokens only (GRPOTrainer without vLLM recomputes log-probs in a "
        "forward pass later, not timed here); ours records per-token logprobs",
        "greedy here (do_sample off); GRPOTrainer samples at temperature 1",
    ),
}
TRAIN_UNEQUAL = {
    "tunix": (
        "ours: rl.train_step.Trainer (float32 masters, jitted step, NaN skip, diagnostics); "
        "Tunix: tunix.rl.trainer.Trainer + its registered 'grpo' loss, not its "
        "GRPOLearner's rollout/advantage orchestration",
        "batch layout: ours prompt+completion packed from position 0; Tunix left-padded "
        "prompts and right-padded completions (positions from the mask)",
        "remat: none on both (Tunix's default; ours defaults to full in a run)",
    ),
    "trl": (
        "TRL: GRPOTrainer.compute_loss (loss_type 'grpo', beta 0, epsilon 0.2), backward and "
        "the trainer's torch AdamW, in eager PyTorch, outside Trainer's loop (no dataloader, "
        "no generation, no reward); ours: one jitted step",
        "TRL's loss also computes per-token entropies and logs clip fractions (host syncs), "
        "as it does in every step; ours computes its diagnostics in the jitted step",
        "settings moved off TRL's defaults to match ours: bf16 off (default on), "
        "max_grad_norm None (default 1.0), loss_type grpo (default dapo), beta 0, "
        "adam_epsilon 1e-15 (default 1e-8), constant rate (default linear decay)",
        "batch layout: TRL left-padded prompts and right-padded completions to prompt-len and "
        "the cap, positions from the mask; ours packed from position 0",
        "gradient checkpointing off on both (TRL's default; ours defaults to full in a run)",
    ),
}


def parse_args(argv=None) -> argparse.Namespace:
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--model", default=None,
                 help="Hugging Face Qwen3 directory (default: a random one written to "
                      "--cache)")
  p.add_argument("--cache", default="/tmp/jaxrl_peers", help="where the random checkpoint goes")
  p.add_argument("--peers-python", default=os.environ.get("JAXRL_PEERS_PYTHON",
                                                          DEFAULT_PEERS_PYTHON))
  p.add_argument("--batches", default="16,64", help="concurrent sequences, comma-separated")
  p.add_argument("--prompt-len", type=int, default=64)
  p.add_argument("--new", type=int, default=128, help="new tokens (uniform) / the cap (RL)")
  p.add_argument("--rl-waves", type=int, default=3, help="RL lengths: prompts = waves x batch")
  p.add_argument("--eos-every", type=int, default=48,
                 help="RL lengths: 1 of this many vocab ids ends a completion")
  p.add_argument("--decode-chunk", type=int, default=16, help="our sampler's decode_chunk")
  p.add_argument("--rounds", type=int, default=2, help="timed calls per side (alternating)")
  p.add_argument("--train-prompts", type=int, default=2)
  p.add_argument("--train-group", type=int, default=4)
  p.add_argument("--train-steps", type=int, default=3)
  p.add_argument("--lr", type=float, default=1e-4)
  p.add_argument("--peers", default="tunix,trl", help="peer sides to run, comma-separated")
  p.add_argument("--skip-sample", action="store_true")
  p.add_argument("--skip-train", action="store_true")
  p.add_argument("--no-floor", action="store_true",
                 help="uniform lengths: skip timing the weight matmuls alone (the floor)")
  p.add_argument("--note", default="", help="recorded in the JSON (e.g. the machine's load)")
  p.add_argument("--json", default=None, help="write the result here")
  p.add_argument("--quick", action="store_true", help="tiny model and shapes (smoke run)")
  args = p.parse_args(argv)
  if args.quick:
    args.batches, args.prompt_len, args.new, args.rl_waves = "4", 16, 8, 2
    args.eos_every, args.rounds, args.train_steps = 4, 1, 2
    args.train_prompts, args.train_group = 1, 2
  args.batch_sizes = [int(b) for b in args.batches.split(",") if b.strip()]
  args.peer_names = [x.strip() for x in args.peers.split(",") if x.strip()]
  if set(args.peer_names) - {"tunix", "trl"}:
    p.error(f"--peers: tunix and/or trl, not {args.peers}")
  if not args.batch_sizes or min(args.batch_sizes) < 1 or args.rounds < 1:
    p.error("--batches needs sizes >= 1 and --rounds >= 1")
  if args.prompt_len < 16:
    p.error("--prompt-len must be >= 16 (the smallest prompt bucket)")
  return args


# ------------------------------------------------------------------------ the computations


def agreement(a: list[list[int]], b: list[list[int]]) -> dict:
  """Greedy agreement of two sides' completions of the same prompts: `tokens`, matching
  positions over the longer completion's length summed over rows (a position only one
  side generated disagrees); `rows`, the fraction of rows identical; `first_diff`, the
  median index of a row's first disagreement (its length where none)."""
  if len(a) != len(b):
    raise ValueError(f"{len(a)} rows against {len(b)}")
  same = total = identical = 0
  firsts = []
  for x, y in zip(a, b):
    n = min(len(x), len(y))
    eq = [u == v for u, v in zip(x[:n], y[:n])]
    same += sum(eq)
    total += max(len(x), len(y))
    identical += int(len(x) == len(y) and all(eq))
    firsts.append(eq.index(False) if False in eq else n)
  return {"tokens": same / total if total else 1.0, "rows": identical / len(a) if a else 1.0,
          "first_diff": statistics.median(firsts) if firsts else 0}


def ratios(ours: list[float], theirs: list[float]) -> dict:
  """Ours over theirs for rates (higher is better): of the medians, and round by round
  (call i of ours against call i of theirs, taken next to each other)."""
  pairs = [o / t for o, t in zip(ours, theirs) if t > 0]
  return {"median": statistics.median(ours) / statistics.median(theirs),
          "per_round": pairs}


def mark_eos(tokens: list[list[int]], eos) -> list[list[int]]:
  """A completion's final EOS written as -1, as the Tunix side writes it (Tunix drops the
  EOS it stopped at without saying which id it was)."""
  eos = set(eos)
  return [t[:-1] + [-1] if t and t[-1] in eos else t for t in tokens]


def lengths_summary(tokens: list[list[int]], cap: int) -> dict:
  n = [len(t) for t in tokens]
  return {"mean": float(np.mean(n)), "min": min(n), "max": max(n),
          "capped": sum(x >= cap for x in n) / len(n)}


def sample_workloads(vocab: int, args) -> list[dict]:
  """The prompts of each comparison, ids in [3, vocab) (0 is Tunix's pad), drawn in this
  order from one seed-0 stream: they depend on --batches (both sides get the same ones)."""
  rng = np.random.default_rng(0)
  eos_rng = np.random.default_rng(1)
  eos = sorted(eos_rng.choice(np.arange(3, vocab), size=max(1, vocab // args.eos_every),
                              replace=False).tolist())
  buckets = [b for b in (16, 32, 64, 128, 256, 512, 1024, 2048) if b < args.prompt_len]
  buckets.append(args.prompt_len)
  out = []
  for batch in args.batch_sizes:
    out.append(dict(name=f"uniform_b{batch}", kind="uniform", batch=batch, eos=[],
                    buckets=[args.prompt_len],
                    prompts=rng.integers(3, vocab, (batch, args.prompt_len)).tolist()))
  for batch in args.batch_sizes:
    n = args.rl_waves * batch
    lens = rng.integers(16, args.prompt_len + 1, n)
    prompts = [rng.integers(3, vocab, int(k)).tolist() for k in lens]
    prompts = [[t for t in p if t not in eos] or [3] for p in prompts]
    out.append(dict(name=f"rl_b{batch}", kind="rl", batch=batch, eos=eos, buckets=buckets,
                    prompts=prompts))
  return out


def train_batch(vocab: int, args) -> dict:
  """One GRPO batch (seed 2): mixed prompt and completion lengths, advantages N(0, 1)."""
  rng = np.random.default_rng(2)
  lp, lc, g = args.prompt_len, args.new, args.train_group
  prompts = [rng.integers(3, vocab, int(rng.integers(16, lp + 1))).tolist()
             for _ in range(args.train_prompts)]
  comps = [[rng.integers(3, vocab, int(rng.integers(max(1, lc // 8), lc + 1))).tolist()
            for _ in range(g)] for _ in prompts]
  logp = [[np.round(-rng.uniform(0.5, 4.0, len(c)), 6).tolist() for c in cs] for cs in comps]
  adv = np.round(rng.normal(size=(len(prompts), g)), 6).tolist()
  return dict(prompts=prompts, completions=comps, gen_logp=logp, advantages=adv,
              prompt_len=lp, completion_len=lc)


# ------------------------------------------------------------------------------ the sides


class Side:
  """A `peer_sides.py` process: `call(cmd, **args)` sends one request, returns the answer."""

  def __init__(self, name: str, python: str):
    self.name, self.python = name, python
    self.proc = None
    self.absent: str | None = None
    self.versions: dict = {}
    self.packages: dict = {}
    if not os.path.exists(python):
      self.absent = f"no Python at {python} (set --peers-python or JAXRL_PEERS_PYTHON)"
      return
    env = dict(os.environ, JAX_PLATFORMS=os.environ.get("JAX_PLATFORMS", "cpu"),
               PYTHONUNBUFFERED="1", TF_CPP_MIN_LOG_LEVEL="3")
    env.pop("XLA_FLAGS", None)  # one device per side, whatever the caller simulates
    self.log = open(os.path.join(os.environ.get("TMPDIR", "/tmp"),
                                 f"peers_{name}_{os.getpid()}.log"), "w")
    self.proc = subprocess.Popen([python, SIDES_PY, name], stdin=subprocess.PIPE,
                                 stdout=subprocess.PIPE, stderr=self.log, text=True, env=env)
    hello = self.call("hello")
    if not hello.get("ok"):
      self.absent = hello.get("error", "no answer")
    else:
      self.versions, self.absent = hello["versions"], hello.get("absent")
      self.packages = {"python": hello.get("python"), **hello.get("packages", {})}
    if self.absent:
      self.close()

  def call(self, cmd: str, **req) -> dict:
    if self.proc is None:
      return {"ok": False, "error": self.absent or "not running"}
    self.proc.stdin.write(json.dumps(dict(req, cmd=cmd)) + "\n")
    self.proc.stdin.flush()
    line = self.proc.stdout.readline()
    if not line:
      return {"ok": False, "error": f"the {self.name} process ended (exit "
                                    f"{self.proc.wait()}; its log: {self.log.name})"}
    return json.loads(line)

  def must(self, cmd: str, **req) -> dict:
    ans = self.call(cmd, **req)
    if not ans.get("ok"):
      raise RuntimeError(f"{self.name} {cmd}: {ans.get('error')}")
    return ans

  def close(self) -> None:
    if self.proc is not None:
      self.proc.stdin.close()
      self.proc.wait(timeout=60)
      self.proc = None


def compare_sampling(sides: dict, work: dict, args, log) -> dict:
  """Warm-up, then `rounds` alternating timed calls of each side on the same prompts."""
  req = dict(prompts=work["prompts"], max_new=args.new, eos=work["eos"], slots=work["batch"],
             buckets=work["buckets"])
  extra = {"ours": {"decode_chunk": args.decode_chunk}}
  runs = {n: [] for n in sides}
  tokens = {}
  for name, side in sides.items():
    side.must("sample", **req, **extra.get(name, {}))  # compiles
  # Uniform lengths: the same call's weight matmuls alone (`sampler_bench.floor_program`), in
  # our process, timed in each round beside the sides.
  floor = work["kind"] == "uniform" and not args.no_floor
  floor_req = dict(rows=work["batch"], prompt_len=args.prompt_len, steps=args.new)
  if floor:
    sides["ours"].must("floor", **floor_req)  # compiles
    runs["floor"] = []
  for r in range(args.rounds):
    if floor:
      ans = sides["ours"].must("floor", **floor_req)
      runs["floor"].append({"seconds": ans["seconds"], "tokens": ans["tokens"],
                            "tok_s": ans["tokens"] / ans["seconds"]})
      log(f"  {work['name']} round {r + 1} floor (the weight matmuls alone): "
          f"{ans['tokens']} tokens in {ans['seconds']:.2f} s = "
          f"{ans['tokens'] / ans['seconds']:.1f} tok/s")
    for name, side in sides.items():
      ans = side.must("sample", **req, **extra.get(name, {}))
      ans["tokens"] = mark_eos(ans["tokens"], work["eos"])
      n = sum(len(t) for t in ans["tokens"])
      runs[name].append({"seconds": ans["seconds"], "tokens": n,
                         "tok_s": n / ans["seconds"]})
      tokens[name] = ans["tokens"]
      log(f"  {work['name']} round {r + 1} {name}: {n} tokens in {ans['seconds']:.2f} s = "
          f"{n / ans['seconds']:.1f} tok/s")
  res = {"name": work["name"], "kind": work["kind"], "batch": work["batch"],
         "prompts": len(work["prompts"]), "eos_ids": len(work["eos"]), "runs": runs,
         "lengths": {n: lengths_summary(t, args.new) for n, t in tokens.items()},
         "vs": {}}
  if floor:
    # Each side's share of the floor: 1.5x a peer needs ours at 1.5x the peer's share.
    res["of_floor"] = {n: ratios([x["tok_s"] for x in runs[n]],
                                 [x["tok_s"] for x in runs["floor"]])
                       for n in sides}
  for peer in sides:
    if peer != "ours":
      res["vs"][peer] = {"ratio": ratios([x["tok_s"] for x in runs["ours"]],
                                         [x["tok_s"] for x in runs[peer]]),
                         "agreement": agreement(tokens["ours"], tokens[peer])}
  return res


def compare_train(sides: dict, batch: dict, args, log) -> dict:
  runs = {n: [] for n in sides}
  for r in range(args.rounds):
    for name, side in sides.items():
      ans = side.must("train", batch=batch, steps=args.train_steps, lr=args.lr)
      runs[name].append(ans)
      log(f"  train round {r + 1} {name}: losses "
          f"{', '.join(f'{x:.7g}' for x in ans['losses'])}; seconds "
          f"{', '.join(f'{x:.2f}' for x in ans['seconds'])}")
  step_s = {n: [s for a in v for s in a["seconds"][1:]] for n, v in runs.items()}
  res = {"rows": len(batch["prompts"]) * args.train_group,
         "seq_len": batch["prompt_len"] + batch["completion_len"],
         "completion_tokens": sum(len(c) for cs in batch["completions"] for c in cs),
         "runs": runs, "median_step_s": {n: statistics.median(s) if s else None
                                         for n, s in step_s.items()}}
  res["vs"] = {peer: compare_steps(step_s["ours"], step_s[peer], runs["ours"][0]["losses"],
                                   runs[peer][0]["losses"])
               for peer in runs if peer != "ours" and step_s["ours"] and step_s[peer]}
  return res


def compare_steps(ours_s: list[float], theirs_s: list[float], ours_loss: list[float],
                  theirs_loss: list[float]) -> dict:
  """Steps per second ours over theirs (a rate is 1 / seconds: their seconds over ours) and
  the losses' relative difference step by step."""
  return {"ratio": ratios([1 / s for s in ours_s], [1 / s for s in theirs_s]),
          "loss_rel_diff": [abs(x - y) / max(abs(x), abs(y), 1e-12)
                            for x, y in zip(ours_loss, theirs_loss)]}


# ------------------------------------------------------------------------------- the run


def checkpoint(args, log) -> str:
  if args.model:
    return args.model
  shape = QUICK_SHAPE if args.quick else SHAPE
  path = os.path.join(args.cache, "qwen3_" + "_".join(
      str(shape[k]) for k in ("num_hidden_layers", "hidden_size", "vocab_size")) + "_f32")
  if not os.path.isdir(path):
    from benchmarks.common import random_checkpoint  # pylint: disable=g-import-not-at-top
    os.makedirs(args.cache, exist_ok=True)
    log(f"=== writing a random Qwen3 checkpoint to {path}: "
        f"{random_checkpoint.write_qwen3(path, 'float32', **shape)}")
  return path


def machine() -> dict:
  try:
    load = os.getloadavg()
  except OSError:
    load = None
  commit = subprocess.run(["git", "-C", ROOT, "rev-parse", "HEAD"], capture_output=True,
                          text=True).stdout.strip()
  return {"platform": platform.platform(), "processor": platform.processor(),
          "cpu_cores": os.cpu_count(), "load_avg_at_start": load, "git_commit": commit,
          "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}


def run(args, log=print) -> dict:
  result = {"machine": machine(), "note": args.note, "args": {
      k: v for k, v in vars(args).items() if k not in ("json",)}}
  model = checkpoint(args, log)
  with open(os.path.join(model, "config.json")) as f:
    hf = json.load(f)
  result["model"] = {"path": model, **{k: hf.get(k) for k in (
      "num_hidden_layers", "hidden_size", "intermediate_size", "vocab_size",
      "num_attention_heads", "num_key_value_heads", "head_dim", "torch_dtype", "dtype")}}
  sides = {"ours": Side("ours", sys.executable)}
  if sides["ours"].absent:
    raise RuntimeError(f"ours: {sides['ours'].absent}")
  result["absent"] = {}
  for peer in args.peer_names:
    side = Side(peer, args.peers_python)
    if side.absent:
      result["absent"][peer] = side.absent
      log(f"{peer}: absent ({side.absent})")
    else:
      sides[peer] = side
  result["versions"] = {n: s.versions for n, s in sides.items()}
  # Every package of each Python (the peers share one venv: recorded once per Python).
  result["packages"] = {s.packages["python"]: s.packages for s in sides.values()}
  try:
    result["loaded"] = {n: side.must("load", model=model) for n, side in sides.items()}
    if not args.skip_sample:
      result["sampling"] = []
      for work in sample_workloads(hf["vocab_size"], args):
        eos = f"{len(work['eos'])} EOS ids" if work["eos"] else "EOS off"
        log(f"=== sampling {work['name']}: {len(work['prompts'])} prompts, batch "
            f"{work['batch']}, {eos}, {args.new} new tokens{' (cap)' if work['eos'] else ''}")
        result["sampling"].append(compare_sampling(sides, work, args, log))
      result["sampling_unequal"] = {n: list(SAMPLE_UNEQUAL[n]) for n in sides if n != "ours"}
    if not args.skip_train:
      log(f"=== train step: {args.train_prompts} x {args.train_group} rows, "
          f"{args.train_steps} steps a call")
      result["train"] = compare_train(sides, train_batch(hf["vocab_size"], args), args, log)
      result["train_unequal"] = {n: list(TRAIN_UNEQUAL[n]) for n in sides if n != "ours"}
  finally:
    for side in sides.values():
      side.close()
  return result


def render(res: dict) -> str:
  lines = [f"checkpoint: {res['model']['path']} ({res['model']['num_hidden_layers']} layers, "
           f"hidden {res['model']['hidden_size']}, vocab {res['model']['vocab_size']})"]
  for name, why in res.get("absent", {}).items():
    lines.append(f"{name}: absent ({why})")
  for s in res.get("sampling", []):
    med = {n: statistics.median(x["tok_s"] for x in v) for n, v in s["runs"].items()}
    lines.append(f"sampling {s['name']:<12} " + ", ".join(
        f"{n} {v:.1f} tok/s" for n, v in med.items()))
    if "of_floor" in s:
      lines.append("    of the floor (the weight matmuls alone, same run): " + ", ".join(
          f"{n} {v['median']:.0%}" for n, v in s["of_floor"].items()) + "; a sampler at "
          "the floor would be " + ", ".join(
              f"{1 / v['median']:.2f}x {n}" for n, v in s["of_floor"].items() if n != "ours"))
    for peer, vs in s.get("vs", {}).items():
      lines.append(f"    ours/{peer} {vs['ratio']['median']:.2f}x (rounds: "
                   f"{', '.join(f'{r:.2f}' for r in vs['ratio']['per_round'])}); greedy "
                   f"tokens agree {vs['agreement']['tokens']:.1%}, rows identical "
                   f"{vs['agreement']['rows']:.0%}")
    lines.append("    lengths: " + "; ".join(
        f"{n} mean {v['mean']:.1f} max {v['max']} capped {v['capped']:.0%}"
        for n, v in s["lengths"].items()))
  for peer, why in res.get("sampling_unequal", {}).items():
    lines += [f"  sampling, not equal between ours and {peer}:"] + [f"    - {x}" for x in why]
  t = res.get("train")
  if t:
    lines.append(f"train step ({t['rows']} rows x {t['seq_len']}): " + ", ".join(
        f"{n} {v:.2f} s" for n, v in t["median_step_s"].items() if v is not None))
    for peer, vs in t.get("vs", {}).items():
      lines.append(f"    ours/{peer} {vs['ratio']['median']:.2f}x steps/s (rounds: "
                   f"{', '.join(f'{r:.2f}' for r in vs['ratio']['per_round'])}); loss "
                   f"relative difference by step "
                   f"{', '.join(f'{d:.1e}' for d in vs['loss_rel_diff'])}")
  for peer, why in res.get("train_unequal", {}).items():
    lines += [f"  train step, not equal between ours and {peer}:"] + [f"    - {x}" for x in why]
  return "\n".join(lines)


def main(argv=None) -> int:
  return run_main("peers", parse_args, run, render, argv)


def run_main(prog: str, parse, run_fn, render_fn, argv=None) -> int:
  """A comparison's command line (this file's, loop_compare.py's): parse, run (a
  RuntimeError is one line on stderr), print the rendering, write `--json`."""
  args = parse(argv)
  start = time.perf_counter()
  try:
    res = run_fn(args, log=lambda m: print(m, flush=True))
  except RuntimeError as e:
    print(f"{prog}: {e}", file=sys.stderr)
    return 1
  res["wall_s"] = round(time.perf_counter() - start, 1)
  res["machine"]["load_avg_at_end"] = os.getloadavg()
  print(render_fn(res))
  if args.json:
    with open(args.json, "w") as f:
      json.dump(res, f, indent=1)
      f.write("\n")
    print(f"wrote {args.json}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
