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


def test_repeat_form_solutions_are_correct_and_long_tailed() -> None:
    train, held_out = make_splits(11, 3000, 100, max_terms=300, tail=0.986, form="repeat")
    for p in train[:200] + held_out:
        factor, count = p.question.split("%")[0].split("*")
        lines = p.solution.split(";")[:-1]
        assert len(lines) == int(count) == p.num_terms
        assert [int(line.split(":")[0]) for line in lines] == list(range(int(count), 0, -1))
        assert [int(line.split(":")[1]) for line in lines] == [k * int(factor) % 10 for k in range(1, int(count) + 1)]
        assert int(p.answer) == int(factor) * int(count) % 10
        assert arithmetic_reward(p.solution, p.answer) == 1.0
    lengths = sorted(len(p.solution) for p in train)
    assert 150 < lengths[len(lengths) // 2] < 400  # a few hundred tokens at the median
    assert lengths[-1] > 1500  # and a tail past 1,500


def test_repeat_form_teacher_slips_to_the_total_before_the_last_line() -> None:
    import random

    from asyncrl.data.synthetic import teacher_solution

    train, _ = make_splits(2, 300, 10, max_terms=40, tail=0.9, form="repeat")
    for p in train:
        slipped = teacher_solution(p, random.Random(0), 1.0)
        lines = p.solution.split(";")
        assert slipped == ";".join(lines[:-1]) + f";#{lines[-3].split(':')[1]}"
        assert arithmetic_reward(slipped, p.answer) == 0.0  # factor 1..9: the slip is always wrong


def test_held_out_is_disjoint_from_training_for_every_eval_size_and_train_does_not_depend_on_it() -> None:
    for form, kwargs in (("chain", {}), ("repeat", {"max_terms": 300, "tail": 0.986})):
        trains = []
        for eval_size in (16, 64, 256, 512, 1024):
            train, held_out = make_splits(1234, 4000, eval_size, form=form, **kwargs)
            assert len(held_out) == eval_size
            assert not {p.question for p in train} & {p.question for p in held_out}, (form, eval_size)
            trains.append([p.question for p in train])
        assert all(t == trains[0] for t in trains), form  # the warm start's demonstrations never change


def test_held_out_and_training_share_the_length_distribution() -> None:
    train, held_out = make_splits(1234, 20000, 2000)
    share = {
        name: Counter(p.num_terms for p in split)[2] / len(split)
        for name, split in (("train", train), ("held_out", held_out))
    }
    assert abs(share["train"] - share["held_out"]) < 0.04, share  # P(two terms) = 0.5 in the generator
    assert abs(share["train"] - 0.5) < 0.02


def test_a_question_space_too_small_to_split_is_an_error_not_a_hang() -> None:
    import pytest

    failures = 0
    for seed in range(12):  # 9 questions (factor 1..9, count 2): some seeds hold none of them out
        try:
            make_splits(seed, 10, 2, max_terms=2, form="repeat")
        except ValueError as exc:
            assert "too small to split" in str(exc)
            failures += 1
    assert failures > 0
    with pytest.raises(ValueError, match="too small"):
        make_splits(next(s for s in range(12) if _no_held_out(s)), 10, 2, max_terms=2, form="repeat")


def _no_held_out(seed: int) -> bool:
    from asyncrl.data.synthetic import is_held_out

    return not any(is_held_out(seed, f"{f}*2%10") for f in range(1, 10))
