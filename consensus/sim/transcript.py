"""Golden transcripts: scenario tests as text files of commands and expected output
(etcd raft's ``testdata/*.txt`` interaction tests, run with datadriven).

A transcript is a file of *cases*. A case is a command line, a ``----`` line, and
the expected output, which ends at the first blank line (or the end of the file).
Lines starting with ``#`` and blank lines between cases are comments::

    # the sequencer orders R1's write
    propose 1 put k v1
    ----
    c1 at R1: put k v1
      R1->R2 CAccept(view=0.0 leader=1 inst=0 ballot=0.1 cmds=[c1 put k v1])

``run_file(path)`` runs every case against a fresh :class:`Cluster` and returns the
file as it should read (the same text with each expected block replaced by the
actual output); ``python3 -m consensus.sim.transcript FILE --rewrite`` (or the test
with ``CELLAR_REWRITE_GOLDEN=1``) writes that back. Commands are in ``Cluster.do_*``
(``help`` lists them); see ``docs/golden-transcripts.md``.

The driver is deterministic and runs the real replicas: lockstep ticks, FIFO
network of envelopes (each crosses the msgpack codec), durable records kept as
msgpack (a restart rebuilds the replica from them), the explorer's counter-based
generator inside each replica. Views and ballots print as ``round.owner`` (view 1.2
is round 1, sequencer R2); commands as ``c<client> <op>`` (client ids count from 1).
"""

from __future__ import annotations

import difflib
import shlex
import sys
from dataclasses import dataclass, field
from typing import Any

import msgpack

from consensus.core.config import END, NOCL, ProtocolConfig, ballot_owner, ballot_round
from consensus.core.executor import RECONFIG
from consensus.core.messages import decode_envelope, encode_envelope
from consensus.core.multipaxos import MultiPaxosReplica
from consensus.core.replica import ALIVE
from consensus.core.sdpaxos import SDPaxosReplica
from consensus.sim.explorer import ExplorerRandom
from consensus.sim.registry import machine_factory

PROTOCOLS = {"sdpaxos": SDPaxosReplica, "multipaxos": MultiPaxosReplica}
NEVER = 10**9  # an election deadline that never comes (a held replica)

# --- rendering ---------------------------------------------------------------------------


def vb(x: int) -> str:
    """A view or ballot as ``round.owner``."""
    return f"{ballot_round(x)}.{ballot_owner(x)}" if x >= 0 else str(x)


def op_text(op: Any) -> str:
    if type(op) is list and op and op[0] == RECONFIG:
        return f"reconfig epoch={op[1]} members={' '.join(op[2])} sequencer={op[3]}"
    return " ".join(str(a) for a in op) if type(op) is list else repr(op)


def cmds_text(cmds: list | None) -> str:
    if cmds is None:
        return "no-op"
    return "[" + ", ".join(f"c{c[0]}" + (f"#{c[1]}" if c[1] != 1 else "") + " " + op_text(c[2]) for c in cmds) + "]"


def leader_text(x: int) -> str:
    return "nocl" if x == NOCL else "END" if x == END else f"R{x}"


def _value(name: str, v: Any, msg: Any) -> str:
    if name in ("view", "ballot", "o_view"):
        return vb(v)
    if name == "cmds":
        return cmds_text(v)
    if name == "leaders":
        return "[" + " ".join(leader_text(x) for x in v) + "]"
    if name == "tick" and type(msg).__name__ == "Ping":
        return {ALIVE: "alive", -1: "behind"}.get(v, str(v))
    if name == "slots":  # Vote: [slot, leader, view, committed]
        return "[" + " ".join(f"{j}:{leader_text(l)}@{vb(w)}" + ("*" if c else "") for j, l, w, c in v) + "]"
    if name == "accepted":  # CPromise: [inst, ballot, cmds, committed]
        return "[" + " ".join(f"{i}:{vb(b)}:{cmds_text(c)}" + ("*" if k else "") for i, b, c, k in v) + "]"
    if name == "batches":  # Multi-Paxos
        return "[" + " ".join(cmds_text(b) for b in v) + "]"
    if type(v) is bool:
        return "true" if v else "false"
    if type(v) is list:
        return "[" + " ".join(str(x) for x in v) + "]"
    return str(v)


def msg_text(m: Any) -> str:
    names = m.__slots__
    if type(m).__name__ == "CCommit" and not m.full:
        names = [n for n in names if n != "cmds"]  # the receiver acked this ballot: no value sent
    return f"{type(m).__name__}(" + " ".join(f"{n}={_value(n, getattr(m, n), m)}" for n in names) + ")"


# --- the datadriven file format -----------------------------------------------------------


@dataclass
class Case:
    cmd: str
    line: int
    expected: list[str]


