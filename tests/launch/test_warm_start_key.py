"""The warm-start cache key: eval_size may stay out of it because the training split (the SFT
demonstrations) does not depend on it; every other task field changes it."""

from __future__ import annotations

from asyncrl.config import load_config
from asyncrl.data.synthetic import make_splits
from asyncrl.launch.warm_start import warm_start_key


def test_eval_size_leaves_the_key_and_the_demonstrations_unchanged() -> None:
    keys = {warm_start_key(load_config(None, [f"task.eval_size={n}"])) for n in (16, 256, 512)}
    assert len(keys) == 1
    trains = {tuple(p.question for p in make_splits(1234, 500, n)[0]) for n in (16, 256, 512)}
    assert len(trains) == 1
    assert warm_start_key(load_config(None, ["task.form=repeat"])) not in keys
    assert warm_start_key(load_config(None, ["task.seed=7"])) not in keys
