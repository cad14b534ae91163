"""HiveD's GPU-cluster scheduler model as a deterministic replicated state machine.

Public interface:

- ``load_config(source) -> Config`` / ``ConfigError``: HiveD config files, validated;
- ``SchedulerStateMachine(config)``: ``apply(command) -> result``, ``snapshot()``,
  ``restore(bytes)`` (the ``consensus`` StateMachine protocol); the command set is
  documented in ``scheduler_state.machine`` and ``docs/scheduler_state.md``;
- ``check(machine) -> list[str]``: the invariant checker (empty list: all hold).
"""

from scheduler_state.config import Config, ConfigError, load_config
from scheduler_state.invariants import check
from scheduler_state.machine import SchedulerStateMachine

__all__ = ["Config", "ConfigError", "SchedulerStateMachine", "check", "load_config"]
