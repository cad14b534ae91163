"""The consensus protocols as pure state machines (see ``consensus.core.replica``)."""
