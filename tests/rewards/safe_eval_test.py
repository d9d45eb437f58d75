"""The safe evaluator: exact values, grammar limits, and bounds that refuse before computing."""

from fractions import Fraction

import pytest
import sympy

from jaxrl_scale.rewards import safe_eval


@pytest.mark.parametrize("text,expected", [
    ("1+2*3", Fraction(7)),
    ("(1+2)*3", Fraction(9)),
    ("7/2", Fraction(7, 2)),
    ("1.25", Fraction(5, 4)),
    (".5", Fraction(1, 2)),
    ("-2^2", Fraction(-4)),  # power binds tighter than unary minus
    ("2^3^2", Fraction(512)),  # right-associative
    ("2**-1", Fraction(1, 2)),
    ("8^(1/3)", Fraction(2)),
    (r"\sqrt[3]{-8}", Fraction(-2)),  # the real root
    (r"\frac{3}{4}", Fraction(3, 4)),
    (r"\frac34", Fraction(3, 4)),
    (r"\frac{1}{2}{3}", Fraction(3, 2)),  # implicit multiplication before '{'
    (r"\dfrac{\frac{1}{2}}{2}", Fraction(1, 4)),
    (r"\sqrt{16}", Fraction(4)),
    ("(1+2)(3+4)", Fraction(21)),
    (r"\left(1+2\right) \times 4 \div 6", Fraction(2)),
    ("3 × 4 ÷ 6 − 1", Fraction(1)),
    ("[2]{3}", Fraction(6)),
])
def test_rational_values(text, expected):
  value = safe_eval.evaluate(text)
  assert isinstance(value, Fraction) and value == expected


@pytest.mark.parametrize("text,expected", [
    (r"\sqrt{8}", 2 * sympy.sqrt(2)),
    (r"2\pi", 2 * sympy.pi),
    (r"\frac{1}{\sqrt{2}}", sympy.sqrt(2) / 2),
    (r"\sqrt{-4}", 2 * sympy.I),
    (r"\pi^2", sympy.pi ** 2),
])
def test_irrational_values(text, expected):
  assert sympy.simplify(safe_eval.evaluate(text) - expected) == 0


def test_equal():
  ev = safe_eval.evaluate
  assert safe_eval.equal(ev(r"\sqrt{2}+\sqrt{3}"), ev(r"\sqrt{5+2\sqrt{6}}"))
  assert safe_eval.equal(ev("0.5"), ev(r"\frac{1}{2}"))
  assert not safe_eval.equal(ev(r"\pi"), ev("3.14159265358979323846"))
  assert not safe_eval.equal(ev(r"\sqrt{2}"), ev("1.4142135623730951"))


def test_equal_is_relative_and_never_raises():
  ev = safe_eval.evaluate
  assert safe_eval.equal(ev(r"(\sqrt{2}+\sqrt{3}) \cdot 10^{-1000}"),
                         ev(r"\sqrt{5+2\sqrt{6}} \cdot 10^{-1000}"))
  assert safe_eval.equal(ev(r"(\sqrt{2}+\sqrt{3}) \cdot 10^{1000}"),
                         ev(r"\sqrt{5+2\sqrt{6}} \cdot 10^{1000}"))
  # Tiny values are not all equal (no absolute tolerance).
  assert not safe_eval.equal(ev(r"\sqrt{2} \cdot 10^{-1000}"), ev(r"\sqrt{3} \cdot 10^{-1000}"))
  # A zero spelled as radicals evaluates to rounding noise; it is simply not equal to 0.
  assert not safe_eval.equal(ev(r"\sqrt{2}+\sqrt{3}-\sqrt{5+2\sqrt{6}}"), ev("0"))
  assert safe_eval.equal(ev(r"\sqrt{-2}"), ev(r"\frac{\sqrt{-8}}{2}"))


def test_exact_roots_of_large_numbers_are_allowed():
  assert safe_eval.evaluate(r"\sqrt{2^{4000}}") == 2 ** 2000


def test_literals_are_recorded_in_order():
  value, literals = safe_eval.evaluate_with_literals("(3+5)*2", safe_eval.COUNTDOWN)
  assert value == 16 and literals == [3, 5, 2]
  _, literals = safe_eval.evaluate_with_literals(r"\frac{12}{4}", safe_eval.COUNTDOWN)
  assert literals == [12, 4]


@pytest.mark.parametrize("text", ["2^3", "2**3", "1.5+1", r"\sqrt{4}", r"2\pi"])
def test_countdown_grammar_rejects(text):
  with pytest.raises(safe_eval.ParseError):
    safe_eval.evaluate(text, safe_eval.COUNTDOWN)


@pytest.mark.parametrize("text", [
    "", "1 2", "1 000", "(1", "1)", "[1)", "1+", "*2", "x", "2x", "1e3", "abs(2)",
    r"\foo{1}", r"\sqrt[x]{2}", r"\sqrt[1.5]{2}", "__import__('os')", "１２", "٤٢", "1;2",
    "lambda: 1", "2 if 1 else 3",
])
def test_parse_errors(text):
  with pytest.raises(safe_eval.ParseError):
    safe_eval.evaluate(text)


@pytest.mark.parametrize("text", [
    "9**9**9**9", "10^10^10", "2^5000", "(2^4000)*(2^4000)", r"\pi^{10^{100}}",
    r"(\sqrt{2}\cdot 2^{4000})^{64}", r"\sqrt[100]{2}", "2^(1/100)",
    "(" * 100 + "1" + ")" * 100, "-" * 100 + "1", "1" * (safe_eval.MAX_CHARS + 1),
    r"\sqrt{2^{4000}+1}", r"(2^{300}+1)^{\sqrt{2}}",  # sympy would trial-factor these
])
def test_bounds_refuse_before_computing(text):
  with pytest.raises(safe_eval.BoundsError):
    safe_eval.evaluate(text)


@pytest.mark.parametrize("text", [r"\frac{1}{0}", "1/(2-2)", "0^-1", "0^0", r"\frac{\pi}{0}"])
def test_undefined_values(text):
  with pytest.raises(safe_eval.EvalError):
    safe_eval.evaluate(text)


def test_nesting_just_below_the_limit_is_fine():
  depth = safe_eval.MAX_DEPTH - 2
  assert safe_eval.evaluate("(" * depth + "1" + ")" * depth) == 1


def test_large_but_bounded_values_are_exact():
  assert safe_eval.evaluate("2^4000") == 2 ** 4000
  assert safe_eval.evaluate("(1/3)^100") == Fraction(1, 3 ** 100)
  assert safe_eval.evaluate("(-1)^(10^100)") == 1
  assert safe_eval.evaluate("1^(10^100)") == 1
