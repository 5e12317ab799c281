"""Policy loading and the tiny default policy.

Owns two things:
- ``load_policy(model_dir)``: load any local Hugging Face causal LM and its tokenizer through
  the same path a real checkpoint uses (``AutoModelForCausalLM`` / ``AutoTokenizer``), fp32
  eager attention on CPU by default. A directory that cannot be loaded (no tokenizer, an
  architecture transformers does not know, missing or damaged weights) raises ``ModelDirError``
  naming the directory and what is wrong, the tokenizer checked first (it is cheap).
- ``build_tiny_policy(out_dir, spec)``: build the embedded default locally (no hub): a character-level
  tokenizer made with the ``tokenizers`` library (EOS/PAD/BOS, a small chat template) and a
  randomly initialised Llama-architecture decoder (0.8 M parameters by default; its shape is
  ``TinyModelSpec``, a run's from ``sft.*`` by ``tiny_spec``), both saved with ``save_pretrained``
  so that ``load_policy`` treats it like any real checkpoint.
"""

from __future__ import annotations

import json
import string
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from asyncrl.choices import DType, check_choice
from asyncrl.config import SFTConfig

# A chat template for the tiny tokenizer: a user turn is "Q:<content>\n", the assistant turn
# starts with "A:" and ends with EOS, a tool result is "R:<content>\n" (multi-turn episodes:
# "Q:48213*379\nA:<calc>48213*379</calc><eos>R:18272727\nA:#18272727<eos>"). System messages and
# tool schemas are not rendered. Real models bring their own template.
TINY_CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{% if message['role'] == 'user' %}Q:{{ message['content'] }}\n"
    "{% elif message['role'] == 'assistant' %}A:{{ message['content'] }}{{ eos_token }}"
    "{% elif message['role'] == 'tool' %}R:{{ message['content'] }}\n"
    "{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}A:{% endif %}"
)

TINY_SPECIAL_TOKENS = ("<pad>", "<eos>", "<bos>", "<unk>")
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "tokenizer.model",
    "vocab.json",
    "vocab.txt",
    "spiece.model",
)
"""Files of which a model directory with a tokenizer holds at least one."""


class ModelDirError(ValueError):
    """A model directory that cannot be loaded; the message names it and what is wrong."""


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0][:300]}" if text else type(exc).__name__


TINY_CHARACTERS = string.digits + string.ascii_letters + string.punctuation + " \n"


@dataclass(frozen=True)
class TinyModelSpec:
    """Shape of the tiny Llama decoder. The defaults of the shape are the config's (``sft.hidden_size``
    ...: 800,384 parameters, about 0.8 M), so they are written once; ``tiny_spec(cfg.sft)`` is a run's."""

    hidden_size: int = SFTConfig.hidden_size
    num_layers: int = SFTConfig.num_layers
    num_heads: int = SFTConfig.num_heads
    num_kv_heads: int = SFTConfig.num_kv_heads
    intermediate_size: int = SFTConfig.intermediate_size
    max_position_embeddings: int = 1024
    seed: int = 0


TINY_SHAPE_FIELDS = ("hidden_size", "num_layers", "num_heads", "num_kv_heads", "intermediate_size")
"""The ``TinyModelSpec`` fields that the config sets (``sft.<field>``, the same names)."""


def tiny_spec(sft: SFTConfig) -> TinyModelSpec:
    """The tiny model's shape that a run's ``sft.*`` asks for (the config validated it)."""
    return TinyModelSpec(**{name: getattr(sft, name) for name in TINY_SHAPE_FIELDS})


