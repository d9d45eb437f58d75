"""Answer extraction and equivalence: tables of positive and negative cases."""

import pytest

from jaxrl_scale.rewards import math as math_answers

# (predicted, gold): must be judged equivalent.
EQUIVALENT = [
    ("42", "42"),
    ("42.0", "42"),
    ("042", "42"),
    ("+5", "5"),
    ("-3", "-3"),
    ("0.5", "1/2"),
    (r"\frac{1}{2}", "0.5"),
    (r"\dfrac{1}{2}", "0.5"),
    (r"\tfrac12", "1/2"),
    ("3/4", r"\frac{3}{4}"),
    ("0.75", r"\frac34"),
    (r"\frac{6}{8}", "0.75"),
    (r"-\frac{1}{2}", "-0.5"),
    (r"\frac{-1}{2}", "-1/2"),
    ("1.50", "1.5"),
    ("1,000", "1000"),
    ("1,234,567", "1234567"),
    ("1{,}000", "1000"),
    (r"1\,000", "1000"),
    ("1,000.5", "1000.5"),
    (r"2\sqrt{2}", r"\sqrt{8}"),
    (r"\frac{\sqrt{2}}{2}", r"\frac{1}{\sqrt{2}}"),
    (r"\sqrt{4}", "2"),
    (r"\sqrt[3]{27}", "3"),
    (r"\sqrt2+\sqrt3", r"\sqrt{5+2\sqrt{6}}"),
    (r"2\pi", r"2 \pi"),
    (r"\pi/2", r"\frac{\pi}{2}"),
    ("π", r"\pi"),
    ("2^{10}", "1024"),
    ("2**-1", "0.5"),
    (r"3 \times 4", "12"),
    (r"2\cdot 3", "6"),
    ("1+2*3", "7"),
    ("1e3", "1000"),
    (r"1.5 \times 10^{3}", "1500"),
    ("2.5E-2", "0.025"),
    ("50%", "50"),
    ("50%", "0.5"),
    (r"50\%", "50%"),
    ("0.5", "50%"),
    ("50 percent", "50%"),
    (r"5\text{ cm}", "5"),
    ("5 cm", "5"),
    ("5cm", "5"),
    (r"12 \text{ square units}", "12"),
    (r"\$5", "5"),
    ("5 dollars", "5"),
    (r"90^\circ", "90"),
    ("90°", "90"),
    ("x = 5", "5"),
    ("$5$", "5"),
    ("12.", "12"),
    (r"\textbf{12}", "12"),
    ("(1, 2)", "(1,2)"),
    (r"\left( 1, 2 \right)", "(1, 2)"),
    ("2, 1", "1, 2"),
    ("(B)", "B"),
    (r"\text{(B)}", r"\text{(B)}"),
    # Issue 39: a decimal stands for an exact value it rounds, within relative 1e-4.
    ("0.333333", r"\frac{1}{3}"),
    ("3.14159265358979", r"\pi"),
    ("1.4142", r"\sqrt{2}"),
    ("0.142857142857", r"\frac{1}{7}"),
    # Separators, decimal commas and mixed numbers.
    ("1 000", "1000"),
    (r"45,\! 678", "45678"),
    (r"12{,}345", "12345"),
    (r"2\,000\,000", "2000000"),
    ("2500,75", "2500.75"),
    ("0.111", "0,111"),
    ("2 1/3", r"\frac{7}{3}"),
    (r"-1\ 1/2", "-1.5"),
]

# (predicted, gold): must NOT be judged equivalent.
NOT_EQUIVALENT = [
    ("41", "42"),
    ("-5", "5"),
    ("0.33", "1/3"),
    ("0.333", r"\frac{1}{3}"),  # relative error 1e-3 (the tolerance is 1e-4)
    ("0.1428", r"\frac{1}{7}"),  # close, but not a rounding of 1/7 (0.1429 is; 3e-4 off)
    ("3.1415", r"\pi"),  # a truncation: pi rounds to 3.1416
    ("1.414", r"\sqrt{2}"),
    ("3.14", r"\pi"),
    ("3.14159265358979", "3.141592653589793"),  # two decimals compare exactly
    (r"2\pi", "6.28"),
    ("2", r"\sqrt{2}"),
    ("0.5%", "50%"),
    ("5", "50%"),
    ("0.05", "50%"),
    ("(2, 1)", "(1, 2)"),
    ("[1, 2]", "(1, 2)"),
    ("1, 2, 3", "1, 2"),
    ("12", "1, 2"),
    ("10 00", "1000"),  # not groups of three
    ("B", "C"),
    ("", "5"),
    ("x^2", "4"),
    ("2 pi", "2"),
    ("١٢", "12"),  # Arabic-Indic digits: int() would accept them, the grammar does not
]


