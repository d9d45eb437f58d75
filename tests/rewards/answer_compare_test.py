r"""Comparison by answer type: each category's equivalent forms and the near-misses it rejects.

Every REJECT row is a near-miss a sloppy verifier accepts: a wrong sign, a different
endpoint or openness, a missing set element, one side of an equation, an expression that
agrees with the gold at one point (x^2 vs 2x at x = 2) or on a line.
"""

import pytest

from jaxrl_scale.rewards import answer_compare
from jaxrl_scale.rewards import answer_parse
from jaxrl_scale.rewards import math as math_answers

M = lambda body, env="pmatrix": f"\\begin{{{env}}}{body}\\end{{{env}}}"  # noqa: E731

ACCEPT = {
    "algebra": [
        ("(x+1)^2", "x^2+2x+1"), ("x^2-1", "(x-1)(x+1)"), ("3x+2y", "2y+3x"),
        (r"\frac{x+2}{7}", r"\frac{x}{7}+\frac{2}{7}"), (r"\tan^2(y)+1", r"\sec^2(y)"),
        (r"2 \sin b \cos a", r"2\cos a \sin b"), (r"\sqrt{x^2}", "|x|"),
        (r"\frac{x^2-4}{x-2}", "x+2"), ("2^{n+1}", r"2\cdot 2^n"), (r"\ln(xy)", r"\ln x + \ln y"),
        (r"\cos 2\theta", r"1-2\sin^2\theta"), (r"\frac{1}{3x^{2/3}}", r"\frac{1}{3\sqrt[3]{x}^2}"),
    ],
    "equations": [
        ("x = 11", "x = 5+5+1 = 7 = 11"), ("11", "x=11"), ("k=1", "1"),
        ("2x+4y-3=0", r"y=-\frac{1}{2}x+\frac{3}{4}"), ("34x+45y-20z+100=0", "-34x-45y+20z-100=0"),
        (r"\frac{x^2}{4}+\frac{y^2}{3}=1", r"\frac{x^2}{16}+\frac{y^2}{12}=\frac{1}{4}"),
        (r"\frac13", r"x=\frac13\approx0.33"), ("2x+3", "y = 2x+3"),
    ],
    "inequalities": [
        ("x > 2", r"(2, \infty)"), (r"[3, \infty)", r"x \ge 3"), ("x < 1", "-x > -1"),
        (r"x \leq 5", r"5 \geq x"), ("-2 < x < 3", "(-2, 3)"), ("2x + 1 > 7", "x > 3"),
        (r"x \neq 3", r"(-\infty, 3) \cup (3, \infty)"), ("a > b", "b < a"),
        (r"x < -1 \text{ or } x > 1", r"(-\infty,-1)\cup(1,\infty)"),
    ],
    "intervals": [
        (r"\{-1\} \cup [0,7)", r"x \in \{-1\} \cup [0,7)"),
        (r"(\frac{3}{5},\frac{8}{3}]", r"(0.6, \frac{8}{3}]"),
        (r"(-2, 0) \cup (0, 2)", r"(0, 2) \cup (-2, 0)"), ("[1, 4]", r"[1,2] \cup [2,4]"),
        (r"(0, \infty)", r"\left(0, \infty\right)"),
    ],
    "sets_lists": [
        (r"\{1, 2, 3\}", r"\{3, 1, 2\}"), ("-2, 1", "1, -2"), (r"\{1,2\}", "1, 2"),
        (r"1 \pm \sqrt{19}", r"1+\sqrt{19}, 1-\sqrt{19}"), ("2, 3", r"x = 2 \text{ or } x = 3"),
        ("-3, -1, 1, 3", r"\pm 1, \pm 3"), (r"\emptyset", r"\varnothing"),
    ],
    "tuples": [("(2, 100)", "(2,100)"), ("(1, 2)", "(x, y) = (1, 2)"),
               (r"(1,\frac{9}{2})", "(1,4.5)")],
    "matrices": [
        (M("1 & 2 \\\\ 3 & 4"), M("1 & 2 \\\\ 3 & 4", "bmatrix")),
        (M("0.5 & 1"), M(r"\frac12 & 1")),
        (M("1 \\\\ 2 \\\\ 3"), "(1, 2, 3)"),
    ],
    "numbers": [("1500", r"1.5 \times 10^{3}"), ("7425000", "7,425,000"), ("54", "204_5"),
                ("15", r"15\mbox{ cm}^2"), (r"\frac{7}{2}", r"3\frac{1}{2}"), ("5", r"\log_2 32")],
    "text": [("B", r"\text{(B)}"), (r"\text{yes}", "Yes"), ("A", r"\textbf{(A)}")],
    # Issue 39: the formats models write.
    "named_values": [
        ("AB=4, CD=5", "4, 5"), ("a_3 = 2, a_{37} = 19", "a_{37} = 19, a_3 = 2"),
        ("p=5,q=2;p=7,q=2", "(5,2),(7,2)"), ("2", "g(x) = 2"), ("0 < f(x) < 1", "(0, 1)"),
        ("|AB| = 1", "1"), (r"\{(1,2),(2,1)\}", r"x=1, y=2 \text{ and } x=2, y=1"),
        ("(-1, 4)", "h = -1, k = 4"), (r"\frac{NO}{BO}=\frac{1}{\sqrt{6}}", r"\frac{1}{\sqrt{6}}"),
        (r"x_{1}=1,\quadx_{2}=2", "1, 2"),
    ],
    "matrix_expressions": [
        (M(r"6 & 8 \\ 10 & 12"), M(r"1 & 2 \\ 3 & 4") + " + " + M(r"5 & 6 \\ 7 & 8")),
        (M(r"19 & 22 \\ 43 & 50"), M(r"1 & 2 \\ 3 & 4") + M(r"5 & 6 \\ 7 & 8")),
        (M(r"-4 & -4"), M("1 & 2") + " - " + M("5 & 6")), (M("2 & 4"), "2" + M("1 & 2")),
        (M(r"7 \\ 15"), M(r"1 & 2 \\ 3 & 4") + M(r"1 \\ 3")),
    ],
    "decimals": [
        (r"\frac17", "0.142857142857"), (r"\sqrt2", "1.4142"), (r"\pi", "3.14159265"),
        (r"[\frac13, \frac53]", "[0.333333, 1.666667]"), (M(r"\frac13 & 1"), M("0.333333 & 1")),
        ("1000", "1 000"), ("45678", r"45,\! 678"), ("2500.75", "2500,75"), ("0,111", "0.111"),
        (r"\frac73", "2 1/3"), ("-1.5", r"-1\ 1/2"),
    ],
}

