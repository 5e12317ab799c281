"""Environments of multi-turn episodes (``rollout.agent``): async ``reset``/``step`` objects.

- ``base``: the ``Environment`` protocol and its records, ``Tool`` and ``ToolEnv`` (a turn's calls
  run on their tools, concurrently, with a timeout; a turn without a call is the answer);
- ``calculator``: the calculator tool, its environment and the final-answer verifier;
- ``python``: a tool that runs code through a runner handed in (the controller passes the reward
  sandbox; rollout imports no reward code);
- ``gym``: the adapter that lets a gym-style text environment (``reset``/``step`` over strings,
  sync or async) plug in, and a Gymnasium ``Env`` with text observations and actions through it;
- ``registry``: ``agent.env`` names resolved through entry points (group ``asyncrl.environments``; the
  built-ins registered in pyproject.toml like a third party's), ``gym:...`` and ``pkg.module:make``;
- ``latency``: simulated slow tools (``agent.tool_latency``), a seeded wait before a turn's calls are
  answered, wrapped around any environment.
"""
