"""Every decision the operator makes, as pure functions of what it observed (``Observed``).

``assess`` judges the quorum: which leader can be trusted, which voters are caught up, which
voters' volumes are gone, whether a majority is lost. ``plan`` then picks what to do this pass,
in this order, stopping at the first step that has something to do or must wait:

1. Nothing while paused, and nothing but status once a majority of voters lost their volumes
   (QuorumLost: recovery is manual, see docs/operator.md).
2. Create the volume claims and pods that members lack (several at once: this only restores
   what should run, it changes no membership).
   Then delete a pod the kubelet failed for good (phase Failed: evicted, or stopped by a node
   shutdown), one at a time, so that it is made again: its node is down already, so neither a
   leader nor a caught-up majority is needed (``_replace_failed`` says why). One it rejected
   at admission is replaced only after a growing back-off (``_backing_off``).
3. Finish a voter change recorded in status (after an operator restart, or a timed-out call).
4. Remediation of a replaced volume (KIP-856): once the new replica, an observer with the
   voter's node id and a new directory id, has been caught up long enough, AddVoter(id, new),
   then RemoveVoter(id, old).
5. Delete pods and claims of members that are no longer wanted (scale-down, after RemoveVoter).
6. Scale-down: RemoveVoter of the highest id beyond ``spec.replicas``, one at a time (before
   any rolling update: the voters list shrinks once, at the end).
7. Rolling update of pods whose configuration is outdated: unready first, then observers, then
   followers, the leader last, one at a time, each after the quorum check.
8. Scale-up: AddVoter of the new member once caught up, one at a time (after the rolling
   update that adds its id to every node's voters list: AddVoter only takes configured ids).

Voter changes and deletions are one at a time; every voter change is gated on a trusted leader
and on a majority of the voters other than the one concerned being caught up.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace

from kafka_quorum_operator.observe import (
    TLS_SWITCH_STAGES,
    VOTER_CHANGES,
    ActionKind,
    MemberRecord,
    Observed,
    PendingChange,
    QuorumView,
    ReplicaRow,
    TlsSwitch,
    foreign_claims,
)

VoterKey = tuple[int, str | None]

ADD_VOTER = ActionKind.ADD_VOTER
REMOVE_VOTER = ActionKind.REMOVE_VOTER
REMEDIATION = "Remediation"
SCALE_UP = "ScaleUp"
SCALE_DOWN = "ScaleDown"
ROLLING_UPDATE = "RollingUpdate"
POD_FAILED = "Failed"


def majority(count: int) -> int:
    return count // 2 + 1


@dataclass(frozen=True)
class Action:
    """One change to make (``kind`` says which; the reconciler has a handler for each)."""

    kind: ActionKind
    node_id: int
    reason: str = ""
    directory_id: str | None = None
    old_directory_id: str | None = None

    @property
    def is_voter_change(self) -> bool:
        return self.kind in VOTER_CHANGES

    def pending(self, started: str) -> PendingChange:
        assert self.directory_id is not None
        return PendingChange(kind=self.kind, node_id=self.node_id,
                             directory_id=self.directory_id, reason=self.reason,
                             started=started, old_directory_id=self.old_directory_id)


@dataclass(frozen=True)
class Assessment:
    voters: tuple[VoterKey, ...]  # the voter set in force (trusted leader's view, else recorded)
    leader_id: int | None  # a leader whose view can be acted on
    untrusted_leader: int | None  # a replica claiming leadership of another voter set
    caught_up: frozenset[VoterKey]
    lost: frozenset[VoterKey]  # voters whose volume is gone
    bootstrapped: bool
    current_directories: Mapping[int, str]  # each node's own directory id, where it is known

    @property
    def quorum_lost(self) -> bool:
        if not self.voters:
            return False
        intact = sum(1 for key in self.voters if key not in self.lost)
        return intact < majority(len(self.voters))

    @property
    def voter_ids(self) -> frozenset[int]:
        return frozenset(node_id for node_id, _ in self.voters)

    def others_caught_up(self, excluding: int) -> int:
        return sum(1 for key in self.voters if key[0] != excluding and key in self.caught_up)


@dataclass(frozen=True)
class Plan:
    actions: tuple[Action, ...]
    assessment: Assessment
    members: tuple[MemberRecord, ...]
    pending: PendingChange | None  # what status.pendingChange should say after this pass
    waiting: str = ""  # why nothing (more) is done, for the status message
    blocked: Mapping[str, str] = field(default_factory=dict)  # condition type -> message


# --- assessment ---------------------------------------------------------------------------------


def is_caught_up(row: ReplicaRow, quorum: QuorumView, fetch_timeout_ms: int) -> bool:
    """Strimzi's KafkaQuorumCheck rule: the leader, or a replica whose last caught-up time is
    within the fetch timeout of the leader's (or that has no lag at all)."""
    if row.node_id == quorum.leader_id:
        return True
    if row.lag == 0:
        return True
    return row.last_caught_up_ms >= 0 and \
        quorum.now_ms - row.last_caught_up_ms < fetch_timeout_ms


