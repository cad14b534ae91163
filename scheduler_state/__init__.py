"""HiveD's GPU-cluster scheduler model as a deterministic replicated state machine.

Public interface:

- ``load_config(source) -> Config`` / ``ConfigError``: HiveD config files, validated;
- ``SchedulerStateMachine(config)``: ``apply(command) -> result``, ``snapshot()``,
  ``restore(bytes)`` (the ``consensus`` StateMachine protocol); the command set is
  documented in ``scheduler_state.machine`` and ``docs/scheduler_state.md``;
- ``check(machine) -> list[str]``: the invariant checker (empty list: all hold).

The hot modules (``cells``, ``placement``, ``machine``) are also compiled with mypyc at
install time (``setup.py``): the same source, run as C extensions when the install
built them and the ``.py`` files still hash to what was compiled; otherwise, or with
``CELLAR_PURE_PYTHON=1``, the ``.py`` files run (``scheduler_state.compiled``).
``COMPILED`` says which.
"""

from scheduler_state import compiled as _compiled

_compiled.guard()  # before the hot modules are imported: which build runs

from scheduler_state.config import Config, ConfigError, load_config  # noqa: E402
from scheduler_state.invariants import check  # noqa: E402
from scheduler_state.machine import SchedulerStateMachine  # noqa: E402

COMPILED: bool = _compiled.running()
"""Whether this process runs the mypyc-compiled modules (``scheduler_state.compiled``)."""

__all__ = ["COMPILED", "Config", "ConfigError", "SchedulerStateMachine", "check", "load_config"]
