r"""Final-answer extraction from an untrusted math response.

On the text after the last </think> (a response that opens <think> and never closes it has
no answer: it was still thinking), up to the start of a new chat turn ("<|im_start|>",
"\nHuman: ", ...: what follows is not the model's answer), in math-verify's precedence:
  1. the final \boxed{...} (or \fbox{...}) answer: the last top-level box together with the
     boxes just before it that only connectors separate ("\boxed{-2} and \boxed{1}",
     "x = \boxed{2}, y = \boxed{3}"), joined as a list; a box repeated verbatim counts once.
     When a "final answer is ..." / "answer: ..." holding math or a number comes after the
     last box, it wins (the model corrected itself after boxing);
  2. else the text after the last "answer is" / "answer:" up to the end of the line or
     sentence (a $...$ right after it is taken whole);
  3. else the last $...$, \(...\) or \[...\] math of the text, unless a bare number comes
     after it, so "... is $(7, 6)$." gives "(7, 6)", never its last number;
  4. else the last number in the text ("-1,234.5", "3 000", "2,74", "2 1/3", "50%", "3/4").
With boxed_only (the "math_boxed" verifier) only step 1's boxes count.
Every step is linear in the response length; an answer longer than MAX_ANSWER_CHARS is no
answer.

A truncated response (it hit its token budget without ending) keeps only step 1, and only
when nothing after the box overrides it: a closed box was delimited by the model, so the
cut cannot have shortened it, while "answer is ..." runs to the end of a line the cut may
have split ("answer is 12|5"), and the last math or number of an unfinished text is a
guess from the middle of its reasoning (a last-number +1 there rewards running out of
tokens). A model that boxed its answer and then went on checking keeps its answer.
"""

from __future__ import annotations

import dataclasses
import re

from jaxrl_scale.rewards import answer_parse

MAX_ANSWER_CHARS = answer_parse.MAX_CHARS
MAX_BOXES = 16  # boxes joined into one list answer

_BOX_SCAN_RE = re.compile(
    r"(?P<box>\\(?:boxed|fbox)(?![A-Za-z])\s*\{)"
    r"|\\(?:boxed|fbox)(?![A-Za-z])\s+(?P<tok>[^\s${}\\]+)"
    r"|(?P<esc>\\[{}])|(?P<open>\{)|(?P<close>\})")
# What may stand between two boxes of one final answer.
_CONNECTOR_RE = re.compile(
    r"(?:\s|\$|\\[()\[\]]|[,;&.]|\\q?quad|\\text\s*\{\s*(?:and|or|,)?\s*\}|\band\b|\bor\b"
    r"|(?:[A-Za-z](?:_\{?\w+\}?)?|\\[A-Za-z]+)\s*(?:=|\\in)|\\\\)*")
_ANSWER_IS_RE = re.compile(r"answer\s*(?:is\b|:)\s*:?", re.IGNORECASE)
_SENTENCE_END_RE = re.compile(r"\.(?:\s|$)")
# A number of prose: thousands grouped by "," or one space ("1,234", "3 000 000"), a decimal
# point or comma ("2,74": math.compare tells it from a pair by the gold), a mixed number
# ("2 1/3"), a fraction, a percent sign. In "3,5,7" the numbers are items: no decimal comma.
_NUMBER_RE = re.compile(
    r"(?<![\w./])(?:\d+ (?=\d+/\d))?"
    r"(?:[1-9]\d{0,2}(?:,\d{3})+(?![\d,])|[1-9]\d{0,2}(?: \d{3})+(?![\d,])|(?<!,)\d+,\d+(?!,?\d)|\d+)"
    r"(?:\.\d+)?(?:/\d+(?![\d/]|\.\d))?%?", re.ASCII)
_BOUNDARY_RE = re.compile(r"[^0-9.,/% ]")
# What names the next part of a question between two boxes.
_PART_MARKER_RE = re.compile(
    r"\((?:[a-h]|i{1,3}|iv|vi{0,3}|\d{1,2})\)|\b[Pp]art\b|(?:^|\n)\s*(?:\*\*)?\d{1,2}[.)]\s")
# Where a new chat turn starts: the answer is in the text before it (a model that goes on
# to write the next user turn has ended its own answer there).
_CHAT_TURN_RE = re.compile(
    r"<\|(?:im_start|im_end|eot_id|end_of_turn|start_header_id|endoftext|user)\|>"
    r"|<(?:start|end)_of_turn>|\n(?:Human|User|USER):\s")
_MATHY_RE = re.compile(r"[\d$\\]|^\(?[A-Za-z]\)?\.?$")