def recorded_voters(members: Mapping[int, MemberRecord]) -> tuple[VoterKey, ...]:
    return tuple(sorted((m.node_id, m.directory_id) for m in members.values()
                        if m.directory_id is not None))


def trusts(quorum: QuorumView, recorded: Iterable[VoterKey]) -> bool:
    """Whether a leader's voter set continues the one recorded while healthy: it must hold a
    majority of the recorded voters, directory ids included. Two wiped replicas of three can
    elect each other (their empty logs know the voters by id only); their "leader" describes
    voters with new directory ids, and acting on it would finish off the real quorum."""
    known = set(recorded)
    if not known:
        return True  # nothing recorded yet: the first bootstrap
    described = {row.key for row in quorum.voters}
    return len(known & described) >= majority(len(known))


def assess(observed: Observed) -> Assessment:
    spec = observed.spec
    current = {node_id: view.directory_id for node_id, view in observed.nodes.items()
               if view.directory_id is not None}
    recorded = recorded_voters(observed.members)
    quorum = observed.quorum
    trusted = quorum is not None and trusts(quorum, recorded)
    if quorum is not None and trusted:
        voters = tuple(sorted(row.key for row in quorum.voters))
        caught_up = frozenset(row.key for row in quorum.voters
                              if is_caught_up(row, quorum, spec.fetch_timeout_ms))
        leader: int | None = quorum.leader_id
        # A new directory that fetches is the node's current one, even before its pod's
        # metrics say so. Only one that fetched lately: the leader keeps listing an observer
        # that stopped (a replacement's first replica, gone with its pod), and taking that for
        # the node's directory while its pod restarts would call a kept volume replaced.
        for row in quorum.observers:
            if row.directory_id is not None and row.node_id not in current and \
                    row.last_fetch_ms >= 0 and \
                    quorum.now_ms - row.last_fetch_ms < spec.fetch_timeout_ms:
                current[row.node_id] = row.directory_id
    else:
        voters, caught_up, leader = recorded, frozenset(), None
    bootstrapped = observed.bootstrapped or (
        quorum is not None and trusted and _looks_bootstrapped(quorum))
    lost = frozenset(key for key in voters if _volume_lost(observed, key, current))
    return Assessment(
        voters=voters, leader_id=leader,
        untrusted_leader=quorum.leader_id if quorum is not None and not trusted else None,
        caught_up=caught_up, lost=lost, bootstrapped=bootstrapped,
        current_directories=current,
    )


def _looks_bootstrapped(quorum: QuorumView) -> bool:
    """The first leader writes the voters (with their directory ids) once every configured voter
    has fetched; every voter known by directory id and without lag means that record is
    replicated to all of them, so committed. (DescribeQuorum does not say it outright.)"""
    return quorum.high_watermark > 0 and all(
        row.directory_id is not None and row.last_fetch_ms >= 0 and row.lag == 0
        for row in quorum.voters)


def _volume_lost(observed: Observed, key: VoterKey, current: Mapping[int, str]) -> bool:
    node_id, directory_id = key
    record = observed.members.get(node_id)
    claim = observed.claims.get(node_id)
    now = current.get(node_id)
    if record is not None and record.claim_uid is not None and (
            claim is None or claim.uid != record.claim_uid or claim.terminating):
        # The claim was deleted or replaced: a new, empty volume. Only the directory the node
        # runs on the new claim is not lost (added already; the record moves on next pass).
        return claim is None or claim.terminating or now is None or now != directory_id
    return directory_id is not None and now is not None and now != directory_id


# --- the plan -----------------------------------------------------------------------------------


def configured_voter_ids(observed: Observed, assessment: Assessment) -> tuple[int, ...]:
    """The ids in ``controller.quorum.voters``: 1..N, N covering the spec, every voter, and every
    member that still has a pod or claim (AddVoter only takes configured ids, KIP-856)."""
    highest = max([observed.spec.replicas, *assessment.voter_ids, *observed.pods,
                   *observed.claims], default=observed.spec.replicas)
    return tuple(range(1, highest + 1))


