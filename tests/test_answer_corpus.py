"""The answer readers against the generated corpus of replies (tests/answer_corpus.py), read as a careful grader
reads them: a fixed sample of every group through `read_answer` / `read_score` / `read_confidence`, and checks
that the generator itself is sound (size, determinism, expected values that are real options and golds).

The full corpus runs in bench/answer_corpus.py, with counts per group and form."""

import random
from collections import Counter

from answer_corpus import AMBIGUOUS, DATA_DIR, GROUPS, LETTERS, UNREAD, categories, corpus, judge, sample

SAMPLE_PER_GROUP = 40
SAMPLE_SEED = 43


def test_the_readers_read_the_corpus_as_a_careful_grader_does():
    from byzantium.tasks.answers import read_answer, read_confidence, read_score

    def reading(item):
        if item.kind == "score":
            return read_score(item.text)
        if item.kind == "confidence":
            return read_confidence(item.text)
        return read_answer(item.text, item.kind, item.choices)

    wrong = []
    for item in sample(SAMPLE_PER_GROUP, SAMPLE_SEED):
        got = reading(item)
        outcome = judge(item, got.status, got.value)
        if outcome != "right":
            wrong.append(f"{item.category}: {outcome}: expected {item.expected!r}, read {got.status} {got.value!r}\n"
                         f"    ...{item.text[-160:]!r}")
    assert not wrong, f"{len(wrong)} of {SAMPLE_PER_GROUP * len(GROUPS)} replies misread:\n" + "\n".join(wrong)


def test_the_corpus_has_300_forms_per_group_and_every_form_appears():
    items = corpus()
    per_group = Counter(item.group for item in items)
    assert set(per_group) == set(GROUPS)
    assert min(per_group.values()) >= 300, per_group
    seen = Counter(item.category for item in items)
    for group in GROUPS:
        assert all(seen[c] >= 5 for c in categories(group)), {c: seen[c] for c in categories(group)}
        expected = Counter(item.expected for item in items if item.group == group)
        assert expected[AMBIGUOUS] >= 10 and expected[UNREAD] >= 10, (group, expected)


def test_the_corpus_is_deterministic_and_seeded():
    assert corpus(per_group=60) == corpus(per_group=60)
    assert corpus(per_group=60, seed=1) != corpus(per_group=60)
    assert sample(10, 3) == sample(10, 3)


def test_expected_values_are_real_options_and_golds():
    items = corpus()
    golds = {name: {rec.gold for recs in load(DATA_DIR).values() for rec in recs}
             for name, (_, load, _) in GROUPS.items()}
    for item in items:
        if item.expected in (AMBIGUOUS, UNREAD):
            continue
        if item.kind == "choice":
            assert item.expected in LETTERS[:len(item.choices)], item
        elif item.kind in ("score", "confidence"):
            assert 0.0 <= item.expected <= 1.0 and round(item.expected * 20, 9) % 1 == 0, item  # the grid of 0.05
        else:
            assert item.expected in golds[item.group], item
    assert {i.expected for i in items if i.group == "verdict"} - {AMBIGUOUS, UNREAD} == {"win", "lose", "tie"}
    assert {i.expected for i in items if i.kind == "bool"} - {AMBIGUOUS, UNREAD} == {"yes", "no"}


def test_without_shared_data_the_corpus_uses_records_it_makes(tmp_path):
    items = corpus(per_group=300, data_dir=tmp_path)
    assert Counter(item.group for item in items) == {name: 300 for name in GROUPS}
    rng = random.Random(0)
    for item in rng.sample(items, 50):
        if item.kind == "choice" and item.expected not in (AMBIGUOUS, UNREAD):
            assert item.expected in LETTERS[:len(item.choices)]


def test_judge_names_each_misreading():
    committed = corpus(per_group=30)[0]
    assert committed.expected not in (AMBIGUOUS, UNREAD)
    assert judge(committed, "read", committed.expected) == "right"
    assert judge(committed, "unread", None) == "unread when committed"
    assert judge(committed, "ambiguous", None) == "ambiguous when committed"
    assert judge(committed._replace(expected=AMBIGUOUS), "read", "A") == "read when ambiguous"
    assert judge(committed._replace(expected=UNREAD), "read", "A") == "read when unread"
    assert judge(committed._replace(expected=UNREAD), "unread", None) == "right"