def parse(text: str) -> list[Any]:
    """Items: a str (a comment/blank line kept verbatim) or a Case."""
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    items: list[Any] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        if not line.strip() or line.lstrip().startswith("#"):
            items.append(line)
            i += 1
            continue
        if i + 1 >= len(lines) or lines[i + 1] != "----":
            raise ValueError(f"line {i + 1}: command {line!r} not followed by ----")
        case = Case(line, i + 1, [])
        i += 2
        while i < len(lines) and lines[i].strip():
            case.expected.append(lines[i])
            i += 1
        items.append(case)
    return items


def render(items: list[Any]) -> str:
    out: list[str] = []
    for it in items:
        if isinstance(it, Case):
            out.append(it.cmd)
            out.append("----")
            out.extend(it.expected)
        else:
            out.append(it)
    return "\n".join(out) + "\n"


def run_text(text: str) -> str:
    """The transcript with every expected block replaced by what the commands print."""
    items = parse(text)
    cluster = Cluster()
    for it in items:
        if isinstance(it, Case):
            out = cluster.run(it.cmd)
            it.expected = [ln.rstrip() or "." for ln in out] or ["ok"]
    return render(items)


def run_file(path: str) -> tuple[str, str]:
    """(text as stored, text as it should be)."""
    with open(path) as f:
        text = f.read()
    return text, run_text(text)


def diff(path: str, old: str, new: str) -> str:
    return "".join(difflib.unified_diff(old.splitlines(True), new.splitlines(True), path, path + " (actual)"))


# --- the cluster -----------------------------------------------------------------------------


class CommandError(Exception):
    pass


@dataclass
class ClientOp:
    client: int
    replica: int
    op: list
    invoked: int
    incarnation: int  # the replica's, when invoked: a restart forgets the command
    result: Any = None
    done: int = -1  # step answered


