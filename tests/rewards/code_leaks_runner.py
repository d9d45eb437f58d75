"""Judges a batch of programs at the same time; the leak tests' judge (code_leaks_test.py).

In the test process, or as its own process under another user (stdlib only besides
jaxrl_scale, so /usr/bin/python3 can run it as uid nobody):

  python code_leaks_runner.py REPO_ROOT < {"jobs": [...], "limits": {...}}

Each job is {"name", "program", "answer", "delay_s"}; "{JUDGE_PID}" in a program becomes
this process's pid. Prints {name: {"status", "detail"} or {"error"}} as one JSON line;
with no jobs, the sandbox's protections line ({"protections": line}).
"""

import concurrent.futures
import json
import os
import sys
import time

BASE_LIMITS = {"wall_s": 2.0, "total_wall_s": 4.0, "cpu_s": 1, "memory_mb": 256}


def run_jobs(jobs: list[dict], limits: dict) -> dict:
  from jaxrl_scale.rewards import code  # pylint: disable=g-import-not-at-top
  from jaxrl_scale.rewards import code_sandbox  # pylint: disable=g-import-not-at-top
  try:
    sandbox_limits = code_sandbox.Limits(**{**BASE_LIMITS, **limits})
  except TypeError as e:  # (a sandbox without that knob)
    return {job["name"]: {"error": f"TypeError: {e}"} for job in jobs}

  def one(job):
    time.sleep(job.get("delay_s", 0.0))
    program = job["program"].replace("{JUDGE_PID}", str(os.getpid()))
    try:
      verdict = code.judge(f"```python\n{program}\n```", job["answer"],
                           limits=sandbox_limits)
    except Exception as e:  # pylint: disable=broad-except  (what the judge raised: reported)
      return {"error": f"{type(e).__name__}: {e}"}
    return {"status": verdict.status, "detail": verdict.detail}

  with concurrent.futures.ThreadPoolExecutor(len(jobs)) as pool:
    return dict(zip([job["name"] for job in jobs], pool.map(one, jobs)))


if __name__ == "__main__":
  sys.path.insert(0, sys.argv[1])
  request = json.load(sys.stdin)
  if not request["jobs"]:
    from jaxrl_scale.rewards import code_sandbox as sandbox  # pylint: disable=g-import-not-at-top
    print(json.dumps({"protections": sandbox.protections(
        namespaces=request["limits"].get("namespaces", True))}), flush=True)
  else:
    print(json.dumps(run_jobs(request["jobs"], request["limits"])), flush=True)