@pytest.mark.parametrize("predicted,gold", EQUIVALENT)
def test_equivalent(predicted, gold):
  assert math_answers.is_equivalent(predicted, gold), (predicted, gold)


@pytest.mark.parametrize("predicted,gold", NOT_EQUIVALENT)
def test_not_equivalent(predicted, gold):
  assert not math_answers.is_equivalent(predicted, gold), (predicted, gold)


def test_tables_are_large_enough():
  assert len(EQUIVALENT) + len(NOT_EQUIVALENT) >= 60


def test_compare_distinguishes_unparseable_from_wrong():
  assert math_answers.compare("41", "42") == math_answers.WRONG
  assert math_answers.compare("x^2", "4") == math_answers.WRONG  # an expression, not 4
  assert math_answers.compare("10 00", "1000") == math_answers.UNPARSEABLE
  assert math_answers.compare(r"\frac{1}{0}", "4") == math_answers.UNPARSEABLE


@pytest.mark.parametrize("response,expected,method", [
    (r"so \boxed{\frac{1}{2}}.", r"\frac{1}{2}", "boxed"),
    (r"\boxed{1} then \boxed{2}", "2", "boxed"),
    (r"\boxed{\boxed{3}+1}", r"\boxed{3}+1", "boxed"),  # the top-level box
    (r"\boxed{ \{1, 2\} }", r"\{1, 2\}", "boxed"),  # escaped braces do not nest
    (r"\fbox{7}", "7", "boxed"),
    (r"$\boxed 5$", "5", "boxed"),
    (r"\boxed{1} and an unclosed \boxed{2", "1", "boxed"),
    (r"an unclosed \boxed{ around \boxed{4} then \boxed{5}", "5", "boxed"),
    ("The answer is $\\frac{1}{2}$.", r"\frac{1}{2}", "answer_is"),
    ("Final answer: 42.", "42", "answer_is"),
    ("the answer is 3.5.\nMore text 7", "3.5", "answer_is"),
    ("The answer is **17**", "17", "answer_is"),
    ("I got 12 apples and then 1,234.5 more", "1,234.5", "last_number"),
    ("result: -7", "-7", "last_number"),
    ("5-3", "3", "last_number"),
    ("it is 50% likely", "50%", "last_number"),
    (r"<think>\boxed{1}</think> The answer is 2", "2", "answer_is"),
    ("<think>a</think><think>b</think> 9", "9", "last_number"),
])
def test_extract_answer(response, expected, method):
  found = math_answers.extract_answer(response)
  assert (found.text, found.method) == (expected, method)


@pytest.mark.parametrize("response,method", [
    ("no digits here", "none"),
    (r"<think> still thinking \boxed{3}", "unfinished_think"),
    ("\\boxed{" + "1" * (math_answers.MAX_ANSWER_CHARS + 1) + "}", "too_long"),
    ("", "none"),
])
def test_extract_no_answer(response, method):
  found = math_answers.extract_answer(response)
  assert found.text is None and found.method == method


def test_find_last_boxed_handles_deep_nesting_linearly():
  depth = 100_000
  text = "\\boxed{" * depth + "7" + "}" * depth
  assert math_answers.find_last_boxed(text) == "\\boxed{" * (depth - 1) + "7" + "}" * (depth - 1)


def test_normalize():
  assert math_answers.normalize(r"\text{ 1,000 } \text{dollars}") == "1000"
  assert math_answers.normalize(r"x = \$1{,}234.50.") == "1234.50"
  assert math_answers.normalize("yes") == "yes"  # words stay when no number is left