def build_tiny_tokenizer(out_dir: str | Path) -> Any:
    """Build and save a character-level fast tokenizer loadable by ``AutoTokenizer``."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {tok: i for i, tok in enumerate(TINY_SPECIAL_TOKENS)}
    for ch in TINY_CHARACTERS:
        vocab.setdefault(ch, len(vocab))
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    core.decoder = decoders.Fuse()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=core,
        eos_token="<eos>",
        pad_token="<pad>",
        bos_token="<bos>",
        unk_token="<unk>",
        clean_up_tokenization_spaces=False,
    )
    tokenizer.chat_template = TINY_CHAT_TEMPLATE
    tokenizer.save_pretrained(str(out_dir))
    return tokenizer


def build_tiny_policy(out_dir: str | Path, spec: TinyModelSpec | None = None) -> Path:
    """Build the tiny tokenizer and a random-init Llama decoder; save both to ``out_dir``."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    _quiet_transformers()
    spec = spec or TinyModelSpec()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tiny_tokenizer(out)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=spec.hidden_size,
        intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.num_layers,
        num_attention_heads=spec.num_heads,
        num_key_value_heads=spec.num_kv_heads,
        max_position_embeddings=spec.max_position_embeddings,
        rope_theta=10000.0,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(spec.seed)
    model = LlamaForCausalLM(config)
    model.save_pretrained(str(out), safe_serialization=True)
    (out / "asyncrl_tiny.json").write_text(json.dumps(spec.__dict__, indent=2))
    return out


def _quiet_transformers() -> None:
    """Silence per-load progress bars and info logs (our own progress bars are the ones to read)."""
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()


def load_tokenizer(model_dir: str | Path) -> Any:
    """Load the tokenizer of a local checkpoint; a missing PAD falls back to EOS."""
    from transformers import AutoTokenizer

    _quiet_transformers()
    path = Path(model_dir)
    if path.is_dir() and not any((path / name).is_file() for name in TOKENIZER_FILES):
        raise ModelDirError(
            f"{path} has no tokenizer (none of {', '.join(TOKENIZER_FILES)}): save the tokenizer of the "
            "model it comes from into it (tokenizer.save_pretrained(DIR))"
        )
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    except Exception as exc:  # transformers raises OSError, ValueError, TypeError... for a bad tokenizer
        raise ModelDirError(f"{path}: its tokenizer cannot be loaded ({_first_line(exc)})") from exc
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def load_policy(model_dir: str | Path, *, device: str = "cpu", dtype: DType = "float32") -> tuple[Any, Any]:
    """Load ``(model, tokenizer)`` from a local Hugging Face checkpoint directory.

    Raises ``FileNotFoundError`` with a clear message when the directory holds no model, and
    ``ModelDirError`` when its tokenizer or its model cannot be loaded."""
    import torch
    from transformers import AutoModelForCausalLM

    path = Path(model_dir)
    if not (path / "config.json").is_file():
        raise FileNotFoundError(
            f"{path} is not a Hugging Face model directory (no config.json). Pass --model DIR with a "
            "local checkpoint, or run `asyncrl sft` / `asyncrl train` to build the tiny default."
        )
    _quiet_transformers()
    tokenizer = load_tokenizer(path)
    check_choice(dtype, DType, "dtype")
    torch_dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[dtype]
    try:
        model = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch_dtype, attn_implementation="eager")
    except MemoryError:
        raise
    except Exception as exc:  # an unknown model type, missing or damaged weights: say which directory
        raise ModelDirError(f"{path} cannot be loaded as a causal language model ({_first_line(exc)})") from exc
    model.to(device)
    return model, tokenizer


def count_parameters(model: Any) -> int:
    """Number of distinct parameters (tied weights counted once)."""
    return sum(p.numel() for p in model.parameters())


def stop_token_ids(tokenizer: Any, model: Any | None = None) -> tuple[int, ...]:
    """Token ids that end a response: the tokenizer's EOS plus the generation config's EOS ids."""
    ids: set[int] = set()
    if tokenizer.eos_token_id is not None:
        ids.add(int(tokenizer.eos_token_id))
    gen = getattr(model, "generation_config", None) if model is not None else None
    eos = getattr(gen, "eos_token_id", None)
    if isinstance(eos, int):
        ids.add(eos)
    elif isinstance(eos, (list, tuple)):
        ids.update(int(e) for e in eos)
    return tuple(sorted(ids))
