"""asyncrl.launch (see DESIGN.md §2): how the stages are built (``stages``: every stage from the config),
where they run (``local``, ``ray``, ``trainer_process``), the shared run flow (``runner``) and the warm
start (``warm_start``). Only ``RunStopped`` lives here, so the CLI can catch it without importing a launcher."""


class RunStopped(RuntimeError):
    """The run cannot go on (e.g. a trainer rank died); the message says how to resume it."""
