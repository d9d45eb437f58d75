r"""Final-answer extraction: several boxes, a later "final answer is", math in prose."""

import pytest

from jaxrl_scale.rewards import extract


@pytest.mark.parametrize("response,expected,method", [
    # Several boxes of one final answer form a list; only connectors may separate them.
    (r"The roots are $\boxed{-2}$ and $\boxed{1}$.", "-2, 1", "boxed"),
    (r"So $x = \boxed{2}$ or $x = \boxed{3}$.", "2, 3", "boxed"),
    (r"$a=\boxed{2}$, $b=\boxed{7}$", "2, 7", "boxed"),
    (r"The solutions are $\boxed{1}$, $\boxed{2}$ and $\boxed{3}$.", "1, 2, 3", "boxed"),
    (r"So $\boxed{3}$ fails; trying again gives $x = \boxed{4}$.", "4", "boxed"),
    ("\\boxed{6} and\n\n\\boxed{6}", "6", "boxed"),  # a repeated box counts once
    (r"\boxed{1} then \boxed{2}", "2", "boxed"),
    # A final answer stated after the last box wins (the model corrected itself).
    ("First $\\boxed{255}$. Wait, recomputing. The final answer is $10,455$.", "10,455",
     "answer_is"),
    ("The percentage is \\boxed{50}. The answer is: 50", "50", "answer_is"),
    (r"The final answer is $\boxed{5}$.", "5", "boxed"),
    (r"\boxed{5}. The answer is above.", "5", "boxed"),  # no math after it: the box stays
    # Unboxed prose: the last math, never reduced to its last number.
    ("So the ordered pair $(x, y)$ that solves the system is $(7, 6)$.", "(7, 6)", "last_math"),
    (r"Therefore the set is \(\{1, 2\}\).", r"\{1, 2\}", "last_math"),
    ("We have $x = 3$ and so there are 12 apples.", "12", "last_number"),
    ("We get $$\\frac{1}{2}$$", r"\frac{1}{2}", "last_math"),
])
def test_extract(response, expected, method):
  found = extract.extract_answer(response)
  assert (found.text, found.method) == (expected, method)


def test_find_boxes_skips_nested_and_keeps_complete_ones_in_an_unclosed_box():
  text = r"\boxed{\boxed{3}+1} x \boxed{ open \boxed{4} \boxed{5}"
  contents = [text[s:e] for _, s, e in extract.find_boxes(text)]
  assert contents == [r"\boxed{3}+1", "4", "5"]


def test_many_boxes_are_bounded():
  found = extract.extract_answer("\\boxed 9 " * 100_000)
  assert found.text == "9"  # identical boxes count once; at most MAX_BOXES are joined
  found = extract.extract_answer(" ".join(f"\\boxed{{{i}}}" for i in range(100)))
  assert found.text.count(",") == extract.MAX_BOXES - 1


@pytest.mark.parametrize("response,expected,method", [
    # Cut by the token budget: only a closed box is a final answer (its closing brace was
    # written, so the cut cannot have shortened it).
    ("Adding the parts gives 5 + 7 = 12", None, "truncated"),
    ("So the pair is $(7, 6)$ and next", None, "truncated"),
    ("The answer is 12", None, "truncated"),  # "12" may be the start of "125"
    (r"So $\boxed{12}$. Let me double check: 5 + 7 = 1", "12", "boxed"),
    (r"First $\boxed{255}$. Wait. The final answer is $10,4", None, "truncated"),
    ("<think>5 + 7 = 12", None, "unfinished_think"),
    (r"<think>5 + 7</think> So \boxed{12} and", "12", "boxed"),
    (r"<think>5 + 7</think> It is 12", None, "truncated"),
    (r"The value is \boxed{12", None, "truncated"),  # an unclosed box is not an answer
])
def test_extract_truncated(response, expected, method):
  found = extract.extract_answer(response, truncated=True)
  assert (found.text, found.method) == (expected, method)


@pytest.mark.parametrize("response,expected,method", [
    # Issue 39: prose answers as models write them.
    ("So the total is 3 000 000.", "3 000 000", "last_number"),
    ("Soucis : 2,74 $ a..", "2,74", "last_number"),
    ("The numbers are 3,5,7", "7", "last_number"),  # items of a list, no decimal comma
    ("He walks 2 1/3 miles.", "2 1/3", "last_number"),
    ('Checked.\n\n"The final answer is 42."', "42", "answer_is"),
    (r"Answer $ \frac{1}{2} \$ = \frac{10}{9} $", r"\frac{1}{2} \$ = \frac{10}{9}", "last_math"),
    # A new chat turn ends the answer: its numbers are not the model's.
    ("So she spends 250 dollars.\n<|im_start|>user\nNow what is 3 + 4?", "250", "last_number"),
    ("The number is 12.\nHuman: thanks! what about 13 pears?", "12", "last_number"),
])
def test_extract_prose(response, expected, method):
  found = extract.extract_answer(response)
  assert (found.text, found.method) == (expected, method)


def test_boxes_with_prose_between_are_parts():
  found = extract.extract_answer("(a) It is $\\boxed{12}$.\n\n(b) Then $\\boxed{5}$.")
  assert (found.text, found.parts) == ("5", ("12", "5"))
  assert extract.extract_answer(r"$\boxed{-2}$ and $\boxed{1}$").parts == ()  # one list
  # No part marker between them: the earlier box is an attempt the model replaced.
  assert extract.extract_answer(r"So $\boxed{1}$. Hmm, no: it is $\boxed{2}$.").parts == ()


@pytest.mark.parametrize("response,expected,method", [
    (r"So $\boxed{12}$. The final answer is 13.", "12", "boxed"),
    ("The answer is 12.", None, "none"),
    ("So the pair is $(7, 6)$.", None, "none"),
])
def test_boxed_only(response, expected, method):
  found = extract.extract_answer(response, boxed_only=True)
  assert (found.text, found.method) == (expected, method)
