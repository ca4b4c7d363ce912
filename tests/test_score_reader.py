"""A judge's score (tasks.answers.read_score, SAC's parse_score): a closing line that is one number is a
score; a closing line of working, as a judge cut off by its token limit leaves it, is no score."""
import pytest

from byzantium.protocols.sac import parse_score


@pytest.mark.parametrize("text, score", [("0.8", 0.8), ("**0.8**", 0.8), ("7/10", 0.7), ("85%", 0.85),
                                         ("It matches my own result.\n0.9.", 0.9), ("Score: 1.0", 1.0)])
def test_a_closing_line_that_is_one_score_counts(text, score):
    assert parse_score(text) == (pytest.approx(score), True)


@pytest.mark.parametrize("text", ["24 * 2 - 28 - 25 * 2",  # SmolLM2's judge at --judge-max-tokens 16
                                  "First, 24 * 2 = 48.\n48 - 28 = 20", "24 - 28 ="])
def test_a_closing_line_of_working_is_no_score(text):
    assert parse_score(text) == (0.5, False)
