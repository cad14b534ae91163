"""The view gate: the one place a replica's view changes, and the vote it may give.

Both protocols number views with ballots (``make_ballot(round, owner)``): the owner of
a view is its sequencer (SDPaxos) or leader (Multi-Paxos). A replica's ``view`` and
``sequencer``/``leader`` are read through its ``ViewGate``; only the gate's ``join``
(follow a higher view seen in a message or a record) and ``stand`` (become a
candidate for the next view of our own) change them, as etcd raft's
``becomeFollower``/``becomeCandidate`` are the only code that changes ``Term``.

The gate also holds what limits a vote, the rules bug 1 of issue 9 broke when they
were checked at one call site out of six:

- the **lease promise** (SDPaxos §3.5): a replica that answered a sequencer's ping
  promised not to vote for anyone else until ``promise_until``; the sequencer serves
  lease reads on a majority of such promises. The promise holds in every view:
  joining a view (from any message) is not a vote.
- the **restart wait**: a restarted replica forgot the promises it gave, so it votes
  for nobody before ``no_vote_until`` (one promise's length).

``may_vote`` is the only test of both; the pre-vote, the vote and a candidate's own
vote for itself all ask it.
"""

from __future__ import annotations

from .config import ballot_owner, ballot_round, make_ballot

# ``admit``'s answers.
STALE, CURRENT, NEWER = -1, 0, 1


class ViewGate:
    __slots__ = ("me", "view", "owner", "promise_until", "promise_to", "no_vote_until", "distrust_view")

    def __init__(self, me: int, view: int, no_vote_until: int) -> None:
        self.me = me
        self.view = view
        self.owner = ballot_owner(view)  # the view's sequencer (leader)
        self.promise_until = 0  # no vote for a sequencer but promise_to before this tick
        self.promise_to = -1
        self.no_vote_until = no_vote_until
        # No lease promises to the owner of this view (a majority judged it a
        # straggler, or it handed over): it serves on, but its lease lapses.
        self.distrust_view = -1

    # --- the view ------------------------------------------------------------------

    def admit(self, view: int) -> int:
        """How a message of ``view`` compares with ours: STALE, CURRENT or NEWER."""
        return NEWER if view > self.view else (STALE if view < self.view else CURRENT)

    def join(self, view: int) -> bool:
        """Follow a higher view (its owner serves it, or is running for it). Not a vote:
        the lease promise and the restart wait hold on. False if ``view`` is not higher."""
        if view <= self.view:
            return False
        self.view = view
        self.owner = ballot_owner(view)
        return True

    def next_view(self) -> int:
        """The view we would stand for: the next round, owned by us."""
        return make_ballot(ballot_round(self.view) + 1, self.me)

    def stand(self) -> int:
        """Become the candidate of our next view; returns it."""
        self.view = self.next_view()
        self.owner = self.me
        return self.view

    # --- votes and the lease promise -------------------------------------------------

    def may_vote(self, candidate: int, now: int) -> bool:
        """May we vote for ``candidate`` (ourselves included) at tick ``now``, in any
        view: not during the restart wait, nor while a promise to another runs."""
        if now < self.no_vote_until:
            return False
        return now >= self.promise_until or self.promise_to == candidate

    def promise(self, to: int, until: int) -> None:
        """We answered ``to``'s ping (or, as sequencer, pinged): vote for nobody else
        before ``until``."""
        self.promise_until = until
        self.promise_to = to

    def release(self) -> None:
        """The sequencer we promised released us (a planned handover)."""
        self.promise_until = 0
