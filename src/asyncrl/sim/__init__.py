"""The simulator (``asyncrl simulate``, DESIGN §6): the controller's own admission and batch rules over
simulated engines, trainer, weight sync and rewards whose costs come from a cost profile.

Modules: ``profile`` (the cost schema, shipped profiles in ``profiles/``), ``calibrate`` (``asyncrl
bench profile``: this machine's profile from measurements), ``scenario`` (what to simulate),
``workload`` (response lengths), ``groups`` (a simulated group and its buffer record), ``engine``
(continuous batching, costed), ``loop`` (the event loop around ``StalenessGate`` and ``GroupBuffer``),
``record`` (timeline, metrics, ledger), ``output`` (figures and the run directory), ``run``
(``simulate``); ``plan``, ``plan_workloads`` (``asyncrl plan``: a split, η, mark and interrupt mode
recommended by simulating each candidate). Their command lines are ``cli.simulate`` and ``cli.plan``;
``scenario.adaptive`` drives ``controller.adaptive`` in ``loop``.
What is modelled and what is not: ``docs/simulator.md``.
"""
