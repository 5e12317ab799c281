"""ChatRenderer: environment turns through the tokenizer's own template, the model's closing token
not doubled, (for canonically tokenised turns) the same ids the template gives the whole
conversation, and message text that writes control text (or the renderer's own markers) encoded as text."""

from __future__ import annotations

import asyncio

import pytest

from asyncrl.rollout.agent import AgentSettings, run_agent_episode
from asyncrl.rollout.chat import MARK, SENTINEL, ChatRenderer, demonstration_ids
from asyncrl.rollout.envs.base import Message
from asyncrl.rollout.envs.calculator import calculator_env, calculator_tool
from asyncrl.rollout.sampling import SamplingParams
from asyncrl.types import Prompt
from tests.rollout.chat_templates import FORGED, control_counts, llama_tokenizer, qwen_tokenizer, tiny_tokenizer
from tests.rollout.scripted_engine import ScriptedEngine, Turn

HISTORY = [Message("system", "Use the calculator."), Message("user", "What is 48213*379?")]
TOOLS = [calculator_tool().schema()]


@pytest.fixture(scope="module")
def toks(tmp_path_factory: pytest.TempPathFactory) -> dict:
    return {
        "tiny": tiny_tokenizer(tmp_path_factory.mktemp("tok")),
        "qwen": qwen_tokenizer(),
        "llama": llama_tokenizer(),
    }


def test_tiny_template_renders_tool_results(toks: dict) -> None:
    tok = toks["tiny"]
    r = ChatRenderer(tok)
    assert tok.decode(list(r.opening_ids(HISTORY, TOOLS))) == "Q:What is 48213*379?\nA:"
    assert r.env_text(HISTORY, [Message("tool", "18272727")], closed_by=tok.eos_token_id) == "R:18272727\nA:"
    assert r.env_text(HISTORY, [Message("tool", "18272727")]) == "<eos>R:18272727\nA:"  # the turn was not closed


def test_qwen_groups_tool_results_and_closes_an_open_turn(toks: dict) -> None:
    tok = toks["qwen"]
    r = ChatRenderer(tok, (tok.convert_tokens_to_ids("<|im_end|>"),))
    two = [Message("tool", "18272727"), Message("tool", "3")]
    closed = r.env_text(HISTORY, two, TOOLS, closed_by=r.end_of_turn_ids[0])
    assert closed == (
        "\n<|im_start|>user\n<tool_response>\n18272727\n</tool_response>\n<tool_response>\n3\n</tool_response>"
        "<|im_end|>\n<|im_start|>assistant\n"
    )
    assert r.env_text(HISTORY, two, TOOLS) == "<|im_end|>" + closed


def test_llama_model_closer_stands_in_for_the_templates(toks: dict) -> None:
    """The model ended with <|eom_id|>, the template closes with <|eot_id|>: not doubled."""
    tok = toks["llama"]
    eot, eom = tok.convert_tokens_to_ids(["<|eot_id|>", "<|eom_id|>"])
    r = ChatRenderer(tok, (eot, eom))
    text = r.env_text(HISTORY, [Message("tool", "18272727")], TOOLS, closed_by=eom)
    ipython = "<|start_header_id|>ipython<|end_header_id|>\n\n18272727<|eot_id|>"
    assert text == ipython + "<|start_header_id|>assistant<|end_header_id|>\n\n"


@pytest.mark.parametrize("name", ["tiny", "qwen", "llama"])
def test_canonical_turns_give_the_templates_own_ids(toks: dict, name: str) -> None:
    """When the model's tokens happen to be the canonical encoding of its text, the episode's ids are
    exactly the template's tokenisation of the whole conversation: the glue is the template's."""
    tok = toks[name]
    r = ChatRenderer(tok)
    answer, result = "<calc>48213*379</calc>" if name == "tiny" else "I will compute 48213*379.", "18272727"
    ids = list(r.opening_ids(HISTORY, TOOLS)) + tok.encode(answer, add_special_tokens=False) + [tok.eos_token_id]
    ids += r.env_ids(HISTORY, [Message("tool", result)], TOOLS, closed_by=tok.eos_token_id)
    full = tok.apply_chat_template(
        [m.as_dict() for m in [*HISTORY, Message("assistant", answer), Message("tool", result)]],
        tools=TOOLS,
        add_generation_prompt=True,
        tokenize=False,
    )
    assert ids == tok.encode(full, add_special_tokens=False)


def test_templates_that_drop_a_role_or_have_none_are_errors(toks: dict, tmp_path) -> None:
    tok = tiny_tokenizer(tmp_path)
    r = ChatRenderer(tok)
    with pytest.raises(ValueError, match="renders no 'ipython' message"):
        r.env_text(HISTORY, [Message("ipython", "18272727")])
    tok.chat_template = "{% for m in messages %}{% if m.role == 'user' %}{{ m.content }}{% endif %}{% endfor %}"
    with pytest.raises(ValueError, match="does not render assistant"):
        r.env_text(HISTORY, [Message("user", "x")])
    tok.chat_template = None
    with pytest.raises(ValueError, match="chat template"):
        ChatRenderer(tok)
    assert SENTINEL.isascii() and SENTINEL == SENTINEL.strip()


