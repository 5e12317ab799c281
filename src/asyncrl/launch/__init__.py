"""asyncrl.launch (see DESIGN.md §2): where the stages run (``local``, ``ray``) and the shared run flow
(``runner``). Only ``RunStopped`` lives here, so the CLI can catch it without importing a launcher."""


class RunStopped(RuntimeError):
    """The run cannot go on (e.g. a trainer rank died); the message says how to resume it."""