REJECT = {
    "algebra": [
        ("x^2", "2x"),  # agree at x = 0 and x = 2
        ("x^3-x", "0"),  # zero at -1, 0, 1
        ("|x|", "x"),  # agree at every positive point
        ("x^2-1", "(x-1)^2"), ("(x+1)^2", "x^2+1"), ("3x+2y", "3y+2x"), ("x+2n+1", "x+1"),
        ("x^2-3x+2", "x^2-3x+3"), (r"\sin x", r"\cos x"), ("x+y", "xy"), ("2^{n+1}", "2^n+1"),
    ],
    "equations": [
        ("a+3z=0", "0"), ("7 = 11a+c", "11a+c"), ("2x+z=1", "1"), ("y = 2x+3", "2x+3"),
        ("y = 2x+3", "y = 2x-3"), ("x+y=1", "x-y=1"), ("x^2 = 4", "x = 2"), ("x = 5", "x = -5"),
        ("2x+4y-3=0", "x+2y-3=0"), ("y = 4", "x = 4"), ("y=x+1", "y=x+1.0001"),
    ],
    "inequalities": [
        ("x > 5", "x < 5"), ("x > 2", r"x \ge 2"), ("x > 2", r"[2, \infty)"),
        ("-2 < x < 3", "[-2, 3)"),
        ("x < 1", "x > -1"), ("a > b", "a < b"), (r"x \neq 3", r"x \neq -3"), ("x > 3", "3"),
    ],
    "intervals": [
        ("[0,9)", "[0,1)"), ("(0,9)", "[0,9)"), ("[-3,2]", r"(-\infty, -3] \cup [2, \infty)"),
        (r"(-2, 0) \cup (0, 2)", "(-2, 2)"), ("[1, 4]", r"[1, 2] \cup [3, 4]"), ("1", "-[0,1)"),
    ],
    "sets_lists": [
        (r"\{1, 2, 3\}", r"\{1, 2\}"), ("1, 2", "1, 2, 3"), ("-2, 1", "2, 1"),
        (r"1 \pm \sqrt{19}", r"1 + \sqrt{19}"), (r"\{1,2\}", "(1,2)"), ("2, 3", "x = 2"),
    ],
    "tuples": [("(1, 2)", "(2, 1)"), ("(2, 100)", "2100"), ("2100", "(2,100)"),
               ("(1, 2)", "[1, 2]")],
    "matrices": [
        (M("1 & 2 \\\\ 3 & 4"), M("1 & 2 \\\\ 3 & 5")),
        (M("1 & 2 \\\\ 3 & 4"), M("1 & 3 \\\\ 2 & 4")),
        (M("1 \\\\ 2"), M("1 & 2")),
    ],
    "numbers": [("2", r"\frac{1+\sqrt{5}}{2}"), (r"\sqrt{2}", "1.414"), (r"\pi", "3.1415"),
                ("42", "-42")],
    "text": [("B", "C"), (r"\text{yes}", r"\text{no}")],
    "named_values": [
        ("AB=4, CD=5", "5, 4"), (r"x = -5, p = \frac{14}{3}", r"\frac{14}{3}, -5"),
        ("a_3 = 2, a_{37} = 19", "a_{37} = 2, a_3 = 19"), ("p=5,q=2;p=7,q=2", "(5,2),(2,7)"),
        ("2", "g(x) = 2x"), ("4", "2x = 4"), ("3", "|x| = 3"), ("(-1, 4)", "h = 4, k = -1"),
        (r"\{(1,2),(2,1)\}", r"x=1, y=2 \text{ and } x=1, y=2"), ("10", "f(3)"),
        ("2", "1/x = 2"), ("3", "2x/y = 3"),
    ],
    "matrix_expressions": [
        (M(r"19 & 22 \\ 43 & 50"), M(r"5 & 6 \\ 7 & 8") + M(r"1 & 2 \\ 3 & 4")),  # BA
        (M(r"7 \\ 15"), M(r"1 \\ 3") + M(r"1 & 2 \\ 3 & 4")),  # shapes do not fit
        (M("2 & 4"), M("1 & 2") + " + " + M(r"1 \\ 2")), (M("2 & 4"), "3" + M("1 & 2")),
    ],
    "decimals": [
        (r"\frac17", "0.1428"), (r"\frac13", "0.333"), (r"\sqrt2", "1.414"), (r"\pi", "3.1415"),
        ("100", "99.99999"), ("2.5", "2.4999"), ("23", "2,3"), ("2.3", "2, 3"),
        ("1000", "10 00"), (r"\frac23", "2 1/3"), (r"[\frac13, \frac53]", "[0.33, 1.67]"),
    ],
}


