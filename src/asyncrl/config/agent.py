"""The ``agent`` section of the config tree: multi-turn episodes with tools (the environment, the tool-call
format, turn and token budgets, the OpenAI door's agent). Every field documented under its declaration
(``tests/test_config_fields.py`` reads this file too).
"""

from __future__ import annotations

from dataclasses import dataclass

from asyncrl.choices import EpisodeMode, ToolFormat, ToolLatencyDist

__all__ = ["AgentConfig"]


@dataclass(frozen=True)
class AgentConfig:
    """Multi-turn episodes with tools (``rollout.workflow=agent``; ``rollout.agent``)."""

    tool_format: ToolFormat = "hermes"
    """The call format of the model's family: hermes (``<tool_call>{json}</tool_call>``) | tag (``<calc>expr</calc>``)
    | json (Llama 3.x, a bare object) | qwen3 (hermes + ``<think>`` reasoning) | qwen3_coder (XML) | mistral
    (``[TOOL_CALLS][...]``) | deepseek_v3 | deepseek_r1 (deepseek_v3 + reasoning); docs/agent.md shows each."""
    env: str = "calculator"
    """The environment of each episode, found through the registry (``rollout.envs.registry``, docs/agent.md
    "Environments"): a registered name (built in: calculator, which scores the answer itself | python, the
    sandbox, reward: ``task.verifier`` | verifiers, the tasks of task.name=verifiers; a third party's: an
    ``asyncrl.environments`` entry point) | ``gym:<id or pkg.module:Class>`` (a Gymnasium env with text
    observations and actions) | ``skyrl:<id or pkg.module:Class>`` (a skyrl-gym text env) |
    ``openenv:<url>[#field]`` (an OpenEnv server) | ``pkg.module:make`` (a maker taking ``EnvOptions``,
    returning an ``Environment``)."""
    max_turns: int = 4
    """Model turns per episode."""
    max_tokens: int = 256
    """Tokens after the opening (model and environment); the engine holds max_prompt_len + this."""
    max_turn_tokens: int | None = None
    """Tokens per model turn; null: ``rollout.max_new_tokens`` (``eval.max_new_tokens`` in evaluation)."""
    stop_at_tool_close: bool = False
    """Also end a turn at the call format's close tag (one token, like Qwen's ``</tool_call>``)."""
    malformed_penalty: float = 0.0
    """Subtracted from an episode's reward per malformed call."""
    tool_timeout_s: float = 5.0
    """Longest wait on one tool call (a slower one is answered with an error)."""
    tool_latency: ToolLatencyDist = "none"
    """none | lognormal: a simulated wait (``asyncio.sleep``, never blocking the engine or other episodes)
    before the environment answers a turn that calls a tool, one draw per call, the turn waiting for the
    longest (calls run concurrently); drawn from a stream seeded by ``run.seed``, the prompt and the
    episode's index in its group, so a run is reproducible; not bounded by ``tool_timeout_s``. Only
    ``rollout.workflow=agent``; held-out evaluation waits too."""
    tool_latency_median_s: float = 0.2
    """The median of the lognormal wait, in seconds."""
    tool_latency_sigma: float = 1.0
    """The lognormal's sigma (of the log of the wait): 1.0 puts the 90th percentile at 3.6x the median and
    the 99th at 10x; 0: every wait is the median."""
    entrypoint: str | None = None
    """``rollout.workflow=openai_agent``: the agent, ``pkg.module:function`` taking ``(base_url, api_key,
    task)`` and using only the ``openai`` client (``rollout.openai_workflow``; its budgets: ``max_tokens``,
    ``max_turn_tokens``; its call format: ``tool_format``)."""
    episode_mode: EpisodeMode = "linear"
    """``rollout.workflow=openai_agent``: what an episode's calls may be and what they train as (docs/agent.md
    "Episodes that branch or trim"). linear: one conversation extended call by call (an edited history or a
    concurrent call gets 400), trained as one sample | tree: any history (trimmed, edited, branched,
    concurrent calls); a call whose messages extend an earlier completion's continues its ids, others start a
    branch; one sample per leaf of that prefix tree (root to leaf, the shared prefix trained in each) |
    individual: any history; one sample per completion (its own prompt, its tokens). With tree or individual
    a group holds every sample of its episodes, rewards per completion (``/reward``) and ``reward_discount``."""
    reward_discount: float = 1.0
    """tree | individual: a completion without a reward of its own gets the episode's reward times this to the
    power of the sequential calls after it (1.0: every completion gets the episode's reward)."""