def wanted_ids(observed: Observed, assessment: Assessment) -> frozenset[int]:
    """The members that should have a claim and a pod now."""
    if not assessment.bootstrapped:
        return frozenset(configured_voter_ids(observed, assessment))
    wanted = set(assessment.voter_ids)
    to_add = next_to_add(observed, assessment)
    if to_add is not None:
        wanted.add(to_add)
    return frozenset(wanted)


def next_to_add(observed: Observed, assessment: Assessment) -> int | None:
    """The next member of a scale-up: the lowest id of the spec that is not a voter, once the
    voters are fewer than the spec asks for."""
    voter_ids = assessment.voter_ids
    if len(voter_ids) >= observed.spec.replicas:
        return None
    return next((i for i in range(1, observed.spec.replicas + 1) if i not in voter_ids), None)


def tls_switch_started(observed: Observed, recorded: TlsSwitch | None) -> TlsSwitch | None:
    """The TLS switch to roll to: the one recorded, or a new one (stage 1) once a pod serves
    another protocol than spec.security.tls asks for (``observe.client_tls_of``). A switch
    runs to its end even if the spec flips back meanwhile (``tls_switch_after`` then starts the
    way back): every stage is only safe next to its neighbours."""
    if recorded is not None:
        return recorded
    wanted = observed.spec.security.tls
    if any(pod.tls is not None and pod.tls != wanted and not pod.terminating
           for pod in observed.pods.values()):
        return TlsSwitch(enabled=wanted, stage=1)
    return None


def tls_switch_after(observed: Observed) -> TlsSwitch | None:
    """The switch after this pass: the next stage once every member's pod runs this stage's
    configuration (``observed.config_hash``) and is ready, and a leader answers; after the last
    stage, None (the steady configuration), or the way back if the spec flipped meanwhile."""
    switch = observed.tls_switch
    if switch is None:
        return None
    assessment = assess(observed)
    wanted = wanted_ids(observed, assessment)
    pods = observed.pods
    done = assessment.leader_id is not None and wanted <= set(pods) and all(
        pod.config_hash == observed.config_hash and pod.ready and not pod.terminating
        for pod in pods.values())
    if not done:
        return switch
    if switch.stage < TLS_SWITCH_STAGES:
        return TlsSwitch(switch.enabled, switch.stage + 1)
    if switch.enabled != observed.spec.security.tls:
        return TlsSwitch(observed.spec.security.tls, 1)
    return None


def plan(observed: Observed) -> Plan:
    assessment = assess(observed)
    members = member_records(observed, assessment)
    planner = _Planner(observed, assessment, members)
    return planner.run()