@dataclasses.dataclass(frozen=True)
class Extraction:
  """The answer found in a response.

  Attributes:
    text: the answer as written, or None when there is none.
    method: "boxed", "answer_is", "last_math", "last_number"; or, with text None, "none",
      "too_long" (the candidate exceeded MAX_ANSWER_CHARS), "unfinished_think" or
      "truncated" (cut by the token budget, no final box).
    parts: with method "boxed" and several boxes that `text` did not join (prose between
      them: "(a) ... \\boxed{12} (b) ... \\boxed{5}"), every box's content in order; a
      question in parts is answered by all of them (math.compare_parts).
  """
  text: str | None
  method: str
  parts: tuple[str, ...] = ()


def strip_think(text: str) -> str | None:
  """The text after the last </think>; None when <think> is never closed."""
  end = text.rfind("</think>")
  if end >= 0:
    return text[end + len("</think>"):]
  if "<think>" in text:
    return None
  return text


def find_boxes(text: str) -> list[tuple[int, int, int]]:
  r"""(box start, content start, content end) of every top-level closed \boxed{}, in order.

  A box inside another closed box is not top level; inside an unclosed box the complete
  ones are (the unclosed one is not an answer). Linear: each box is pushed and popped once.
  """
  first = min((i for i in (text.find("\\boxed"), text.find("\\fbox")) if i >= 0), default=-1)
  if first < 0:
    return []
  open_boxes: list[tuple[int, int, int]] = []  # (box start, content start, depth outside)
  closed: list[tuple[int, int, int]] = []
  depth = 0
  for m in _BOX_SCAN_RE.finditer(text, first):
    kind = m.lastgroup
    if kind == "box":
      open_boxes.append((m.start(), m.end(), depth))
      depth += 1
    elif kind == "tok":
      closed.append((m.start(), m.start("tok"), m.end("tok")))
    elif kind == "open":
      depth += 1
    elif kind == "close":
      depth -= 1
      if open_boxes and depth == open_boxes[-1][2]:
        start, content, _ = open_boxes.pop()
        while closed and closed[-1][0] > start:  # boxes nested in this one
          closed.pop()
        closed.append((start, content, m.start()))
  return closed


def find_last_boxed(text: str) -> str | None:
  r"""Content of the last top-level \boxed{...}; None if none."""
  boxes = find_boxes(text)
  if not boxes:
    return None
  _, start, end = boxes[-1]
  return text[start:end]


def _final_boxes(text: str, boxes: list[tuple[int, int, int]]) -> str:
  group = [boxes[-1]]
  for box in reversed(boxes[:-1]):
    gap = text[box[2] + 1:group[0][0]]
    if len(group) >= MAX_BOXES or len(gap) > 80 or not _CONNECTOR_RE.fullmatch(gap):
      break
    group.insert(0, box)
  contents = []
  for _, start, end in group:
    content = text[start:end].strip()
    if content and content not in contents:
      contents.append(content)
  return ", ".join(contents)


def _last_answer_is(text: str, start: int = 0) -> re.Match | None:
  # Backwards with str.rfind (C speed) rather than a regex scan of a whole megabyte.
  end = len(text)
  while True:
    i = max(text.rfind(word, start, end) for word in ("answer", "Answer", "ANSWER"))
    if i < 0:
      return None
    match = _ANSWER_IS_RE.match(text, i)
    if match is not None:
      return match
    end = i


def _after_answer_is(text: str, start: int = 0) -> str | None:
  match = _last_answer_is(text, start)
  if match is None:
    return None
  rest = text[match.end():match.end() + 4 * MAX_ANSWER_CHARS].lstrip(" \t*")
  line = rest.split("\n", 1)[0].strip()
  for open_, close in (("$$", "$$"), ("$", "$"), (r"\(", r"\)"), (r"\[", r"\]")):
    if line.startswith(open_):
      end = line.find(close, len(open_))
      if end >= 0:
        return line[len(open_):end]
  end = _SENTENCE_END_RE.search(line)
  if end is not None:
    line = line[:end.start()]
  line = line.strip().strip("*\"'“”").strip()
  if line.endswith("."):  # 'answer is 42."': the period before a closing quote
    line = line[:-1].rstrip()
  return line or None