def _rows(table):
  return [(cat, gold, pred) for cat, pairs in table.items() for gold, pred in pairs]


@pytest.mark.parametrize("category,gold,pred", _rows(ACCEPT))
def test_accepts_equivalent_forms(category, gold, pred):
  assert math_answers.compare(pred, gold) == math_answers.CORRECT, (category, gold, pred)


@pytest.mark.parametrize("category,gold,pred", _rows(REJECT))
def test_rejects_near_misses(category, gold, pred):
  assert math_answers.compare(pred, gold) != math_answers.CORRECT, (category, gold, pred)


def test_equivalence_is_symmetric_on_the_tables():
  # Rows where one side is an assignment or a gold equation are direction-dependent on
  # purpose ("y = 2x+3" answers "2x+3", not the other way round); the rest must not be.
  # ("1000", "10 00"): as a gold, "10 00" is outside the grammar and compared as text.
  skip = {("2x+3", "y = 2x+3"), ("y = 2x+3", "2x+3"), ("1000", "10 00")}
  for category, gold, pred in _rows(ACCEPT) + _rows(REJECT):
    if (gold, pred) in skip or category == "named_values":  # the gold's names set the order
      continue
    assert (math_answers.compare(pred, gold) == math_answers.CORRECT) == (
        math_answers.compare(gold, pred) == math_answers.CORRECT), (gold, pred)


def test_verdicts_do_not_depend_on_call_order():
  # The evaluation points are a fixed table, not a shared random state.
  first = [math_answers.compare(p, g) for _, g, p in _rows(ACCEPT) + _rows(REJECT)]
  again = [math_answers.compare(p, g) for _, g, p in reversed(_rows(ACCEPT) + _rows(REJECT))]
  assert first == list(reversed(again))


@pytest.mark.parametrize("text,kind", [
    ("42", "number"), (r"\frac{\sqrt2}{2}", "number"), ("x^2+1", "expression"),
    ("x = 5", "assignment"), ("x + y = 1", "equation"), ("x > 2", "inequality"),
    ("[0, 1)", "interval"), (r"\{1, 2\}", "set"), ("1, 2", "list"), ("(1, 2)", "tuple"),
    (M("1 & 2"), "matrix"), ("50\\%", "percentage"), (r"\text{Evelyn}", "text"),
    (r"[0,1) \cup (2, 3]", "union"),
])
def test_kind_of(text, kind):
  assert answer_compare.kind_of(answer_parse.parse(text)) == kind


def test_describe_shows_type_and_normal_form():
  assert math_answers.describe(r"x \geq 5") == ("inequality", "x >= 5, i.e. [5, oo)")
  assert math_answers.describe(r"\dfrac{6}{8}") == ("number", "6*1/8 = 3/4")
  assert math_answers.describe("(2,100)") == ("tuple", "(2, 100)")
