"""The "python_tool" environment: the policy runs Python in the code sandbox and reads
the output.

Tool-call format: a turn calls the tool with a block

  <python>
  print(123 * 4567)
  </python>

(the last closed block of the turn). The program runs in the code sandbox
(rewards/code_sandbox.py `run_python`: an OS-isolated child with no network, its own
work dir and scrubbed environment, never in this process) within the episode's tool
time limits. Its stdout (trailing whitespace dropped), and on an error the traceback's
end, come back as one message of role `role` (default "tool"), cut to
`Limits.tool_output_chars`, and the policy writes its next turn. A turn without a tool
call ends the episode, and the task's verifier scores that turn
(`EnvStep(done=True, reward=None)`), as for a single-turn completion.
A turn ends at "</python>" (the environment's stop string: `generate --env` adds it, and a
training run's `sampler.stop_strings` must hold it), so the policy reads the real output
instead of imagining one.

Counters: tool_calls; tool_timeouts (the call's wall or CPU limit); tool_errors (a
non-zero exit, an exception, a sandbox that failed to start); tool_s (wall seconds of
the calls).
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Callable
from typing import Any

from jaxrl_scale.envs import base
from jaxrl_scale.envs import registry
from jaxrl_scale.generation import records
from jaxrl_scale.rewards import code_sandbox

TOOL_RE = re.compile(r"<python>(.*?)</python>", re.DOTALL)
_TRACEBACK_LINES = 6  # a traceback's last lines: the program's frames and the error


def tool_call(text: str) -> str | None:
  """The program of the last closed <python>...</python> block of `text`, else None."""
  blocks = TOOL_RE.findall(text)
  return blocks[-1] if blocks and blocks[-1].strip() else None


def tool_output(run: code_sandbox.Run, seconds: float, clip: Callable[..., str]) -> str:
  """What the policy reads back from one sandboxed run (`clip` cuts long text)."""
  parts = [clip(run.stdout.decode("utf-8", "replace").rstrip())]
  if run.status == "timeout":
    parts.append(f"[timed out after {seconds:g}s]")
  elif run.status == "output_limit":
    parts.append("[output cut: too long]")
  elif run.status == "runtime_error":
    lines = [ln for ln in run.stderr.splitlines() if ln.strip()]
    # The program's own frames on: the sandbox's bootstrap frames are not its business.
    first = next((i for i, ln in enumerate(lines) if 'File "prog.py"' in ln), None)
    keep = lines[max(len(lines) - (1 if first is None else _TRACEBACK_LINES), first or 0, 0):]
    head = [] if first is None else ["Traceback (most recent call last):"]
    parts.append(clip("\n".join(head + keep), tail=True))  # the error is at the end
  return "\n".join(p for p in parts if p) or "[no output]"


class PythonTool(base.EpisodeBase):
  """One episode of the Python tool (see the module docstring)."""

  def __init__(self, ctx: base.EnvContext, *, role: str = "tool", memory_mb: int = 512,
               template_kwargs: dict[str, Any] | None = None):
    super().__init__(ctx, template_kwargs)
    self.role = role
    self.memory_mb = memory_mb
    self.chat.check(role)

  def act(self, turn: records.Turn) -> records.EnvStep:
    program = tool_call(self.text(turn))
    if program is None:
      return self.end()  # the answer: the task's verifier scores this turn
    if self.turns_left(turn) <= 0:
      return self.end(limit="turns")
    left = self.limits.tool_episode_s - self.counts["tool_s"]
    if left <= 0:
      return self.end(limit="tool_s")
    output = self.run(program, min(self.limits.tool_call_s, left))
    return self.reply(turn, [{"role": self.role, "content": output}])

  def run(self, program: str, seconds: float) -> str:
    """Runs `program` in the sandbox for at most `seconds`; never raises."""
    limits = code_sandbox.Limits(
        wall_s=seconds, total_wall_s=seconds, cpu_s=max(1, math.ceil(seconds)),
        memory_mb=self.memory_mb,
        output_bytes=max(1 << 16, 4 * self.limits.tool_output_chars))
    self.counts["tool_calls"] += 1
    start = time.monotonic()
    try:
      run = code_sandbox.run_python(program, limits, single_stdin="")
    except Exception as e:  # noqa: BLE001 - SandboxError and the like: the call failed
      self.counts["tool_errors"] += 1
      return f"[the tool failed to run: {type(e).__name__}]"
    finally:
      self.counts["tool_s"] += time.monotonic() - start
    if run.status == "timeout":
      self.counts["tool_timeouts"] += 1
    elif run.status == "runtime_error":
      self.counts["tool_errors"] += 1
    return tool_output(run, seconds, self.clip)


@registry.register_env("python_tool", stop_strings=("</python>",))
def python_tool(ctx: base.EnvContext, *, role: str = "tool", memory_mb: int = 512,
                template_kwargs: dict[str, Any] | None = None) -> PythonTool:
  """The Python tool.

  Args:
    ctx: the episode's context.
    role: the role of tool messages in the chat template ("tool"; Llama 3: "ipython";
      "user" for a template without a tool role).
    memory_mb: the program's address space (the sandbox's RLIMIT_AS).
    template_kwargs: extra chat-template variables.

  Returns:
    A new episode.
  """
  return PythonTool(ctx, role=role, memory_mb=memory_mb, template_kwargs=template_kwargs)