@dataclass
class _Planner:
    observed: Observed
    assessment: Assessment
    members: tuple[MemberRecord, ...]
    # The recorded voter change, until it is seen in force.
    pending: PendingChange | None = None

    def __post_init__(self) -> None:
        pending = self.observed.pending
        if pending is not None and self.assessment.leader_id is not None:
            key = (pending.node_id, pending.directory_id)
            if (key in self.assessment.voters) == (pending.kind == ADD_VOTER):
                pending = None
        self.pending = pending

    def run(self) -> Plan:
        observed, a = self.observed, self.assessment
        if observed.spec.paused:
            return self._plan((), self.pending, "paused: spec.paused is true")
        if a.quorum_lost:
            lost = ", ".join(f"node {i}" for i, _ in sorted(a.lost))
            return self._plan((), self.pending,
                              f"a majority of voters lost their volumes ({lost}); manual "
                              "recovery needed")
        for step in (self._create_missing, self._replace_failed, self._resume_pending,
                     self._remediate, self._delete_unwanted, self._scale_down, self._roll,
                     self._scale_up):
            result = step()
            if result is not None:
                return result
        return self._plan((), None, "")

    # Every step returns a Plan when it acts or must wait, None to let the next step look.

    def _plan(self, actions: Iterable[Action], pending: PendingChange | None, waiting: str,
              **blocked: str) -> Plan:
        return Plan(tuple(actions), self.assessment, self.members, pending, waiting, blocked)

    def _create_missing(self) -> Plan | None:
        observed = self.observed
        actions = []
        foreign = foreign_claims(observed.claims, observed.cluster_id)
        for node_id in sorted(wanted_ids(observed, self.assessment)):
            claim = observed.claims.get(node_id)
            if node_id in foreign:
                continue  # refused (condition ClaimsRefused): an administrator decides
            if claim is None:
                actions.append(Action(ActionKind.CREATE_CLAIM, node_id))
            elif node_id not in observed.pods and not claim.terminating:
                actions.append(Action(ActionKind.CREATE_POD, node_id))
        if actions:
            return self._plan(actions, self.pending, "creating claims and pods")
        return None

    def _replace_failed(self) -> Plan | None:
        """Delete a pod the kubelet ended for good (``PodView.terminal``: phase Failed after an
        eviction or a graceful node shutdown), which nothing else would replace:
        ``_create_missing`` makes it again on the next pass.

        One at a time, and never while another pod is stopping: no two disruptions at once. The
        quorum check of a rolling update (``_quorum_check``) applies too, but a failed pod's node
        is down already: deleting it takes no caught-up voter away, so the check can only hold
        it back while the leader still counts the node caught up (its last fetch is within the
        fetch timeout). Neither a leader nor a caught-up majority is needed otherwise: two of
        three voters evicted is when a replacement matters most."""
        observed, a = self.observed, self.assessment
        failed = sorted((p for p in observed.pods.values()
                         if p.terminal and not self._backing_off(p.name)),
                        key=lambda p: (p.node_id not in a.voter_ids, p.node_id))  # voters first
        if not failed:
            return None
        pod = failed[0]
        stopping = [p.name for p in observed.pods.values() if p.terminating]
        if stopping:
            return self._plan((), self.pending, f"failed pod {pod.name} waits for "
                              f"{', '.join(stopping)} to stop")
        if any(node_id == pod.node_id for node_id, _ in a.caught_up):
            blocked = self._quorum_check(pod.node_id)
            if blocked is not None:
                return self._plan((), self.pending, f"failed pod {pod.name} waits for the "
                                  f"{blocked}")
        why = f" ({pod.reason})" if pod.reason else ""
        return self._plan([Action(ActionKind.DELETE_POD, pod.node_id, POD_FAILED)], self.pending,
                          f"replacing failed pod {pod.name}{why}")

    def _backing_off(self, pod_name: str) -> bool:
        """Whether a pod is not to be made again yet: the kubelet rejected it at admission
        (recorded as a refused create of its name, ``reconcile.note_rejections``) and the
        create back-off has not run out. Other steps go on meanwhile (condition CreateRefused
        says why the member is down)."""
        record = self.observed.creates_refused.get(f"Pod/{pod_name}")
        return record is not None and self.observed.now < record.retry_at

    def _quorum_check(self, node_id: int) -> str | None:
        """Why ``node_id``'s pod may not go now (None: it may): a voter's only while a majority
        of the voters other than it are caught up, so that the quorum keeps a majority."""
        a = self.assessment
        if node_id not in a.voter_ids:
            return None
        others, needed = a.others_caught_up(node_id), majority(len(a.voters))
        if others < needed:
            return f"quorum check ({others} other voters caught up, {needed} needed)"
        return None

    def _resume_pending(self) -> Plan | None:
        pending = self.pending
        if pending is None:
            return None  # none, or the recorded change is in force: the steps below go on
        if self.assessment.leader_id is None:
            return self._plan((), pending, f"{pending.kind} of node {pending.node_id} pending; "
                              "waiting for a leader")
        return self._plan([Action(pending.kind, pending.node_id, pending.reason,
                                  pending.directory_id, pending.old_directory_id)],
                          pending, f"{pending.kind} of node {pending.node_id} in progress")

    def _remediate(self) -> Plan | None:
        observed, a = self.observed, self.assessment
        if a.leader_id is None:
            return None
        for node_id in sorted(a.voter_ids):
            keys = [key for key in a.voters if key[0] == node_id]
            current = a.current_directories.get(node_id)
            stale = [key for key in keys if key in a.lost or
                     (current is not None and key[1] != current and len(keys) > 1)]
            if not stale:
                continue
            if len(keys) > 1:
                # The new directory is a voter already: drop the old one (KIP-856's second step).
                old = stale[0]
                if old[1] is None:
                    continue
                return self._voter_change(Action(REMOVE_VOTER, node_id, REMEDIATION, old[1]),
                                          f"removing node {node_id}'s old directory")
            if not observed.spec.remediation.enabled:
                return self._plan((), None, "", MemberReplacing=(
                    f"node {node_id}'s volume was replaced and remediation is disabled: "
                    "see docs/operator.md for the manual steps"))
            blocked = self._replacement_blocked(node_id, current)
            if blocked is not None:
                return self._plan((), None, blocked, MemberReplacing=blocked)
            assert current is not None
            return self._voter_change(
                Action(ADD_VOTER, node_id, REMEDIATION, current, stale[0][1]),
                f"adding node {node_id}'s new directory")
        return None

    def _replacement_blocked(self, node_id: int, current: str | None) -> str | None:
        """Why the replacement observer of a voter cannot be added yet (None: it can)."""
        a, observed = self.assessment, self.observed
        quorum = observed.quorum
        if current is None or quorum is None:
            return f"node {node_id}'s volume was replaced; waiting for its new replica to start"
        row = next((r for r in quorum.observer(node_id) if r.directory_id == current), None)
        if row is None:
            return f"node {node_id}'s new replica ({current}) is not fetching from the leader yet"
        wait = self._caught_up_wait(node_id)
        if wait is not None:
            return f"node {node_id}'s new replica is catching up ({wait})"
        others = a.others_caught_up(node_id)
        if others < majority(len(a.voters)):
            return (f"only {others} of the other voters are caught up; {majority(len(a.voters))}"
                    f" needed before replacing node {node_id}")
        return None

    def _caught_up_wait(self, node_id: int) -> str | None:
        record = next(m for m in self.members if m.node_id == node_id)
        needed = self.observed.spec.remediation.min_caught_up_seconds
        if record.caught_up_since is None:
            return "not caught up"
        waited = self.observed.now - record.caught_up_since
        if waited < needed:
            return f"caught up for {waited:.0f} s of {needed} s"
        return None

    def _voter_change(self, action: Action, waiting: str) -> Plan:
        """A voter change, if the operator may make one now."""
        observed, a = self.observed, self.assessment
        refused = observed.refused.get(action.node_id)
        if refused is not None and observed.now < refused[0]:
            message = f"{action.kind} of node {action.node_id} was refused ({refused[1]}); " \
                f"retrying in {refused[0] - observed.now:.0f} s"
            condition = "MemberReplacing" if action.reason == REMEDIATION else "ScalingBlocked"
            return self._plan((), None, message, **{condition: message})
        if action.kind == REMOVE_VOTER:
            remaining = len(a.voters) - 1
            others = sum(1 for key in a.voters if key in a.caught_up and
                         key != (action.node_id, action.directory_id))
            if remaining < 1 or others < majority(remaining):
                return self._plan((), None, f"removing node {action.node_id} would leave "
                                  f"{others} caught-up voters of {remaining}")
        return self._plan([action], None, waiting)

    def _delete_unwanted(self) -> Plan | None:
        observed, a = self.observed, self.assessment
        if a.leader_id is None or not a.bootstrapped:
            return None  # never delete on a guess
        wanted = wanted_ids(observed, a)
        for node_id in sorted(set(observed.pods) | set(observed.claims), reverse=True):
            if node_id in wanted or node_id in a.voter_ids:
                continue
            pod = observed.pods.get(node_id)
            if pod is not None:
                if pod.terminating:
                    return self._plan((), None, f"waiting for pod {pod.name} to stop")
                return self._plan([Action(ActionKind.DELETE_POD, node_id, SCALE_DOWN)], None,
                                  f"scale-down: deleting node {node_id}'s pod")
            claim = observed.claims[node_id]
            if not claim.terminating:
                return self._plan([Action(ActionKind.DELETE_CLAIM, node_id, SCALE_DOWN)], None,
                                  f"scale-down: deleting node {node_id}'s volume claim")
        return None

    def _roll(self) -> Plan | None:
        observed, a = self.observed, self.assessment
        outdated = [pod for pod in observed.pods.values()
                    if pod.config_hash != observed.config_hash and not pod.terminating]
        if not outdated:
            return None
        if any(pod.terminating for pod in observed.pods.values()):
            return self._plan((), self.pending, "rolling update: waiting for a pod to stop")
        if not a.bootstrapped:
            # Nothing is committed yet: restart in any order.
            pod = min(outdated, key=lambda p: p.node_id)
            return self._plan([Action(ActionKind.DELETE_POD, pod.node_id, ROLLING_UPDATE)], None,
                              f"rolling update of {pod.name}")
        if a.leader_id is None:
            return self._plan((), None, "rolling update: waiting for a leader")
        if self.pending is not None:
            return self._plan((), self.pending, "rolling update: a voter change is pending")
        order = sorted(outdated, key=lambda p: (self._roll_rank(p.node_id, p.ready), p.node_id))
        pod = order[0]
        # A new member's pod, on the current revision and no voter yet, is not waited for: it
        # cannot fetch (nor be ready) before the leader, rolled, knows its id.
        unready = [p.name for p in observed.pods.values() if not p.ready and p is not pod and
                   (p.node_id in a.voter_ids or p.config_hash != observed.config_hash)]
        if unready:
            return self._plan((), None, f"rolling update: waiting for {', '.join(unready)} "
                              "to be ready")
        blocked = self._quorum_check(pod.node_id)
        if blocked is not None:
            return self._plan((), None, f"rolling update: {pod.name} waits for the {blocked}")
        return self._plan([Action(ActionKind.DELETE_POD, pod.node_id, ROLLING_UPDATE)], None,
                          f"rolling update of {pod.name}")

    def _roll_rank(self, node_id: int, ready: bool) -> int:
        """Unready pods first, then observers, then followers, the leader last."""
        a = self.assessment
        if not ready:
            return 0
        if node_id not in a.voter_ids:
            return 1
        return 3 if node_id == a.leader_id else 2

    def _scale_up(self) -> Plan | None:
        observed, a = self.observed, self.assessment
        to_add = next_to_add(observed, a)
        if not a.bootstrapped or a.leader_id is None or to_add is None:
            return None
        current = a.current_directories.get(to_add)
        pod = observed.pods.get(to_add)
        if current is None or pod is None or not pod.ready:
            return self._plan((), None, f"scale-up: waiting for node {to_add} to start")
        wait = self._caught_up_wait(to_add)
        if wait is not None:
            return self._plan((), None, f"scale-up: node {to_add} is catching up ({wait})")
        return self._voter_change(Action(ADD_VOTER, to_add, SCALE_UP, current),
                                  f"scale-up: adding node {to_add}")

    def _scale_down(self) -> Plan | None:
        observed, a = self.observed, self.assessment
        if not a.bootstrapped or a.leader_id is None or \
                len(a.voter_ids) <= observed.spec.replicas:
            return None
        node_id = max(a.voter_ids)
        key = next(key for key in a.voters if key[0] == node_id)
        if key[1] is None:
            return None
        return self._voter_change(Action(REMOVE_VOTER, node_id, SCALE_DOWN, key[1]),
                                  f"scale-down: removing node {node_id}")


