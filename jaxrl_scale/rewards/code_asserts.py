"""Assertion tests: the program and the tests in two sandboxed processes, calls relayed.

  status, detail = code_asserts.judge(program, test_code, entry_point, limits)

The answer `{"test_code": SOURCE, "entry_point": NAME}` (HumanEval's `check(candidate)`,
MBPP's asserts, KodCode's pytest-style `test_*` functions) is checked without the expected
values ever entering the program's process: the program runs in one sandboxed process
("serve", code_child_asserts.py), the tests in another ("check"), and this process relays
each call the tests make (arguments, then the result) between them, as plain data only.
A program that returns an object whose `==` says yes to everything returns a TypeError;
one that exits early or prints "passed" has no say in the verdict: only the tests'
process ends with one.

Statuses: "pass" (the tests ran to their end), "wrong" (an assertion, or any other error
of the tests, on the program's results; the output cap), "runtime_error" (a call raised in
the program, it ended while called, or it wrote marks of its own), "timeout" (a call past
`limits.wall_s`, or everything past `limits.total_wall_s`). Tests that end without a
verdict, a sandbox that did not come up, or a kill from outside raise SandboxError: none
is the program's fault.
"""

from __future__ import annotations

import math
import os
import secrets
import selectors
import signal
import time

from jaxrl_scale.rewards import code_sandbox

_ENDED = b'error ["RuntimeError", "the program ended"]\n'


def judge(program: str, test_code: str, entry_point: str,
          limits: code_sandbox.Limits) -> tuple[str, str]:
  """Runs `test_code` against `program`'s `entry_point`: (status, detail)."""
  python = limits.python or code_sandbox.default_python()
  with code_sandbox.slots(python, 2, limits.namespaces) as (
      (server, uid_p, home_p), (_, uid_c, home_c)):
    children, writers, relay = [], [], None
    try:
      for uid, home, source, mode in ((uid_p, home_p, program, "serve"),
                                      (uid_c, home_c, test_code, "check")):
        path = os.path.join(home, "prog.py")
        with open(path, "w", encoding="utf-8") as f:
          f.write(source)
        nonce = secrets.token_hex(8)
        cfg = code_sandbox.config(server, limits, uid, mode=mode, program=path,
                                  num_cases=1, cpu_s=math.ceil(limits.total_wall_s),
                                  fn_name=entry_point, nonce=nonce)
        read, write = os.pipe()
        try:
          children.append(code_sandbox.ForkedChild(
              server, home, [f"{k}={v}" for k, v in cfg.items()], read))
        finally:
          os.close(read)
        os.set_blocking(write, False)
        writers.append(write)
        children[-1].nonce = nonce.encode()
      relay = _Relay(children, writers, limits)
      return relay.run()
    finally:
      for fd in writers:
        os.close(fd)
      ends = [child.finish() for child in children]
      # The program's process serves until we kill it: ended by itself with SIGKILL,
      # below its CPU limit, someone else killed it.
      if (relay is not None and relay.program_ended
          and ends[0][0] in (-signal.SIGKILL, -signal.SIGXCPU)
          and ends[0][1] < math.ceil(limits.total_wall_s) * 0.95):
        raise code_sandbox.SandboxError("the program was killed from outside: not its doing")


