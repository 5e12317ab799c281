"""The synthetic arithmetic task: correct worked solutions, long tail, disjoint fixed splits."""

from __future__ import annotations

from collections import Counter

from asyncrl.data.synthetic import make_splits
from asyncrl.reward.arithmetic import arithmetic_reward, extract_final


def test_solutions_are_correct_and_verified() -> None:
    train, held_out = make_splits(7, 500, 50, max_terms=6, max_operand=9)
    for p in train + held_out:
        assert eval(p.question) == int(p.answer)  # noqa: S307 - digits and +/- only
        for step in p.solution.split(";")[:-1]:
            lhs, rhs = step.split("=")
            assert eval(lhs) == int(rhs)  # noqa: S307
        assert arithmetic_reward(p.solution, p.answer) == 1.0
        assert arithmetic_reward(p.solution + "1", p.answer) == 0.0


def test_lengths_are_long_tailed() -> None:
    train, _ = make_splits(0, 5000, 10, max_terms=8, tail=0.5)
    counts = Counter(p.num_terms for p in train)
    assert counts[2] > 0.4 * len(train)
    assert counts[2] > counts[3] > counts[4] > counts[5]
    assert counts[8] > 0
    lengths = sorted(len(p.solution) for p in train)
    assert lengths[-1] > 4 * lengths[len(lengths) // 2]


def test_splits_are_deterministic_and_disjoint() -> None:
    a_train, a_eval = make_splits(3, 300, 40)
    b_train, b_eval = make_splits(3, 300, 40)
    assert [p.question for p in a_train] == [p.question for p in b_train]
    assert [p.question for p in a_eval] == [p.question for p in b_eval]
    assert not {p.question for p in a_train} & {p.question for p in a_eval}
    c_train, _ = make_splits(4, 300, 40)
    assert [p.question for p in a_train] != [p.question for p in c_train]


def test_verifier_edge_cases() -> None:
    assert extract_final("no answer") is None
    assert arithmetic_reward("", "3") == 0.0
    assert arithmetic_reward("#2;#3", "3") == 1.0
    assert arithmetic_reward("#03", "3") == 1.0
    assert arithmetic_reward("#-3", "-3") == 1.0
    assert arithmetic_reward("#3", "x") == 0.0


def test_flawed_teacher_slips_at_the_configured_rate() -> None:
    import random

    from asyncrl.data.synthetic import teacher_solution

    train, _ = make_splits(5, 2000, 10)
    rng = random.Random(0)
    slipped = 0
    for p in train:
        demo = teacher_solution(p, rng, 0.6)
        steps, final = demo.rsplit(";", 1)
        assert steps == p.solution.rsplit(";", 1)[0]  # the worked steps are always right
        last_lhs = steps.split(";")[-1].split("=")[0]
        before_last = last_lhs[: max(last_lhs.rfind("+"), last_lhs.rfind("-"))]
        assert final in (f"#{p.answer}", f"#{before_last}")
        slipped += final != f"#{p.answer}"
    # the slip is invisible when the last operand is 0; otherwise about 60% of demos slip
    assert 0.45 < slipped / len(train) < 0.65
    clean = random.Random(0)
    assert all(teacher_solution(p, clean, 0.0) == p.solution for p in train[:50])