def member_records(observed: Observed, assessment: Assessment) -> tuple[MemberRecord, ...]:
    """What status should record about each member after this pass.

    The recorded claim UID and voter directory id are the identity the next pass checks a
    member against, so they move only when nothing contradicts them: the claim UID once the
    member's node runs the voter's directory (or the member is no voter yet), the directory id
    once a single voter has the node's id."""
    quorum = observed.quorum
    ids = set(observed.pods) | set(observed.claims) | set(assessment.voter_ids) | \
        wanted_ids(observed, assessment)
    records = []
    for node_id in sorted(ids):
        previous = observed.members.get(node_id, MemberRecord(node_id))
        keys = [key for key in assessment.voters if key[0] == node_id]
        current = assessment.current_directories.get(node_id)
        # The voter directory on record: what tells a replaced volume, and the voter set when
        # no leader can be trusted. Moved only by a trusted leader's view, and never while
        # two directories of the node are voters.
        directory_id = previous.directory_id
        if assessment.leader_id is not None and len(keys) <= 1:
            directory_id = keys[0][1] if keys else None
        is_voter = any(key[1] == current for key in keys) if current is not None \
            else bool(keys)
        claim = observed.claims.get(node_id)
        claim_uid = previous.claim_uid
        if claim is not None and not claim.terminating and (
                not keys or (current is not None and any(k[1] == current for k in keys))):
            claim_uid = claim.uid
        since = previous.caught_up_since
        if quorum is not None and assessment.leader_id is not None:
            rows = [r for r in quorum.voters + quorum.observers
                    if r.node_id == node_id and r.directory_id == current]
            if rows and is_caught_up(rows[0], quorum, observed.spec.fetch_timeout_ms):
                since = since if since is not None else observed.now
            else:
                since = None
        records.append(replace(previous, claim_uid=claim_uid, directory_id=directory_id,
                               role="voter" if is_voter else "observer",
                               caught_up_since=since))
    return tuple(records)
