"""asyncrl.trainer (see DESIGN.md §2 and docs/trainer.md): the policy trainer.

- ``trainer``: ``Trainer`` (the step, proximal log-probs) and ``StepResult``;
- ``state``: weight export, Hugging Face saving, checkpoints (mixed into ``Trainer``);
- ``packing``: padding-free packing, micro-batch and rank balancing;
- ``attention``: the varlen attention registered with transformers;
- ``distributed``: FSDP2 ranks and the leader/follower protocol for ``torchrun``;
- ``weights``: safetensors and bucketed-broadcast weight transports;
- ``checkpoint``: the checkpoint file format and RNG states;
- ``lora``: LoRA through ``peft``;
- ``sft``: the supervised warm start.
"""