@dataclass
class Cluster:
    n: int = 0
    protocol: str = "sdpaxos"
    reps: list = field(default_factory=list)  # replica or None (down)
    disks: list = field(default_factory=list)
    incarnation: list = field(default_factory=list)
    net: list = field(default_factory=list)  # [src, dst, [msgs]] in send order
    cuts: set = field(default_factory=set)  # directed (src, dst)
    held: set = field(default_factory=set)
    muted: set = field(default_factory=set)
    ops: list = field(default_factory=list)  # ClientOp, client id = index + 1
    step: int = 0
    exec_map: dict = field(default_factory=dict)
    chosen: dict = field(default_factory=dict)
    violations: list = field(default_factory=list)
    _flagged: set = field(default_factory=set)  # what a violation was reported for (once each)

    # --- dispatch ---------------------------------------------------------------------

    def run(self, line: str) -> list[str]:
        words = shlex.split(line)
        name, args = words[0], words[1:]
        fn = getattr(self, "do_" + name.replace("-", "_"), None)
        if fn is None:
            return [f"error: unknown command {name!r} (try help)"]
        if name not in ("cluster", "help") and not self.reps:
            return ["error: no cluster (start with: cluster n=3)"]
        out: list[str] = []
        try:
            fn(args, out)
        except CommandError as exc:
            out.append(f"error: {exc}")
        return out

    def do_help(self, args: list, out: list) -> None:
        """help: list the commands."""
        for name in sorted(n for n in dir(self) if n.startswith("do_")):
            out.append((getattr(self, name).__doc__ or name).split("\n")[0])

    # --- argument helpers -------------------------------------------------------------

    @staticmethod
    def _kv(args: list) -> tuple[dict, list]:
        kv, rest = {}, []
        for a in args:
            if "=" in a:
                k, v = a.split("=", 1)
                kv[k] = v
            else:
                rest.append(a)
        return kv, rest

    def _rid(self, s: Any) -> int:
        try:
            r = int(str(s).lstrip("R"))
        except ValueError:
            raise CommandError(f"not a replica: {s!r}") from None
        if not 0 <= r < self.n:
            raise CommandError(f"no replica R{r}")
        return r

    def _rids(self, s: str) -> list[int]:
        return [self._rid(x) for x in s.split(",") if x]

    def _live(self, r: int) -> Any:
        rep = self.reps[r]
        if rep is None:
            raise CommandError(f"R{r} is down")
        return rep

    # --- the driver -----------------------------------------------------------------------

    def _build(self, r: int) -> None:
        self.incarnation[r] += 1
        records = [msgpack.unpackb(b, raw=False, strict_map_key=False) for b in self.disks[r]]
        rng = ExplorerRandom(r * 7919 + self.incarnation[r])
        self.reps[r] = PROTOCOLS[self.protocol](r, self.pcfg, machine_factory("kv")(), records=records or None, rng=rng)

    def _shape(self, r: int) -> tuple:
        rep = self.reps[r]
        if rep is None:
            return ("down",)
        return (rep.view, getattr(rep, "phase", "normal"))

    def _touch(self, r: int, fn, out: list, indent: str) -> None:
        """Call ``fn(replica)``, then carry out its Ready, printing the effects."""
        rep = self.reps[r]
        before = self._shape(r)
        try:
            fn(rep)
            if r in self.held:
                rep.election_due = NEVER
            self._drain(r, out, indent)
        except Exception as exc:  # crash-only: a core exception stops the replica
            self.violations.append(f"R{r} stopped: {type(exc).__name__}: {exc}")
            out.append(f"{indent}R{r} stopped: {type(exc).__name__}: {exc}")
            self._crash(r)
            return
        after = self._shape(r)
        if after != before:
            seq = getattr(rep, "sequencer", getattr(rep, "leader", None))
            out.append(f"{indent}R{r} now view {vb(after[0])} {after[1]} (sequencer R{seq})")

    def _drain(self, r: int, out: list, indent: str) -> None:
        rep = self.reps[r]
        rd = rep.ready(sync=True)  # records go to disk first
        if rd.persist:
            self.disks[r] = self.disks[r] + [msgpack.packb(rec, use_bin_type=True) for rec in rd.persist]
        for dst, msgs in rd.urgent + rd.messages:
            if self.reps[dst] is None or (r, dst) in self.cuts:
                continue
            _src, msgs = decode_envelope(encode_envelope(r, msgs))
            self.net.append([r, dst, msgs])
            shown = self._show(r, dst, msgs)
            if shown:
                out.append(indent + shown)
        for ex in rd.executed:
            ids = tuple((c[0], c[1]) for c in ex.cmds) if ex.cmds else ()
            label = tuple(ex.label)
            out.append(f"{indent}R{r} executes slot {ex.slot}: " + (
                "nocl" if label[0] == NOCL else "END: the epoch is over here" if label[0] == END
                else f"R{label[0]}.{label[1]} {cmds_text(ex.cmds)}"))
            seen = self.exec_map.setdefault(ex.slot, (label, ids))
            if seen != (label, ids) and ("exec", ex.slot) not in self._flagged:
                self._flagged.add(("exec", ex.slot))
                self.violations.append(f"agreement: slot {ex.slot} executed as {self._exec_text((label, ids))} at R{r}, "
                                       f"as {self._exec_text(seen)} before")
        for rp in rd.replies:
            c = rp.client
            if type(c) is int and 1 <= c <= len(self.ops) and self.ops[c - 1].done < 0 and rp.ok:
                o = self.ops[c - 1]
                o.result, o.done = rp.result, self.step
            out.append(f"{indent}R{r} answers c{c}: " + ("ok" if rp.result is None else repr(rp.result))
                       + ("" if rp.ok else f" (error {rp.error})"))
        self._note_chosen(r)

    @staticmethod
    def _exec_text(entry: tuple) -> str:
        label, ids = entry
        return ("nocl" if label[0] == NOCL else "END" if label[0] == END else f"R{label[0]}.{label[1]}") + (
            " [" + " ".join(f"c{c}" for c, _ in ids) + "]" if ids else " no-op")

    def _note_chosen(self, r: int) -> None:
        rep = self.reps[r]
        if self.protocol == "sdpaxos":
            for leader, log in enumerate(rep.clog):
                for inst, c in log.items():
                    if c.committed:
                        self._chosen(("C", leader, inst), cmds_text(c.cmds), r, f"C-instance R{leader}.{inst}")
            for j, s in rep.oslots.items():
                if s.committed:
                    self._chosen(("O", j), leader_text(s.leader), r, f"O-slot {j}")
        else:
            for j, s in rep.log.items():
                if s.committed:
                    self._chosen(("M", j), cmds_text(s.batch), r, f"slot {j}")

    def _violation(self, key: tuple, text: str) -> None:
        if key not in self._flagged:
            self._flagged.add(key)
            self.violations.append(text)

    def _chosen(self, key: tuple, value: str, r: int, what: str) -> None:
        seen = self.chosen.setdefault(key, value)
        if seen != value and key not in self._flagged:
            self._flagged.add(key)
            self.violations.append(f"chosen: {what} committed as {value} at R{r}, as {seen} before")

    def _show(self, src: int, dst: int, msgs: list) -> str:
        shown = [msg_text(m) for m in msgs if type(m).__name__ not in self.muted]
        return f"R{src}->R{dst} " + " + ".join(shown) if shown else ""

    def _crash(self, r: int) -> None:
        self.reps[r] = None
        self.net = [it for it in self.net if it[1] != r]

    def _deliver(self, item: list, out: list) -> None:
        src, dst, msgs = item
        self.step += 1
        sub: list[str] = []
        self._touch(dst, lambda rep: rep.step(src, msgs), sub, "  ")
        shown = self._show(src, dst, msgs)
        if sub and not shown:  # a muted message with a visible effect is shown after all
            shown = f"R{src}->R{dst} " + " + ".join(msg_text(m) for m in msgs)
        if shown:
            out.append(shown)
        out.extend(sub)

    def _tick(self, rs: list[int], out: list) -> None:
        self.step += 1
        for r in rs:
            if self.reps[r] is None:
                continue
            sub: list[str] = []
            self._touch(r, lambda rep: rep.tick(), sub, "  ")
            if sub:
                out.append(f"R{r} tick @{self.reps[r].now if self.reps[r] is not None else '-'}:")
                out.extend(sub)

    def _select(self, args: list) -> tuple[list[int], Any]:
        """Indices into ``net`` and a message filter, from from=/to=/type= selectors."""
        kv, rest = self._kv(args)
        srcs = self._rids(kv["from"]) if "from" in kv else None
        dsts = self._rids(kv["to"]) if "to" in kv else None
        types = set(kv["type"].split(",")) if "type" in kv else None
        for a in rest:
            if a != "all":
                raise CommandError(f"unknown selector {a!r} (from=R to=R type=T n=K)")
        idx = [i for i, (s, d, msgs) in enumerate(self.net)
               if (srcs is None or s in srcs) and (dsts is None or d in dsts)
               and (types is None or any(type(m).__name__ in types for m in msgs))]
        if "n" in kv:
            idx = idx[: int(kv["n"])]
        return idx, (lambda m: type(m).__name__ in types) if types is not None else (lambda m: True)

    def _take(self, args: list) -> list[list]:
        """Remove the selected messages from the network (splitting envelopes by type)."""
        idx, keep = self._select(args)
        taken, left = [], []
        chosen = set(idx)
        for i, (s, d, msgs) in enumerate(self.net):
            if i not in chosen:
                left.append([s, d, msgs])
                continue
            mine = [m for m in msgs if keep(m)]
            rest = [m for m in msgs if not keep(m)]
            taken.append([s, d, mine])
            if rest:
                left.append([s, d, rest])
        self.net = left
        return taken

    def _deliver_all(self, out: list, cap: int = 10_000) -> int:
        count = 0
        while self.net and count < cap:
            self._deliver(self.net.pop(0), out)
            count += 1
        return count

    def _quiet(self) -> bool:
        if self.net:
            return False
        live = [r for r in self.reps if r is not None]
        if live and all(getattr(rep, "ended", -1) >= 0 for rep in live):
            return True  # the epoch is over everywhere: what is unanswered stays so
        if any(o.done < 0 and self.reps[o.replica] is not None and self.incarnation[o.replica] == o.incarnation
               for o in self.ops):
            return False
        if not all(rep.idle() for rep in live):
            return False
        if len({(rep.view, rep.exec_slot) for rep in live}) > 1:
            return False
        return all(getattr(rep, "phase", "normal") == "normal" for rep in live)

    # --- commands: set-up --------------------------------------------------------------

    def do_cluster(self, args: list, out: list) -> None:
        """cluster n=3 [protocol=sdpaxos|multipaxos] [heartbeat=2 election=10 lease=8 resend=6 recovery=4]
        [thrifty=true] [elections=manual|auto] [peers=1,2/2,0/0,1] [rtt=fixed|measure] [straggler=W [floor=F]]:
        a fresh cluster (R0 serves view 0.0); rtt=measure: replicas probe each other and order their peers by
        round trip; straggler=W: each replica judges the sequencer every W ticks (paper §4), holding it to its
        fastest ready time but at least F ticks (default 1)."""
        kv, rest = self._kv(args)
        if rest:
            raise CommandError(f"unexpected {rest}")
        n = int(kv.pop("n", 3))
        self.__init__()  # type: ignore[misc]
        self.n = n
        self.protocol = kv.pop("protocol", "sdpaxos")
        if self.protocol not in PROTOCOLS:
            raise CommandError(f"protocol {self.protocol!r}: want sdpaxos or multipaxos")
        timers = {"heartbeat": 2, "election": 10, "lease": 8, "resend": 6, "recovery": 4}
        for k in list(timers):
            if k in kv:
                timers[k] = int(kv.pop(k))
        thrifty = kv.pop("thrifty", "true") == "true"
        manual = kv.pop("elections", "manual") == "manual"
        peers = ()
        if "peers" in kv:
            peers = tuple(tuple(int(x) for x in g.split(",")) for g in kv.pop("peers").split("/"))
        # straggler=W: judge the sequencer every W ticks (paper §4; demand of one
        # instance, no cooldown); off by default, so that no window fires in a schedule.
        straggler: dict = {"straggler_window_ticks": 1 << 60}
        if "straggler" in kv:
            straggler = {"straggler_window_ticks": int(kv.pop("straggler")), "straggler_min_demand": 1,
                         "straggler_cooldown_ticks": 0}
            if "floor" in kv:
                straggler["straggler_floor_ticks"] = int(kv.pop("floor"))
        rtt = kv.pop("rtt", "fixed")  # fixed: peer_order as given; measure: probes and echoes
        if rtt not in ("fixed", "measure"):
            raise CommandError(f"rtt={rtt!r}: want fixed or measure")
        if kv:
            raise CommandError(f"unknown options {sorted(kv)}")
        self.pcfg = ProtocolConfig(
            n=n, heartbeat_ticks=timers["heartbeat"], election_ticks=timers["election"], lease_ticks=timers["lease"],
            resend_ticks=timers["resend"], recovery_ticks=timers["recovery"], thrifty=thrifty,
            peer_order=peers, measure_rtt=rtt == "measure", **straggler)
        self.reps = [None] * n
        self.disks = [[] for _ in range(n)]
        self.incarnation = [0] * n
        if manual:
            self.held = set(range(n))
        for r in range(n):
            self._build(r)
            self._touch(r, lambda rep: None, out, "")
        out.append(f"{self.protocol} N={n} quorum={self.pcfg.quorum}; ticks: heartbeat {timers['heartbeat']}, "
                   f"election {timers['election']}, lease {timers['lease']}, resend {timers['resend']}, "
                   f"recovery {timers['recovery']}; thrifty {'on' if thrifty else 'off'}; "
                   f"elections {'manual (campaign R)' if manual else 'by timeout'}")

    def do_mute(self, args: list, out: list) -> None:
        """mute Type...: stop printing these message types (still delivered; shown when their delivery has a visible effect)."""
        self.muted |= set(args)
        out.append("muted: " + (" ".join(sorted(self.muted)) or "nothing"))

    def do_unmute(self, args: list, out: list) -> None:
        """unmute [Type...]: print these message types again (all when none given)."""
        self.muted = self.muted - set(args) if args else set()
        out.append("muted: " + (" ".join(sorted(self.muted)) or "nothing"))

    def do_hold(self, args: list, out: list) -> None:
        """hold R...: R's election timer never fires (the schedule picks who stands)."""
        for r in self._rids(",".join(args)):
            self.held.add(r)
            if self.reps[r] is not None:
                self.reps[r].election_due = NEVER
        out.append("held: " + (" ".join(f"R{r}" for r in sorted(self.held)) or "none"))

    def do_release(self, args: list, out: list) -> None:
        """release R...: R's election timer runs again (from now)."""
        for r in self._rids(",".join(args)):
            self.held.discard(r)
            rep = self.reps[r]
            if rep is not None:
                rep.election_due = rep._election_deadline()
        out.append("held: " + (" ".join(f"R{r}" for r in sorted(self.held)) or "none"))

    # --- commands: clients -------------------------------------------------------------

    def _invoke(self, r: int, op: list, fn, out: list) -> None:
        self._live(r)
        client = len(self.ops) + 1
        self.step += 1
        self.ops.append(ClientOp(client, r, op, self.step, self.incarnation[r]))
        out.append(f"c{client} at R{r}: {op_text(op)}")
        self._touch(r, lambda rep: fn(rep, client), out, "  ")

    def do_propose(self, args: list, out: list) -> None:
        """propose R put K V | cas K OLD NEW | get K: a client command through the log."""
        if len(args) < 2:
            raise CommandError("propose R op...")
        r, op = self._rid(args[0]), list(args[1:])
        self._invoke(r, op, lambda rep, c: rep.propose(c, 1, op, needs_result=op[0] != "put"), out)

    def do_reconfig(self, args: list, out: list) -> None:
        """reconfig R NAME NAME NAME...: ask at R to close epoch 0 with these members (the
        first is the next sequencer; docs/membership.md)."""
        if len(args) < 2:
            raise CommandError("reconfig R member...")
        r, op = self._rid(args[0]), [RECONFIG, 0, list(args[1:]), args[1]]
        self._invoke(r, op, lambda rep, c: rep.propose(c, 1, op, needs_result=True), out)

    def do_read(self, args: list, out: list) -> None:
        """read R K: a lease read of K at R (through the sequencer's lease when it has one)."""
        if len(args) != 2:
            raise CommandError("read R key")
        r, key = self._rid(args[0]), args[1]
        op = ["get", key]
        rep = self._live(r)
        if not hasattr(rep, "read"):
            raise CommandError(f"{self.protocol} has no lease reads")
        self._invoke(r, op, lambda rep, c: rep.read(c, 1, op, key), out)

    # --- commands: network and time ----------------------------------------------------

    def do_deliver(self, args: list, out: list) -> None:
        """deliver [from=R,..] [to=R,..] [type=T,..] [n=K]: deliver the selected messages now in flight, oldest first."""
        taken = self._take(args)
        if not taken:
            out.append("nothing to deliver")
        for item in taken:
            if self.reps[item[1]] is not None:
                self._deliver(item, out)

    def do_drop(self, args: list, out: list) -> None:
        """drop [from=R,..] [to=R,..] [type=T,..] [n=K]: lose the selected messages now in flight."""
        taken = self._take(args)
        hidden = 0
        for s, d, msgs in taken:
            shown = self._show(s, d, msgs)
            hidden += sum(1 for m in msgs if type(m).__name__ in self.muted)
            if shown:
                out.append("dropped " + shown)
        if hidden:
            out.append(f"dropped {hidden} muted message(s)")
        if not taken:
            out.append("nothing to drop")

    def do_msgs(self, args: list, out: list) -> None:
        """msgs [selectors]: list the messages in flight."""
        idx, keep = self._select(args)
        for i in idx:
            s, d, msgs = self.net[i]
            out.append(f"R{s}->R{d} " + " + ".join(msg_text(m) for m in msgs if keep(m)))
        if not idx:
            out.append("no messages in flight")

    def do_tick(self, args: list, out: list) -> None:
        """tick [K] [at=R,..]: K ticks (default 1) at every live replica (or only at the listed ones:
        their clocks run ahead); nothing is delivered."""
        kv, rest = self._kv(args)
        k = int(rest[0]) if rest else 1
        rs = self._rids(kv["at"]) if "at" in kv else list(range(self.n))
        for _ in range(k):
            self._tick(rs, out)

    def do_run(self, args: list, out: list) -> None:
        """run K [brief]: K times: deliver everything in flight (and what that sends), then tick."""
        k = int(args[0]) if args and args[0].isdigit() else 1
        brief = "brief" in args
        sub: list[str] = []
        for _ in range(k):
            self._deliver_all(sub)
            self._tick(list(range(self.n)), sub)
        self._deliver_all(sub)
        out.extend(self._brief(sub) if brief else sub)

    def do_stabilize(self, args: list, out: list) -> None:
        """stabilize [max=K] [brief]: deliver everything, ticking between rounds, until the cluster is quiet."""
        kv, rest = self._kv(args)
        limit = int(kv.get("max", 200))
        sub: list[str] = []
        ticks = 0
        self._deliver_all(sub)
        while not self._quiet() and ticks < limit:
            self._tick(list(range(self.n)), sub)
            ticks += 1
            self._deliver_all(sub)
        out.extend(self._brief(sub) if "brief" in rest else sub)
        out.append(f"quiet after {ticks} ticks" if self._quiet() else f"not quiet after {ticks} ticks")

    @staticmethod
    def _brief(lines: list[str]) -> list[str]:
        keep = (" executes ", " answers ", " now view ", " stopped: ")
        return [ln.strip() for ln in lines if any(k in ln for k in keep)]

    def _cut(self, pairs: list[tuple[int, int]], out: list) -> None:
        self.cuts |= set(pairs)
        before = len(self.net)
        self.net = [it for it in self.net if (it[0], it[1]) not in self.cuts]
        lost = before - len(self.net)
        out.append("cut: " + " ".join(f"R{a}->R{b}" for a, b in sorted(self.cuts))
                   + (f" ({lost} in flight lost)" if lost else ""))

    def do_cut(self, args: list, out: list) -> None:
        """cut A->B | A-B ...: lose everything sent from A to B (A-B: both ways)."""
        pairs = []
        for a in args:
            if "->" in a:
                x, y = a.split("->")
                pairs.append((self._rid(x), self._rid(y)))
            elif "-" in a:
                x, y = a.split("-")
                pairs += [(self._rid(x), self._rid(y)), (self._rid(y), self._rid(x))]
            else:
                raise CommandError(f"cut A->B or A-B, not {a!r}")
        self._cut(pairs, out)

    def do_partition(self, args: list, out: list) -> None:
        """partition 0,1 | 2,3,4: cut every link between the groups, both ways."""
        groups = [self._rids(g) for g in " ".join(args).replace(" ", "").split("|")]
        pairs = [(a, b) for g in groups for h in groups if g is not h for a in g for b in h]
        self._cut(pairs, out)

    def do_isolate(self, args: list, out: list) -> None:
        """isolate R: cut R from every other replica, both ways."""
        r = self._rid(args[0])
        self._cut([(r, p) for p in range(self.n) if p != r] + [(p, r) for p in range(self.n) if p != r], out)

    def do_heal(self, args: list, out: list) -> None:
        """heal [A-B ...]: restore the given links (both ways), or every link."""
        if not args:
            self.cuts = set()
        for a in args:
            x, y = (self._rid(v) for v in a.replace("->", "-").split("-"))
            self.cuts -= {(x, y), (y, x)}
        out.append("cut: " + (" ".join(f"R{a}->R{b}" for a, b in sorted(self.cuts)) or "nothing"))

    def do_crash(self, args: list, out: list) -> None:
        """crash R: R stops; what is in flight to it is lost; its durable records stay."""
        r = self._rid(args[0])
        self._live(r)
        self._crash(r)
        out.append(f"R{r} crashed ({len(self.disks[r])} durable records)")

    def do_restart(self, args: list, out: list) -> None:
        """restart R: rebuild R from its durable records (a new incarnation, clock at 0)."""
        r = self._rid(args[0])
        if self.reps[r] is not None:
            raise CommandError(f"R{r} is up")
        self._build(r)
        out.append(f"R{r} restarted from {len(self.disks[r])} records")
        self._touch(r, lambda rep: None, out, "  ")
        self.do_status([str(r)], out)

    # --- commands: protocol actions (a schedule's choice of who acts) ------------------

    def do_campaign(self, args: list, out: list) -> None:
        """campaign R: R stands for election now (skipping pre-vote), as its timer would."""
        r = self._rid(args[0])
        self._live(r)
        self._touch(r, lambda rep: rep._start_election(), out, "")

    def do_prevote(self, args: list, out: list) -> None:
        """prevote R: R asks for pre-votes (it stands if a majority grants them)."""
        r = self._rid(args[0])
        self._live(r)
        self._touch(r, lambda rep: rep._start_prevote(), out, "")

    def do_recover(self, args: list, out: list) -> None:
        """recover R leader=L [from=I] [upto=J]: R starts C-instance recovery (prepare) of L's instances."""
        kv, rest = self._kv(args)
        r = self._rid(rest[0])
        leader = self._rid(kv["leader"])
        lo = int(kv.get("from", 0))
        hi = int(kv.get("upto", lo))
        self._live(r)
        self._touch(r, lambda rep: rep._start_crecovery(leader, lo, hi), out, "")

    # --- commands: observation ---------------------------------------------------------

    def do_status(self, args: list, out: list) -> None:
        """status [R,..]: one line per replica."""
        rs = self._rids(args[0]) if args else range(self.n)
        for r in rs:
            rep = self.reps[r]
            if rep is None:
                out.append(f"R{r} down")
                continue
            out.append(self._status_line(r, rep))

    def do_near(self, args: list, out: list) -> None:
        """near [R,..]: each replica's peers in the order it asks them (nearest first),
        with the smoothed round trip it measured (ticks; ? = not yet measured)."""
        rs = self._rids(args[0]) if args else range(self.n)
        for r in rs:
            rep = self.reps[r]
            if rep is None:
                out.append(f"R{r} down")
                continue
            rtt = rep.near.rtt
            peers = ", ".join(f"R{p} {rtt[p]:g}" if rtt[p] != float("inf") else f"R{p} ?" for p in rep.near.order)
            out.append(f"R{r} asks {peers}; thrifty quorum {rep.live_peers()[: rep.quorum - 1]}")

    def _status_line(self, r: int, rep: Any) -> str:
        if self.protocol != "sdpaxos":
            return (f"R{r} view {vb(rep.view)} leader R{rep.leader} {rep.phase} now {rep.now}: "
                    f"prefix {rep.prefix} committed {rep.committed} executed {rep.exec_slot}")
        if rep.id == rep.sequencer and rep.phase == "normal":
            lease = f"lease until {rep.lease_expiry}" if rep.now < rep.lease_expiry else "no lease"
        elif rep.now < rep.lease_until and rep.lease_to != rep.id:
            lease = f"promised R{rep.lease_to} until {rep.lease_until}"
        else:
            lease = "no promise"
        return (f"R{r} view {vb(rep.view)} seq R{rep.sequencer} {rep.phase} now {rep.now} {lease}: "
                f"o_prefix {rep.o_prefix} o_committed {rep.o_committed} executed {rep.exec_slot}"
                + (f" unready {sorted(rep.unready)}" if rep.unready else ""))

    def do_log(self, args: list, out: list) -> None:
        """log [R,..]: a replica's logs: O-log, C-logs per leader, executed state."""
        rs = self._rids(args[0]) if args else [r for r in range(self.n) if self.reps[r] is not None]
        for r in rs:
            rep = self.reps[r]
            if rep is None:
                out.append(f"R{r} down")
                continue
            out.append(self._status_line(r, rep))
            if self.protocol == "sdpaxos":
                parts = []
                for j in sorted(rep.oslots):
                    s = rep.oslots[j]
                    flags = ("committed" if s.committed else "accepted") + (" fast" if s.fast else "")
                    parts.append(f"{j}:{leader_text(s.leader)}@{vb(s.view)} {flags}")
                out.append("  O-log: " + (", ".join(parts) or "-") + f" (o_view {vb(rep.o_view)})")
                for leader in range(self.n):
                    log = rep.clog[leader]
                    if not log:
                        continue
                    parts = [f"{i}:{vb(c.ballot)} {cmds_text(c.cmds)}" + (" committed" if c.committed else "")
                             for i, c in sorted(log.items())]
                    out.append(f"  C-log R{leader}: " + ", ".join(parts))
            else:
                parts = [f"{j}:{vb(s.view)} {cmds_text(s.batch)}" + (" committed" if s.committed else "")
                         for j, s in sorted(rep.log.items())]
                out.append("  log: " + (", ".join(parts) or "-"))
            data = rep.executor.sm.data
            out.append(f"  executed {rep.exec_slot} slot(s); kv {{" + ", ".join(f"{k}: {data[k]}" for k in sorted(data, key=str)) + "}")

    def do_history(self, args: list, out: list) -> None:
        """history: the client commands so far and their answers."""
        for o in self.ops:
            res = "pending" if o.done < 0 else ("ok" if o.result is None else repr(o.result))
            out.append(f"c{o.client} at R{o.replica}: {op_text(o.op)} -> {res}")
        if not self.ops:
            out.append("no client commands")

    def do_check(self, args: list, out: list) -> None:
        """check: agreement (executed slots, chosen C-instances and O-slots, over every
        incarnation so far) and linearizability of the answers so far (jepsen_like)."""
        for r in range(self.n):
            if self.reps[r] is not None:
                self._note_chosen(r)
        ends = sorted({rep.ended for rep in self.reps if rep is not None and getattr(rep, "ended", -1) >= 0})
        if ends:
            end = ends[0]
            for key in sorted(k for k in self.chosen if k[0] == "O" and k[1] > end):
                self._violation(key, f"O-slot {key[1]} chosen after the END at slot {end}")
            executed = {i for label, ids in self.exec_map.values() for i in ids}
            for o in self.ops:
                if o.done >= 0 and o.op[0] not in ("get", RECONFIG) and (o.client, 1) not in executed:
                    self._violation(("lost", o.client), f"c{o.client} was answered and the epoch ended without it")
        if self.violations:
            out.extend("VIOLATION " + v for v in self.violations)
        else:
            out.append(f"agreement: ok ({len(self.exec_map)} slots executed, {len(self.chosen)} values chosen)")
        if ends:
            who = " ".join(f"R{r}" for r, rep in enumerate(self.reps) if rep is not None and getattr(rep, "ended", -1) >= 0)
            out.append(f"epoch: END at slot {', '.join(map(str, ends))} ({who})")
        result = self._linearizable()
        verdict = result.linearizable
        out.append("linearizable: " + {True: "yes", False: "NO", None: "unknown"}[verdict]
                   + f" ({sum(1 for o in self.ops if o.done >= 0)} of {len(self.ops)} commands answered)")
        v = result.violation
        if verdict is False and v is not None:
            b = v.blocked
            what = "?" if b is None else f"c{b.process} {b.f}" + (f" -> {b.result!r}" if b.f == "get" else f" {b.value!r}")
            out.append(f"  key {v.key}: " + (v.reason or f"no order of the answers explains {what}"))

    def _linearizable(self) -> Any:
        from jepsen_like.checker import check
        from jepsen_like.history import Op
        from jepsen_like.models import KV

        events = []
        for o in self.ops:
            if o.op[0] == RECONFIG:
                continue  # no key-value operation
            events.append((o.invoked, 0, o, "invoke"))
            if o.done >= 0:
                events.append((o.done, 1, o, "ok"))
        events.sort(key=lambda e: (e[0], e[1], e[2].client))
        hist = []
        for t, _, o, kind in events:
            name, key = o.op[0], o.op[1]
            if name == "cas":
                f, value = "cas", (key, (o.op[2], o.op[3]))
                if kind == "ok" and o.result is not True:
                    kind = "fail"
            elif name == "get":
                f, value = "get", (key, o.result if kind == "ok" else None)
            else:
                f, value = "put", (key, o.op[2])
            hist.append(Op(len(hist), t, o.client, kind, f, value))
        for o in self.ops:
            if o.done < 0 and o.op[0] != RECONFIG:
                f = "get" if o.op[0] == "get" else o.op[0]
                value = (o.op[1], (o.op[2], o.op[3])) if f == "cas" else (o.op[1], None if f == "get" else o.op[2])
                hist.append(Op(len(hist), self.step + 1, o.client, "info", f, value))
        return check(hist, KV(), timeout_s=5.0)


def main(argv: list[str] | None = None) -> int:
    import argparse

    ap = argparse.ArgumentParser(description="Run golden transcripts (show the diff, or --rewrite them).")
    ap.add_argument("files", nargs="+")
    ap.add_argument("--rewrite", action="store_true", help="write the actual output back into the files")
    ns = ap.parse_args(argv)
    status = 0
    for path in ns.files:
        old, new = run_file(path)
        if old == new:
            continue
        if ns.rewrite:
            with open(path, "w") as f:
                f.write(new)
            print(f"rewrote {path}")
        else:
            sys.stdout.write(diff(path, old, new))
            status = 1
    return status


if __name__ == "__main__":
    from store.machines import install_in_simulator  # the composition root (consensus.sim.registry)

    install_in_simulator()
    sys.exit(main())
