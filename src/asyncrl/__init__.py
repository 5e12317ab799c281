"""asyncrl: fully asynchronous reinforcement learning for language-model reasoning."""

__version__ = "0.1.0"
