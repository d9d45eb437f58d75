"""The bootstrap's assertion-test modes: "serve" (the program) and "check" (the tests).

code_sandbox.py appends this file's text to code_child.py's (it is never imported by the
package); it runs after the limits, the ready line and the audit hook. An assertion test
(HumanEval's `check(candidate)`, MBPP's asserts, KodCode's `from solution import f` with
`test_*` functions) runs in two sandboxed processes, so that the expected values never
live in the program's process:

  serve   the program's process: runs prog.py (its prints go nowhere), then answers calls,
          one JSON request per line on fd 0 ({"n": name, "a": args, "k": kwargs}), each
          with a case mark "\\n<nonce> <i> ok <result>" or "... error [type, message]".
  check   the tests' process: runs the test code with `candidate` (and the entry point's
          name, and a module `solution`) standing for the program's functions; each call
          is a line "\\n<nonce> call <request>" on fd 1, answered on fd 0 by the parent
          with the program's mark ("ok <result>" or "error <...>"). It ends with
          "\\n<nonce> done <pass|fail|raised> <detail>" (raised: a call raised).

Values cross as tagged JSON of plain data only (None, bool, int, float, str, bytes,
complex, list, tuple, set, frozenset, dict): a result of any other type (an object whose
__eq__ says yes to everything) is the program's TypeError, never compared.
"""


def _encode(value, depth=0):
  kind = type(value)
  if value is None or kind in (bool, int, str):
    return value
  if kind is float:
    return value if value - value == 0 else {"F": repr(value)}  # (nan, inf: by name)
  if depth > 64:
    raise TypeError("a value nested deeper than 64")
  tags = {list: "l", tuple: "t", set: "s", frozenset: "f"}
  if kind in tags:
    return {tags[kind]: [_encode(v, depth + 1) for v in value]}
  if kind is dict:
    return {"d": [[_encode(k, depth + 1), _encode(v, depth + 1)] for k, v in value.items()]}
  if kind is bytes:
    return {"b": value.hex()}
  if kind is complex:
    return {"c": [value.real, value.imag]}
  raise TypeError(f"a {kind.__name__} is not plain data")


def _decode(value):
  if not isinstance(value, dict):
    return value
  (tag, body), = value.items()
  if tag == "F":
    return float(body)
  if tag in ("l", "t", "s", "f"):
    items = [_decode(v) for v in body]
    return {"l": list, "t": tuple, "s": set, "f": frozenset}[tag](items)
  if tag == "d":
    return {_decode(k): _decode(v) for k, v in body}
  if tag == "b":
    return bytes.fromhex(body)
  if tag == "c":
    return complex(*body)
  raise ValueError(f"unknown tag {tag!r}")


def _own_requests():
  """fd 0 for ourselves; the code we run gets an empty stdin (and prints to nowhere)."""
  requests = os.fdopen(os.dup(0), "rb")
  null = os.open("/dev/null", os.O_RDONLY)
  os.dup2(null, 0)
  os.close(null)
  sys.stdin = io.StringIO("")
  sys.stdout = io.StringIO()
  return requests


def _serve_calls():
  import json as _json  # pylint: disable=g-import-not-at-top
  requests = _own_requests()
  namespace = {"__name__": "__main__", "__builtins__": __builtins__}
  exec(_CODE, namespace)  # noqa: S102  (sandboxed)
  solution = namespace.get("Solution")
  index = 0
  for line in requests:
    try:
      request = _json.loads(line)
      name = request["n"]
      if isinstance(solution, type) and hasattr(solution, name):
        fn = getattr(solution(), name)
      elif callable(namespace.get(name)):
        fn = namespace[name]
      else:
        raise NameError(f"the program defines no function {name!r}")
      result = fn(*_decode(request["a"]), **dict(_decode(request["k"])))
      kind, payload = "ok", _json.dumps(_encode(result))
    except BaseException as e:  # pylint: disable=broad-except  (the program's, reported)
      _print_exc()
      kind, payload = "error", _json.dumps([type(e).__name__, str(e)[:300]])
    sys.stdout.seek(0)
    sys.stdout.truncate()
    _mark(index, kind, payload)
    index += 1


def _run_check():
  import builtins as _builtins  # pylint: disable=g-import-not-at-top
  import json as _json  # pylint: disable=g-import-not-at-top
  import types as _types  # pylint: disable=g-import-not-at-top
  replies = _own_requests()
  raised = []

  def call(name, args, kwargs):
    request = {"n": name, "a": _encode(list(args)), "k": _encode(sorted(kwargs.items()))}
    os.write(1, _MARK + b"call " + _json.dumps(request).encode() + b"\n")
    kind, _, payload = replies.readline().decode("utf-8", "replace").partition(" ")
    if kind == "ok":
      return _decode(_json.loads(payload))
    name, message = _json.loads(payload) if kind == "error" else ("RuntimeError", "no answer")
    error = getattr(_builtins, str(name), None)
    if not (isinstance(error, type) and issubclass(error, Exception)):
      error = RuntimeError
    raised.append(name)
    raise error(message)

  def proxy(name):
    def function(*args, **kwargs):
      return call(name, args, kwargs)
    function.__name__ = name
    return function

  entry = CFG["fn_name"]
  module = _types.ModuleType("solution")
  module.__getattr__ = proxy  # `from solution import f`: f calls the program's f
  sys.modules["solution"] = module
  candidate = proxy(entry)
  namespace = {"__name__": "__main__", "__builtins__": __builtins__,
               "candidate": candidate, entry: candidate}
  verdict, detail = "pass", ""
  try:
    exec(_CODE, namespace)  # noqa: S102  (the dataset's tests, sandboxed too)
    # HumanEval's test code starts with the prompt, whose stub of the entry point replaced
    # the candidate; a check that calls it by name (HumanEval/33's sort_third) means the
    # program's.
    namespace[entry] = candidate
    if callable(namespace.get("check")):
      namespace["check"](candidate)
    else:
      for name, test in list(namespace.items()):
        if name.startswith("test") and callable(test) and not isinstance(test, type):
          test()
  except BaseException as e:  # pylint: disable=broad-except  (a failed test)
    verdict = "raised" if raised else "fail"
    detail = f"{type(e).__name__}: {e}".replace("\n", " ")[:200]
  os.write(1, _MARK + f"done {verdict} {detail}\n".encode())


if _MODE == "serve":
  _serve_calls()
elif _MODE == "check":
  _run_check()