@pytest.mark.parametrize("name", ["tiny", "qwen", "llama"])
def test_demonstration_ids_are_what_an_episode_builds(toks: dict, name: str) -> None:
    """A worked conversation gives the sequence and mask of an episode whose model sampled those turns."""
    tok = toks[name]
    r = ChatRenderer(tok)
    call, answer = "<calc>48213*379</calc>", "#18272727"
    convo = [*HISTORY, Message("assistant", call), Message("tool", "18272727"), Message("assistant", answer)]
    ids, mask = demonstration_ids(r, convo, TOOLS)
    turns = [Turn(tuple(tok.encode(t, add_special_tokens=False)) + (tok.eos_token_id,)) for t in (call, answer)]
    prompt = Prompt("p", (), answer="18272727", meta={"question": HISTORY[1].content})
    env = calculator_env(system=HISTORY[0].content)
    sampling = SamplingParams(max_new_tokens=64, seed=0)
    traj = asyncio.run(run_agent_episode(ScriptedEngine({0: turns}), env, r, prompt, sampling, AgentSettings("tag")))
    assert traj.env_reward == 1.0 and ids == traj.token_ids
    assert mask == (0,) * len(traj.prompt_ids) + traj.loss_mask
    with pytest.raises(ValueError, match="opening"):
        demonstration_ids(r, [Message("assistant", "x")])


@pytest.mark.parametrize("role", ["tool", "user"])
@pytest.mark.parametrize("name", ["tiny", "qwen", "llama"])
def test_message_text_cannot_forge_control_tokens(toks: dict, name: str, role: str) -> None:
    """A message writing the template's control text (a forged system turn and assistant answer) is encoded
    as text: the glue holds exactly the control tokens a benign message's glue holds, and reads as written."""
    tok = toks[name]
    r = ChatRenderer(tok)
    forged = FORGED[name]
    assert set(control_counts(tok, tok.encode(forged, add_special_tokens=False)))  # the payload does forge, raw

    def glue(content: str) -> tuple[int, ...]:  # the turn not closed by the model: the template's closer in it
        return r.env_ids(HISTORY, [Message(role, content)], TOOLS)

    benign, bad = glue("9128"), glue(forged)
    assert control_counts(tok, bad) == control_counts(tok, benign) and control_counts(tok, benign)
    text = r.env_text(HISTORY, [Message(role, forged)], TOOLS)
    assert forged in text and tok.decode(list(bad), skip_special_tokens=False) == text
    # the opening (a user turn, a system prompt, a tool's description) and a demonstration's assistant turn
    opening = [Message("system", forged), Message("user", forged)]
    tools = [{**TOOLS[0], "function": {**TOOLS[0]["function"], "description": forged}}]
    base = r.opening_ids([Message("system", "Be brief."), Message("user", "9128")], TOOLS)
    assert control_counts(tok, r.opening_ids(opening, tools)) == control_counts(tok, base)
    ids, _ = demonstration_ids(r, [*HISTORY, Message("assistant", forged), Message(role, "1")], TOOLS)
    plain, _ = demonstration_ids(r, [*HISTORY, Message("assistant", "9128"), Message(role, "1")], TOOLS)
    assert control_counts(tok, ids) == control_counts(tok, plain)


@pytest.mark.parametrize("name", ["tiny", "qwen", "llama"])
def test_the_renderers_own_markers_cannot_be_forged(toks: dict, name: str) -> None:
    """A tool result holding the sentinel, a placeholder or the marker prefix is text like any other: the
    glue is the benign glue with that text in place of the benign one (the sentinel does not cut it short)."""
    tok = toks[name]
    r = ChatRenderer(tok)
    eos = tok.eos_token_id
    markers = f"{SENTINEL} {MARK}0E {MARK}1E{MARK}"
    benign = r.env_text(HISTORY, [Message("tool", "9128")], TOOLS, closed_by=eos)
    text = r.env_text(HISTORY, [Message("tool", markers)], TOOLS, closed_by=eos)
    assert text == benign.replace("9128", markers)
    ids = r.env_ids(HISTORY, [Message("tool", markers)], TOOLS, closed_by=eos)
    benign_ids = r.env_ids(HISTORY, [Message("tool", "9128")], TOOLS, closed_by=eos)
    assert control_counts(tok, ids) == control_counts(tok, benign_ids)
    assert tok.decode(list(ids), skip_special_tokens=False) == text


def test_text_without_special_strings_is_encoded_as_before(toks: dict) -> None:
    """Escaping changes nothing for ordinary text: one piece, the tokenizer's own encoding (the template's
    control tokens recognised), so canonical turns keep the template's ids (the test above this one)."""
    tok = toks["qwen"]
    r = ChatRenderer(tok)
    text = r.env_text(HISTORY, [Message("tool", "18272727")], TOOLS)
    assert r.env_ids(HISTORY, [Message("tool", "18272727")], TOOLS) == tuple(tok.encode(text, add_special_tokens=False))
    assert r.encode("<tool_call>") == (tok.convert_tokens_to_ids("<tool_call>"),)  # not special: the tokenizer's
    assert tok.convert_tokens_to_ids("<|im_end|>") not in r.encode("<|im_end|>")
