r"""Downstream benchmark evals: mean@k and unbiased pass@k of a policy on benchmark files.

  jaxrl-scale eval --model DIR --benchmark aime24.jsonl --benchmark lcb.jsonl:lcb \
      --samples 16 --k 1,4,16 [--json]

A benchmark file is a .jsonl / .parquet file of problems in one of two layouts, told
apart by the fields of its first row (`--task` forces one):

  code  a tests field (tests / input_output / public_test_cases): read by
        data/code_problems.py (LiveCodeBench, DeepCoder, APPS/TACO layouts as shipped)
        and scored by the sandboxed "code" reward (every test must pass).
  math  problem / question / prompt and answer (AIME-style): the answer is the ground
        truth as is, scored by the "math" reward.

Each problem gets n samples (per-sample seeds, so a problem's samples do not depend on
which other problems or benchmarks are in the run). With c of them correct, the
problem's pass@k is Chen et al. (2021)'s unbiased estimator 1 - C(n-c, k) / C(n, k)
(`pass_at_k`); the benchmark's pass@k is its mean over problems. mean@n is the fraction
of all samples that are correct (the paper's mean@16); it is also the unbiased mean@k
for every k <= n, so it is reported once.

Invalid samples (the verifier timed out or raised: no verdict, NaN reward) are left out,
as the validation eval of training (jaxrl_scale/eval.py) and training itself leave them
out, and reported separately ("invalid"): a problem's n is its samples with a verdict, and
a problem with fewer than k of them has no pass@k and is left out of that mean
("pass@k_problems" says over how many problems each is). Scored as wrong, a verifier that
fails under load would read as a weaker policy.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from jaxrl_scale import preempt
from jaxrl_scale.data import code_problems
from jaxrl_scale.data import records as records_lib
from jaxrl_scale.data import templates
from jaxrl_scale.errors import UserError
from jaxrl_scale.generation import records
from jaxrl_scale.rewards import scorer as scorer_lib

TASKS = ("math", "code")
# What code_problems reads: test cases, or assertion tests (HumanEval, MBPP, KodCode).
_CODE_FIELDS = ("tests", "input_output", "public_test_cases", "test_list", "entry_point",
                "test_info")
_MATH_PROMPT_FIELDS = ("problem", "question", "prompt")
_SEED_SALT = 0xD0_5EED  # keeps downstream seeds apart from training and validation seeds
_SCORE_CHUNK = 256  # samples per Scorer call (progress is printed between calls)


def pass_at_k(n: int, c: int, k: int) -> float:
  """Unbiased pass@k of one problem with c correct among n samples (Chen et al. 2021).

  1 - C(n-c, k) / C(n, k), computed as 1 - prod_{i=n-c+1}^{n} (1 - k / i) so that no
  binomial coefficient (huge for n in the hundreds) is ever formed.

  Args:
    n: samples drawn.
    c: correct samples, 0 <= c <= n.
    k: 1 <= k <= n.
  """
  if not 0 <= c <= n:
    raise ValueError(f"pass_at_k: need 0 <= c <= n, got c={c}, n={n}")
  if not 1 <= k <= n:
    raise ValueError(f"pass_at_k: need 1 <= k <= n, got k={k}, n={n}")
  if n - c < k:  # every k-subset holds a correct sample
    return 1.0
  return float(1.0 - np.prod(1.0 - k / np.arange(n - c + 1, n + 1, dtype=np.float64)))


@dataclasses.dataclass(frozen=True)
class Benchmark:
  """The problems of one benchmark file.

  Attributes:
    name: the name results are reported under (the file's stem unless given).
    path: the file.
    task: "math" or "code".
    records: records in the contract of jaxrl_scale.data.tasks (id, task, prompt, answer).
  """

  name: str
  path: str
  task: str
  records: list[dict[str, str]]


def parse_spec(spec: str) -> tuple[str, str]:
  """"PATH[:NAME]" -> (path, name); a path that exists as given is never split."""
  path, name = spec, ""
  if not os.path.exists(spec) and ":" in spec:
    path, _, name = spec.rpartition(":")
  name = name or os.path.splitext(os.path.basename(path))[0]
  if not path or not name or "/" in name:
    raise UserError(f"--benchmark {spec!r}: expected PATH or PATH:NAME")
  return path, name


def detect_task(row: Mapping[str, Any], origin: str) -> str:
  """"code" when the row has tests, "math" when it has a problem and an answer."""
  if any(row.get(f) not in (None, "", []) for f in _CODE_FIELDS):
    return "code"
  if "answer" in row and any(f in row for f in _MATH_PROMPT_FIELDS):
    return "math"
  fields = ", ".join(str(k) for k in row if k != "__row__") or "none"
  raise UserError(f"{origin}: unknown field layout (fields: {fields}); expected math "
                  f"({'/'.join(_MATH_PROMPT_FIELDS)} + answer) or code tests "
                  f"({'/'.join(_CODE_FIELDS)}); --task forces one")


def read_benchmark(spec: str, *, task: str | None = None, limit: int = 0) -> Benchmark:
  """Reads "PATH[:NAME]"; `task` None detects it from the first row; `limit` > 0 keeps
  the first `limit` problems."""
  path, name = parse_spec(spec)
  rows = records_lib.read_rows(path)  # UserError for a missing or unreadable file
  if not rows:
    raise UserError(f"{path}: no problems")
  if limit > 0:
    rows = rows[:limit]
  task = task or detect_task(rows[0], f"{path}: row {rows[0]['__row__']}")
  if task not in TASKS:
    raise UserError(f"--task {task!r}: expected one of {TASKS}")
  if task == "code":
    out = [code_problems.code_record(row, task="code", origin=path, row_index=row["__row__"])
           for row in rows]
  else:
    field = next((f for f in _MATH_PROMPT_FIELDS if f in rows[0]), _MATH_PROMPT_FIELDS[0])
    fields = records_lib.FieldMap(prompt_field=field, answer_field="answer", task="math",
                                  id_prefix=name)
    out = [records_lib.map_row(row, fields, origin=path, row_index=row["__row__"])
           for row in rows]
  first_row: dict[str, int] = {}
  for row, record in zip(rows, out):  # a problem's samples are keyed (and seeded) by its id
    if record["id"] in first_row:
      raise UserError(f"{path}: row {row['__row__']} repeats id {record['id']!r} of row "
                      f"{first_row[record['id']]}")
    first_row[record["id"]] = row["__row__"]
  return Benchmark(name=name, path=path, task=task, records=out)


def parse_ks(text: str | None, samples: int) -> list[int]:
  """"1,4,16" -> [1, 4, 16]; None -> [1, samples]; every k must be in [1, samples]."""
  if text is None:
    return sorted({1, samples})
  try:
    ks = sorted({int(part) for part in text.split(",") if part.strip()})
  except ValueError:
    raise UserError(f"--k {text!r}: expected comma-separated integers, e.g. 1,4,16") from None
  if not ks:
    raise UserError(f"--k {text!r}: no values")
  for k in ks:
    if k < 1:
      raise UserError(f"--k {k}: must be >= 1")
    if k > samples:
      raise UserError(f"--k {k}: larger than --samples {samples} (pass@k needs k <= n)")
  return ks


def summarize(bench: Benchmark, correct_PN: np.ndarray, ks: Sequence[int], *,
              counts: Mapping[str, int], truncated: int, tokens: int,
              judged_PN: np.ndarray | None = None) -> dict[str, Any]:
  """One benchmark's result from its per-sample correctness [problems, n] and which
  samples have a verdict (`judged_PN`; None: all)."""
  problems, n = correct_PN.shape
  judged_PN = np.ones_like(correct_PN, bool) if judged_PN is None else judged_PN
  correct_PN = correct_PN & judged_PN
  c_P, n_P = correct_PN.sum(axis=1), judged_PN.sum(axis=1)
  judged = int(n_P.sum())
  out: dict[str, Any] = {"name": bench.name, "path": bench.path, "task": bench.task,
                         "problems": problems, "samples_per_problem": n,
                         "samples": problems * n, "correct": int(c_P.sum()),
                         f"mean@{n}": float(c_P.sum() / judged) if judged else float("nan")}
  for k in ks:
    scored = [pass_at_k(int(m), int(c), k) for m, c in zip(n_P, c_P) if m >= k]
    out[f"pass@{k}"] = float(np.mean(scored)) if scored else float("nan")
    if len(scored) < problems:
      out[f"pass@{k}_problems"] = len(scored)
  out["invalid"] = counts["timeouts"] + counts["errors"]
  out["verdicts"] = {key: counts[key] for key in scorer_lib.COUNT_KEYS if key != "total"}
  out["truncated"] = truncated
  out["length_mean"] = tokens / max(problems * n, 1)
  return out


def prompt_ids(tokenizer: Any, bench: Benchmark, template: templates.PromptTemplate
               ) -> list[list[int]]:
  """The benchmark's prompts rendered (chat template when the tokenizer has one) and encoded."""
  texts = [templates.render(tokenizer, r["prompt"], template) for r in bench.records]
  ids = templates.encode_rendered(tokenizer, texts, template)
  for r, row_ids in zip(bench.records, ids):
    if not row_ids:
      raise UserError(f"{bench.path}: problem {r['id']!r} tokenizes to no tokens")
  return ids


def evaluate(generate: Callable[[list[records.Request]], list[records.Completion]],
             tokenizer: Any, benchmarks: Sequence[Benchmark], *, samples: int,
             ks: Sequence[int], temperature: float, seed: int = 0,
             template: templates.PromptTemplate = templates.PromptTemplate(),
             timeout_s: float = 5.0, num_threads: int = 4,
             progress: Callable[[str], None] | None = None,
             stop: preempt.StopRequest | None = None,
             episode_for: Callable[[Benchmark, Mapping[str, Any], list[int]], Any] | None = None,
             correct_reward: float = 1.0) -> list[dict[str, Any]]:
  """Samples `samples` completions per problem of every benchmark and scores them.

  Args:
    generate: requests -> completions in request order (e.g. `engine.Sampler.generate`).
    tokenizer: renders prompts and decodes completions for the verifiers.
    benchmarks: what to evaluate; all their requests go to `generate` in one call.
    samples: n per problem.
    ks: the k of pass@k, each in [1, samples].
    temperature: sampling temperature.
    seed: base of the per-sample seeds.
    template: how a problem becomes the prompt text.
    timeout_s: verifier deadline per sample (past it the sample is invalid).
    num_threads: verifier threads.
    progress: called with a progress line now and then.
    stop: a run's stop request: the scoring raises Interrupted within 0.1 s of it.
    episode_for: (benchmark, problem record, prompt ids) -> the problem's episode maker
      (`records.Request.episode`; its n samples share it): every sample is an episode of
      an environment (a tool, feedback). An episode whose environment gave a reward is
      scored by it: correct when the environment says so (`Completion.correct`), else
      when the reward reaches `correct_reward`; NaN is no verdict (invalid). The others'
      last model turn goes to the benchmark's verifier, as in training
      (`pipeline.rollouts`). None: single-turn completions.
    correct_reward: see `episode_for`.

  Returns:
    One `summarize` dict per benchmark, in order; with `episode_for` each also has
    turns_mean (model turns per sample) and env_stats (the episodes' counters, summed).
  """
  say = progress or (lambda _: None)
  base = (seed ^ _SEED_SALT) & 0x7FFFFFFF
  requests = []
  for bench in benchmarks:
    for r, ids in zip(bench.records, prompt_ids(tokenizer, bench, template)):
      key = f"{bench.name}/{r['id']}"  # the seed depends on the problem, not on its place
      episode = episode_for(bench, r, ids) if episode_for is not None else None
      requests.extend(records.Request(ids, prompt_id=key, sample_index=j,
                                      seed=records.sequence_seed(base, key, j),
                                      temperature=temperature, episode=episode)
                      for j in range(samples))
  completions = generate(requests)
  results, offset = [], 0
  for bench in benchmarks:
    size = len(bench.records) * samples
    mine = completions[offset:offset + size]
    offset += size
    correct, judged = np.zeros(size, bool), np.zeros(size, bool)
    counts = dict.fromkeys(scorer_lib.COUNT_KEYS, 0)
    verify = []  # samples for the verifier: all but those an environment scored
    for i, c in enumerate(mine):
      if c.reward is None:
        verify.append(i)
        continue
      counts["total"] += 1
      correct[i], key = scorer_lib.environment_verdict(c.reward, c.correct, correct_reward)
      judged[i] = key != "errors"
      counts[key] += 1
    # The last model turn (the whole completion of a single-turn sample): an episode's
    # earlier turns and its environment's tokens are history, not the answer.
    pairs = [(tokenizer.decode(mine[i].tokens[mine[i].answer_start:].tolist(),
                               skip_special_tokens=True),
              bench.records[i // samples]["answer"]) for i in verify]
    cut = [bool(mine[i].truncated) for i in verify]
    with scorer_lib.Scorer(bench.task, timeout_s=timeout_s, num_threads=num_threads) as scorer:
      for start in range(0, len(verify), _SCORE_CHUNK):
        result = scorer.score(pairs[start:start + _SCORE_CHUNK], cut[start:start + _SCORE_CHUNK],
                              stop=stop)
        for i, v in zip(verify[start:start + _SCORE_CHUNK], result.verdicts):
          judged[i], correct[i] = v is not None, v is not None and v.correct
        for key, value in result.counts.items():
          counts[key] += value
        say(f"{bench.name}: scored {start + len(result.verdicts)}/{len(verify)} samples")
    results.append(summarize(bench, correct.reshape(-1, samples), ks, counts=counts,
                             truncated=sum(bool(c.truncated) for c in mine),
                             tokens=sum(c.num_tokens for c in mine),
                             judged_PN=judged.reshape(-1, samples)))
    if episode_for is not None:
      stats: dict[str, float] = {}
      for c in mine:
        for key, value in c.env_stats.items():
          stats[key] = stats.get(key, 0) + value
      results[-1]["turns_mean"] = sum(c.turns for c in mine) / max(size, 1)
      results[-1]["env_stats"] = stats
  return results


def format_result(result: Mapping[str, Any]) -> str:
  """Two lines for a person: the scores, then what the verifier said."""
  n = result["samples_per_problem"]
  scores = "  ".join(
      f"{key} {result[key]:.4f}" + (f" (of {result[key + '_problems']} problems)"
                                    if key + "_problems" in result else "")
      for key in result if key.startswith(("mean@", "pass@")) and not key.endswith("_problems"))
  verdicts = ", ".join(f"{k} {v}" for k, v in result["verdicts"].items())
  episodes = ""
  if "turns_mean" in result:  # an environment's episodes
    # (Counters of the episodes that reached their environment: "turns" is left out, the
    # mean over every sample stands before it.)
    stats = ", ".join(f"{k} {v:.4g}" for k, v in sorted(result["env_stats"].items())
                      if v and k != "turns")
    episodes = (f"\n  episodes: {result['turns_mean']:.2f} model turns per sample"
                + (f"; {stats}" if stats else ""))
  return (f"{result['name']} ({result['task']}, {result['problems']} problems x {n} "
          f"samples): {scores}\n  verdicts: {verdicts}; invalid {result['invalid']}; "
          f"truncated {result['truncated']}; mean length {result['length_mean']:.1f} tokens"
          + episodes)