def _last_number_match(text: str) -> tuple[int, int] | None:
  # Scan only a tail window, doubled until it holds a match. The window starts at a
  # character no number contains (a space, a letter...): the regex then splits the tail
  # exactly as it would split the whole text ("1,234,567" is never read from its middle).
  window = 256
  while True:
    lo = max(0, len(text) - window)
    if lo > 0:
      boundary = _BOUNDARY_RE.search(text, lo)
      lo = boundary.start() if boundary is not None else -1
    match = None
    if lo >= 0:
      for match in _NUMBER_RE.finditer(text, lo):
        pass
    if match is not None or window >= len(text):
      break
    window *= 2
  if match is None:
    return None
  start = match.start()
  # A minus sign counts when it is not the binary minus of "5-3".
  if start > 0 and text[start - 1] == "-" and (start == 1 or not text[start - 2].isalnum()):
    start -= 1
  return start, match.end()


def _last_math(text: str) -> tuple[int, str] | None:
  r"""(end position, content) of the last $...$, $$...$$, \(...\) or \[...\] of the text."""
  best = None
  for open_, close in (("$", "$"), (r"\(", r"\)"), (r"\[", r"\]")):
    end = text.rfind(close)
    if end < 0:
      continue
    while open_ == "$" and end > 0 and text[end - 1] == "$":  # the closing $$
      end -= 1
    window = max(0, end - 4 * MAX_ANSWER_CHARS)
    start = text.rfind(open_, window, end)
    while open_ == "$" and start > window and text[start - 1] == "\\":  # "\$" is a dollar
      start = text.rfind(open_, window, start - 1)
    if start < 0:
      continue
    content = text[start + len(open_):end].strip().rstrip(".,;").strip()
    if content and (best is None or end > best[0]):
      best = (end, content)
  return best


def extract_answer(response: str, truncated: bool = False,
                   boxed_only: bool = False) -> Extraction:
  """Finds the final answer in an untrusted response (see the module docstring).

  Args:
    response: the model's text.
    truncated: the response hit its token budget without ending; only a final closed
      box is then an answer (module docstring).
    boxed_only: only a closed box is an answer (step 1 without the later "answer is"), for
      prompts that ask for one: prose, the last math and the last number never count.
  """
  found = _extract(response, boxed_only)
  if truncated and found.method not in ("boxed", "unfinished_think"):
    return Extraction(None, "truncated")
  return found


def _extract(response: str, boxed_only: bool) -> Extraction:
  text = strip_think(response)
  if text is None:
    return Extraction(None, "unfinished_think")
  turn = _CHAT_TURN_RE.search(text)
  if turn is not None and turn.start() > 0 and text[:turn.start()].strip():
    text = text[:turn.start()]
  answer, method = None, "none"
  boxes = find_boxes(text)
  parts: tuple[str, ...] = ()
  if boxes:
    later = None if boxed_only else _after_answer_is(text, boxes[-1][2] + 1)
    if later is not None and _MATHY_RE.search(later):
      answer, method = later, "answer_is"
    else:
      answer, method = _final_boxes(text, boxes), "boxed"
      parts = _all_boxes(text, boxes)
      if ", ".join(parts) == answer:  # the connectors already joined every box
        parts = ()
  if boxed_only and not answer:
    return Extraction(None, "none")
  if not answer:
    answer = _after_answer_is(text)
    method = "answer_is"
  if not answer:
    math = _last_math(text)
    number = _last_number_match(text)
    if math is not None and (number is None or number[0] < math[0]):
      answer, method = math[1], "last_math"
    elif number is not None:
      answer, method = text[number[0]:number[1]], "last_number"
  if answer is None or not answer.strip():
    return Extraction(None, "none")
  answer = answer.strip()
  if len(answer) > MAX_ANSWER_CHARS:
    return Extraction(None, "too_long")
  return Extraction(answer, method, parts if len(parts) > 1 else ())


def _all_boxes(text: str, boxes: list[tuple[int, int, int]]) -> tuple[str, ...]:
  """Distinct contents of the last MAX_BOXES top-level boxes when they answer the parts of
  a question: a part marker ("(b)", "part", "(ii)", "2.") stands between each two. Without
  one, an earlier box is an attempt the model replaced ("\\boxed{1}. No: \\boxed{2}")."""
  boxes = boxes[-MAX_BOXES:]
  for before, after in zip(boxes, boxes[1:]):
    gap = text[before[2] + 1:after[0]]
    if len(gap) > 4 * MAX_ANSWER_CHARS or not _PART_MARKER_RE.search(gap):
      return ()
  contents: list[str] = []
  for _, start, end in boxes:
    content = text[start:end].strip()
    if content and content not in contents and len(content) <= MAX_ANSWER_CHARS:
      contents.append(content)
  return tuple(contents)