class _Relay:
  """Reads both children's output; forwards calls (tests -> program) and results back."""

  def __init__(self, children, writers, limits: code_sandbox.Limits):
    self.program, self.tests = children
    self.limits = limits
    self.out = {child.stdout: bytearray() for child in children}
    self.err = {child.stderr: bytearray() for child in children}
    self.pending = {fd: bytearray() for fd in writers}
    self.to_program, self.to_tests = writers
    self.ready = {id(child): False for child in children}
    self.calls = self.answered = 0
    self.program_ended = False
    self.sel = selectors.DefaultSelector()

  def run(self) -> tuple[str, str]:
    sel = self.sel
    for child in (self.program, self.tests):
      sel.register(child.stdout, selectors.EVENT_READ, child)
      sel.register(child.stderr, selectors.EVENT_READ, child)
      sel.register(child.pidfd, selectors.EVENT_READ, child)
    # The clock starts once both bootstraps are ready (a slow start on a loaded host is
    # not the program's time; past STARTUP_S it is the sandbox's failure), and then no
    # later than any other response's would: a scorer timeout would make it invalid.
    total = time.monotonic() + code_sandbox.STARTUP_S
    started, call_deadline = False, None
    try:
      while True:
        now = time.monotonic()
        if not started and all(self.ready.values()):
          started, total = True, now + self.limits.total_wall_s
        deadline = min(total, call_deadline or total)
        if now >= deadline:
          if not started:
            raise code_sandbox.SandboxError(
                f"the sandbox did not start within {code_sandbox.STARTUP_S:g}s")
          return "timeout", ("a call ran past its limit" if call_deadline and
                             now >= call_deadline else "past the response's total")
        for key, _ in sel.select(deadline - now):
          if key.fileobj in self.pending:  # a writer with room again
            self._flush(key.fileobj)
            continue
          child = key.data
          if key.fileobj == child.pidfd:
            sel.unregister(child.pidfd)
            if child is self.program:
              self.program_ended = True
              self._answer_ended()
            continue
          chunk = os.read(key.fileobj, 1 << 16)
          if not chunk:
            sel.unregister(key.fileobj)
            if key.fileobj == self.tests.stdout:
              raise code_sandbox.SandboxError(
                  "the tests ended without a verdict: " + self._stderr(self.tests))
            continue
          buf = self.out.get(key.fileobj, self.err.get(key.fileobj))
          buf.extend(chunk)
          if len(buf) > self.limits.output_bytes:
            if child is self.program:
              return "wrong", "the output cap"
            raise code_sandbox.SandboxError("the tests wrote past the output cap")
          if key.fileobj == self.program.stdout:
            result = self._program_output()
            if result:
              return result
            call_deadline = None if self.answered == self.calls else call_deadline
          elif key.fileobj == self.tests.stdout:
            verdict, sent = self._tests_output()
            if sent:
              call_deadline = time.monotonic() + self.limits.wall_s
            if verdict:
              return verdict
    finally:
      sel.close()

  def _lines(self, child):
    """Complete lines after the ready line of `child`'s stdout: [(kind, rest)]."""
    buf = self.out[child.stdout]
    if not self.ready[id(child)]:
      head = child.nonce + b" R\n"
      if len(buf) < len(head):
        return []
      if not buf.startswith(head):
        raise code_sandbox.SandboxError("the sandbox bootstrap failed: " + self._stderr(child))
      del buf[:len(head)]
      self.ready[id(child)] = True
    mark, lines = b"\n" + child.nonce + b" ", []
    while True:
      at = buf.find(mark)
      end = buf.find(b"\n", at + len(mark)) if at >= 0 else -1
      if end < 0:
        return lines
      lines.append(bytes(buf[at + len(mark):end]))
      del buf[:end + 1]

  def _program_output(self):
    for line in self._lines(self.program):
      index, kind, payload = (line.split(b" ", 2) + [b"", b""])[:3]
      if (index != str(self.answered).encode() or self.answered >= self.calls
          or kind not in (b"ok", b"error")):
        return "runtime_error", "case marks out of order (the program wrote marks of its own)"
      self.answered += 1
      self._send(self.to_tests, kind + b" " + payload + b"\n")
    return None

  def _tests_output(self):
    sent = False
    for line in self._lines(self.tests):
      kind, _, rest = line.partition(b" ")
      if kind == b"call":
        self.calls += 1
        sent = True
        if self.program_ended:
          self.answered += 1
          self._send(self.to_tests, _ENDED)
        else:
          self._send(self.to_program, rest + b"\n")
      elif kind == b"done":
        verdict, _, detail = rest.decode("utf-8", "replace").partition(" ")
        status = {"pass": "pass", "fail": "wrong", "raised": "runtime_error"}.get(verdict)
        if status is None:
          raise code_sandbox.SandboxError(f"the tests said {verdict!r}")
        return (status, detail or f"{self.calls} calls passed"), sent
    return None, sent

  def _answer_ended(self):
    while self.answered < self.calls:
      self.answered += 1
      self._send(self.to_tests, _ENDED)

  def _send(self, fd: int, data: bytes) -> None:
    self.pending[fd].extend(data)
    self._flush(fd)

  def _flush(self, fd: int) -> None:
    buf = self.pending[fd]
    try:
      while buf:
        del buf[:os.write(fd, buf)]
    except BlockingIOError:
      pass
    except BrokenPipeError:
      buf.clear()
    registered = fd in self.sel.get_map()
    if buf and not registered:
      self.sel.register(fd, selectors.EVENT_WRITE, None)
    elif not buf and registered:
      self.sel.unregister(fd)

  def _stderr(self, child) -> str:
    code_sandbox.drain(child.stderr, self.err[child.stderr], 2048)
    return self.err[child.stderr][-300:].decode("utf-8", "replace").strip()
