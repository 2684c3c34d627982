"""Chaos soak: tallyd and three CPU workers run a dozen small jobs (frequent
checkpoints, some stopped early, one 2-rank job) while a seeded schedule
`kill -9`s tallyd or a worker and restarts it with the same flags. Once the
schedule is over and every job has ended, the jobs' records, events and
checkpoints must still tell a consistent story; then, with tallyd stopped,
its database must charge each job exactly its attempts' GPU-seconds, and
every checkpoint file on disk must be recorded unless a kill or a stale
attempt explains it.

Besides the kills: workers paused (SIGSTOP) past the heartbeat timeout and
resumed (SIGCONT), which must not fail a healthy job (the requeued attempt
is never placed on the slot the paused worker still holds); and the latest
recorded checkpoint of a running job damaged (a flipped byte) before its
worker is killed, so the next attempt must fall back to the newest intact
one without counting.

TALLY_CHAOS_SEED=N replays a schedule: the same jobs, kill times, targets
and downtimes (process timing still varies from run to run)."""

import collections
import hashlib
import os
import random
import re
import shutil
import signal
import subprocess
import time
import unittest

import grpc
from harness import ROOT, TERMINAL, ClusterTest, jobs_pb2, parse_exposition, spec


def _store_stubs():
    """tally.store's records, generated beside the harness's tally.v1 stubs
    (the same package on sys.path), to read tallyd's database directly."""
    out = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(jobs_pb2.__file__))))
    subprocess.run(["protoc", "--proto_path=" + os.path.join(ROOT, "proto"),
                    "--python_out=" + out, "tally/store/records.proto"], check=True)
    open(os.path.join(out, "tally", "store", "__init__.py"), "a").close()
    from tally.store import records_pb2
    return records_pb2


records_pb2 = _store_stubs()

PRICE = 36.0  # $/GPU-hour for "cpu": $0.01 a second
WORKER_IDS = ("w1", "w2", "w3")
NUM_JOBS = 12  # one-rank jobs, besides the 2-rank one
NUM_KILLS = 8
MIN_KILLS_EACH = 2  # of tallyd and of workers
CHAOS_SECONDS = 100.0  # kills are scheduled inside this window
KILL_GAP_SECONDS = (7.0, 14.0)  # a long soak's 10-30 s, scaled to the window
TALLYD_DOWN_SECONDS = (0.0, 2.0)
WORKER_DOWN_SECONDS = (0.0, 4.5)  # past the 3 s heartbeat timeout, sometimes
NUM_PAUSES = 2  # SIGSTOP of a worker, SIGCONT after PAUSE_SECONDS
PAUSE_SECONDS = (4.0, 6.0)  # always past the 3 s heartbeat timeout
NUM_DAMAGES = 1  # a running job's latest checkpoint damaged, then its worker killed
SCHEDULE_SLACK_SECONDS = 30.0  # for the last submits and restarts
SOAK_SECONDS = 270.0  # from the first submit until every job must have ended
COST_TOLERANCE = 0.01
# The ledger accrues tallyd's clock in nanosecond Timestamps (start_time,
# accrued_until and end_time are the same absl::Now() values), so a job's
# GPU-seconds telescope to exactly the sum of its attempts' (end - start) x
# gpu_count; only double rounding over a few thousand increments remains
# (~1e-12 relative). A lost millisecond of one attempt would exceed this.
ATTEMPT_SUM_TOLERANCE_RELATIVE = 1e-9
ATTEMPT_SUM_TOLERANCE_GPU_SECONDS = 1e-6
# From a checkpoint file's last write (its mtime) to tallyd committing its
# record: the file's fsync, rename and directory fsync, the worker's outbox
# and tallyd's SQLite commit, on two shared cores.
REPORT_SECONDS = 2.0
CKPT_RE = re.compile(r"^step-(\d+)\.ckpt$")
CKPT_TMP_RE = re.compile(r"^step-(\d+)\.ckpt\.tmp$")
WORKER_EXIT_RE = re.compile(r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d)\.(\d{3})\] .*attempt (\d+) "
                            r"of (jobs/\d+): ATTEMPT_OUTCOME_")
# A worker's connection to tallyd, from its log: its Hello went out
# ("connected"), or its stream ended ("stream to tallyd ended"); a worker
# process starts unconnected.
WORKER_LINK_RE = re.compile(r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d)\.(\d{3})\] \[\w+\] "
                            r"(connected to tallyd at|stream to tallyd ended|tally-worker )")
BATCH_TOKENS = 14 * 2 * 64

ENDED_TYPES = {"succeeded", "failed", "early_stopped", "cancelled", "budget_exhausted"}
REPORT_TYPES = {"progress", "eval", "checkpoint"}
RESUME_RE = re.compile(r"resuming from step (\d+)")
STATE = jobs_pb2.JobState.Name


def chaos_seed():
    text = os.environ.get("TALLY_CHAOS_SEED", "").strip()
    if not text:
        return random.SystemRandom().randrange(1, 2 ** 31)
    try:
        return int(text)
    except ValueError:
        raise ValueError("TALLY_CHAOS_SEED must be an integer, got %r" % text) from None


def sha256_file(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def job_specs(rng):
    """(request_id, spec, submit offset in seconds) for every job, drawn from rng."""
    out = []
    # About 0.15 s a step on a shared core: 14 micro-batches of 2 x 64 tokens.
    gang = spec(max_steps=450, name="gang", gpu_count=2, priority=10, max_attempts=6,
                checkpoint_interval=3)
    gang.training.global_batch_tokens = BATCH_TOKENS
    out.append(("chaos-gang", gang, 0.0))
    early = set(rng.sample(range(NUM_JOBS), 4))
    short_lived = set(rng.sample(sorted(set(range(NUM_JOBS)) - early), 2))
    for i in range(NUM_JOBS):
        s = spec(max_steps=rng.randint(240, 360), name="chaos-%02d" % i,
                 priority=rng.randint(0, 3),
                 max_attempts=2 if i in short_lived else 6,
                 checkpoint_interval=rng.randint(2, 5))
        s.training.global_batch_tokens = BATCH_TOKENS
        s.training.eval_interval_steps = 10
        s.training.eval_tokens = 2048
        if i in early:
            # Nothing counts as an improvement: stops after `patience`
            # evaluations past the first.
            s.early_stopping.patience = rng.randint(1, 3)
            s.early_stopping.min_rel_delta = 0.9
            s.training.eval_interval_steps = 20
            s.training.max_steps = 1000
        offset = 0.0 if i < 7 else rng.uniform(5.0, CHAOS_SECONDS * 0.6)
        out.append(("chaos-%02d" % i, s, offset))
    return out


def rng_pick(seed, now, items):
    """One of items, drawn from the seed and the moment (replays pick alike
    when the schedule's timing does)."""
    return random.Random("%d/%.0f" % (seed, now)).choice(items)


def kill_plan(rng):
    """[(seconds from start, target, downtime)]: NUM_KILLS kills inside
    CHAOS_SECONDS, at least MIN_KILLS_EACH of tallyd and of workers."""
    times, t = [], 0.0
    for _ in range(NUM_KILLS):
        t += rng.uniform(*KILL_GAP_SECONDS)
        times.append(t)
    times = [x * min(1.0, (CHAOS_SECONDS - 5) / times[-1]) for x in times]
    kinds = ["tallyd"] * MIN_KILLS_EACH + ["worker"] * MIN_KILLS_EACH
    kinds += [rng.choice(("tallyd", "worker")) for _ in range(NUM_KILLS - len(kinds))]
    rng.shuffle(kinds)
    plan = []
    for when, kind in zip(times, kinds):
        if kind == "tallyd":
            plan.append((when, "tallyd", rng.uniform(*TALLYD_DOWN_SECONDS)))
        else:
            plan.append((when, rng.choice(WORKER_IDS), rng.uniform(*WORKER_DOWN_SECONDS)))
    # Pauses and a damaged checkpoint, between the kills (not at the very
    # start: a damage needs a job with a recorded checkpoint).
    for _ in range(NUM_PAUSES):
        plan.append((rng.uniform(10.0, CHAOS_SECONDS - 10), "pause:" + rng.choice(WORKER_IDS),
                     rng.uniform(*PAUSE_SECONDS)))
    for _ in range(NUM_DAMAGES):
        plan.append((rng.uniform(12.0, CHAOS_SECONDS * 0.4), "damage",
                     rng.uniform(*WORKER_DOWN_SECONDS)))
    plan.sort()
    return plan


class ChaosSoakTest(ClusterTest):

    def setUp(self):
        super().setUp()
        config = os.path.join(self.dir, "tallyd.yaml")
        with open(config, "w") as f:
            f.write("usd_per_gpu_hour: {cpu: %g}\nflops_per_second_per_gpu: {cpu: 1.0e10}\n"
                    % PRICE)
        self.tallyd.extra_args = ["--config=" + config]
        self.tallyd.restart()
        for w in WORKER_IDS:
            self.add_worker(w)

    def test_kill_9_schedule_keeps_every_invariant(self):
        self.seed = chaos_seed()
        print("\nchaos seed %d (replay: TALLY_CHAOS_SEED=%d)" % (self.seed, self.seed), flush=True)
        rng = random.Random(self.seed)
        self.plan = kill_plan(rng)
        self.jobs = job_specs(rng)
        print("kill plan: " + ", ".join("%.1fs %s (down %.1fs)" % p for p in self.plan),
              flush=True)
        self.findings = []
        self.skipped_kills = 0
        self.kills = collections.Counter()
        self.acked = {}          # request_id -> job name
        self.submit_tries = collections.Counter()
        self.lost_submits = []   # request_ids of submits cut off by a tallyd kill
        self.kill_log = []       # [(time.time() of the kill, target)]
        self.damaged = {}        # job name -> the checkpoint path damaged on purpose
        started = time.monotonic()
        try:
            self.run_schedule()
            self.drain()
            self.check_invariants()
            self.tallyd.stop()   # its database is read directly from here on
            self.check_store()
        except Exception as e:  # whatever broke, the message names the seed
            so_far = "".join("\n  " + f for f in self.findings)
            raise AssertionError("chaos seed %d (replay with TALLY_CHAOS_SEED=%d): %s: %s%s" % (
                self.seed, self.seed, type(e).__name__, e,
                "\ninvariants broken so far:" + so_far if so_far else "")) from e
        wall = time.monotonic() - started
        self.summarize(wall)
        if self.findings:
            # Printed here as well as in the failure: a log cut to its head and
            # tail (CI's) still shows them next to the summary.
            print("INVARIANTS BROKEN (%d):\n  %s" % (len(self.findings),
                                                      "\n  ".join(self.findings)), flush=True)
        if not self.findings:
            # Hundreds of checkpoints: kept only as evidence of a failure.
            shutil.rmtree(os.path.join(self.dir, "checkpoints"), ignore_errors=True)
        if self.findings:
            self.fail("chaos seed %d (replay with TALLY_CHAOS_SEED=%d): %d invariant(s) broken:\n  %s"
                      % (self.seed, self.seed, len(self.findings), "\n  ".join(self.findings)))

    # --- the schedule -----------------------------------------------------

    def worker(self, worker_id):
        return next(w for w in self.workers if w.worker_id == worker_id)

    def try_submit(self, request_id, job_spec):
        self.submit_tries[request_id] += 1
        try:
            job = self.submit(job_spec, request_id=request_id)
        except grpc.RpcError as e:
            if e.code() not in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
                raise AssertionError("submit %s: %s %s" % (request_id, e.code(), e.details()))
            return False
        if request_id in self.acked and self.acked[request_id] != job.name:
            self.findings.append("request_id %s acknowledged as %s, then as %s"
                                 % (request_id, self.acked[request_id], job.name))
        self.acked[request_id] = job.name
        return True

    def submit_in_flight(self, request_id, job_spec):
        """Starts a submit just before tallyd is killed: acknowledged or not,
        its retry with the same request_id must make no second job."""
        self.submit_tries[request_id] += 1
        return self.tallyd.jobs.SubmitJob.future(
            jobs_pb2.SubmitJobRequest(spec=job_spec, request_id=request_id), timeout=5)

    def check_alive(self, what, proc):
        code = proc.poll()
        if code is not None:
            self.findings.append("%s exited by itself with code %d before it was killed"
                                 % (what, code))

    def run_schedule(self):
        start = self.schedule_start = time.monotonic()
        pending = list(self.jobs)            # not yet acknowledged
        kills = list(self.plan)
        restarts = []                        # [(monotonic time, target)]
        tallyd_up = True
        next_census = start
        while pending or kills or restarts:
            now = time.monotonic()
            if kills and not pending and not restarts and now >= next_census:
                # Nothing left to disturb: the rest of the plan is skipped.
                next_census = now + 2.0
                if self.all_ended():
                    print("%6.1fs every job has ended; %d kill(s) of the plan skipped"
                          % (now - start, len(kills)), flush=True)
                    self.skipped_kills += len(kills)
                    kills = []
                    continue
            if now - start > CHAOS_SECONDS + SCHEDULE_SLACK_SECONDS:
                raise AssertionError("schedule overran: %d submits unacknowledged (%s)"
                                     % (len(pending), [r for r, _, _ in pending]))
            for item in [r for r in restarts if r[0] <= now]:
                restarts.remove(item)
                if item[1] == "tallyd":
                    self.tallyd.start()
                    tallyd_up = True
                elif item[1].startswith("pause:"):
                    self.worker(item[1][len("pause:"):]).proc.send_signal(signal.SIGCONT)
                    print("%6.1fs SIGCONT %s" % (now - start, item[1][len("pause:"):]),
                          flush=True)
                else:
                    self.worker(item[1]).start()
            if tallyd_up:
                for item in [p for p in pending if p[2] <= now - start]:
                    if self.try_submit(item[0], item[1]):
                        pending.remove(item)
            if kills and kills[0][0] <= now - start:
                _, target, down = kills.pop(0)
                census = self.census() if tallyd_up else "tallyd down"
                if target.startswith("pause:"):
                    # A worker that runs something, when one does: the
                    # case where a paused worker's slot matters.
                    busy = self.busy_workers() if tallyd_up else []
                    w = self.worker(rng_pick(self.seed, now, busy) if busy
                                    else target[len("pause:"):])
                    target = "pause:" + w.worker_id
                    if w.proc.poll() is not None or any(r[1] == w.worker_id for r in restarts):
                        continue  # killed and not back yet: nothing to pause
                    w.proc.send_signal(signal.SIGSTOP)
                    self.kills["pause"] += 1
                    print("%6.1fs SIGSTOP %s for %.1fs (jobs: %s)"
                          % (now - start, w.worker_id, down, census), flush=True)
                    restarts.append((time.monotonic() + down, target))
                    continue
                if target == "damage":
                    target = self.damage_a_checkpoint() if tallyd_up else None
                    if target is None:
                        print("%6.1fs no running job with a checkpoint to damage" % (now - start),
                              flush=True)
                        continue
                    if any(r[1] == target for r in restarts):
                        # tallyd still shows the job on a worker killed and
                        # not back yet: the damage stands, the kill is done.
                        print("%6.1fs the damaged checkpoint's worker %s is down already "
                              "(killed, not back yet): no second kill" % (now - start, target),
                              flush=True)
                        continue
                if target == "tallyd":
                    self.check_alive("tallyd", self.tallyd.proc)
                    future = None
                    due = sorted(pending, key=lambda p: p[2])
                    if due:
                        future = self.submit_in_flight(due[0][0], due[0][1])
                        time.sleep(0.005)  # on the wire, maybe committed, maybe answered
                    self.kill_log.append((time.time(), "tallyd"))
                    self.tallyd.kill(signal.SIGKILL)
                    tallyd_up = False
                    if future is not None:
                        try:
                            self.acked[due[0][0]] = future.result().name
                            pending.remove(due[0])
                        except (grpc.RpcError, grpc.FutureCancelledError):
                            self.lost_submits.append(due[0][0])
                else:
                    if any(r[1] == target for r in restarts):
                        # Still down from a kill the damage aimed at it: a
                        # second kill would start it twice when both are due.
                        print("%6.1fs %s is down already: kill skipped" % (now - start, target),
                              flush=True)
                        self.skipped_kills += 1
                        continue
                    w = self.worker(target)
                    self.check_alive("worker " + target, w.proc)
                    self.kill_log.append((time.time(), target))
                    w.kill(signal.SIGKILL)
                self.kills[target if target == "tallyd" else "worker"] += 1
                print("%6.1fs kill -9 %s, down %.1fs (jobs: %s)" % (now - start, target, down,
                                                                 census), flush=True)
                restarts.append((time.monotonic() + down, target))
            time.sleep(0.1)

    def busy_workers(self):
        """Workers running an attempt now (sorted); empty if tallyd does not answer."""
        busy = set()
        try:
            for name in self.acked.values():
                job = self.get(name)
                if job.state == jobs_pb2.JOB_STATE_RUNNING:
                    busy.update(job.worker_ids)
        except grpc.RpcError:
            return []
        return sorted(w for w in busy if w in WORKER_IDS)

    def damage_a_checkpoint(self):
        """Flips a byte in the middle of the latest recorded checkpoint of the
        running one-rank job with the most checkpoints and returns its worker
        (killed next, so the job resumes from that file); None when no job
        qualifies."""
        best = None
        for name in sorted(self.acked.values()):
            if name in self.damaged:
                continue
            try:
                job = self.get(name)
                ckpts = list(self.tallyd.jobs.ListCheckpoints(
                    jobs_pb2.ListCheckpointsRequest(name=name), timeout=5).checkpoints)
            except grpc.RpcError:
                return None
            if job.state != jobs_pb2.JOB_STATE_RUNNING or len(job.worker_ids) != 1 or \
                    not ckpts or not os.path.isfile(ckpts[-1].path):
                continue
            if best is None or len(ckpts) > len(best[2]):
                best = (name, job, ckpts)
        if best is not None:
            name, job, ckpts = best
            latest = ckpts[-1].path
            with open(latest, "r+b") as f:
                f.seek(os.path.getsize(latest) // 2)
                b = f.read(1)
                f.seek(-1, os.SEEK_CUR)
                f.write(bytes([b[0] ^ 0xFF]))
            self.damaged[name] = latest
            self.kills["damage"] += 1
            print("       damaged %s's latest checkpoint %s (%d recorded)"
                  % (name, latest, len(ckpts)), flush=True)
            return job.worker_ids[0]
        return None

    def all_ended(self):
        try:
            return all(self.get(name).state in TERMINAL for name in self.acked.values())
        except grpc.RpcError:
            return False

    def census(self):
        """The acknowledged jobs by state, for the log."""
        try:
            states = collections.Counter(
                STATE(self.get(name).state)[len("JOB_STATE_"):].lower()
                for name in self.acked.values())
        except grpc.RpcError as e:
            return "unknown (%s)" % e.code()
        return ", ".join("%d %s" % (n, s) for s, n in sorted(states.items()))

    def drain(self):
        deadline = self.schedule_start + SOAK_SECONDS
        drain_start = time.monotonic()
        states = {}
        while time.monotonic() < deadline:
            states = {}
            for rid, name in self.acked.items():
                try:
                    states[rid] = self.get(name).state
                except grpc.RpcError as e:
                    if e.code() == grpc.StatusCode.NOT_FOUND:
                        states[rid] = None
                    else:
                        raise
            if all(s in TERMINAL or s is None for s in states.values()):
                print("%6.1fs every job has ended, %.1fs after the schedule"
                      % (time.monotonic() - self.schedule_start,
                         time.monotonic() - drain_start), flush=True)
                return
            time.sleep(0.5)
        stuck = ["%s (%s): %s" % (self.acked[r], r, STATE(s) if s is not None else "missing")
                 for r, s in sorted(states.items()) if s not in TERMINAL]
        self.findings.append("not terminal %.0fs after the first submit (%.0fs after the "
                             "schedule): %s" % (SOAK_SECONDS, time.monotonic() - drain_start,
                                                "; ".join(stuck)))

    # --- the invariants ---------------------------------------------------

    def check_invariants(self):
        self.check_alive("tallyd", self.tallyd.proc)
        for w in self.workers:
            self.check_alive("worker " + w.worker_id, w.proc)
        self.check_slots_released()
        by_request = collections.defaultdict(list)
        token = ""
        while True:
            page = self.tallyd.jobs.ListJobs(
                jobs_pb2.ListJobsRequest(page_size=100, page_token=token), timeout=10)
            for j in page.jobs:
                by_request[j.request_id].append(j.name)
            token = page.next_page_token
            if not token:
                break
        for rid, _, _ in self.jobs:
            if rid not in self.acked:
                self.findings.append("request_id %s was never acknowledged" % rid)
            elif by_request.get(rid) != [self.acked[rid]]:
                self.findings.append("request_id %s: acknowledged as %s, the store has %s"
                                     % (rid, self.acked[rid], by_request.get(rid)))
        extra = set(by_request) - {rid for rid, _, _ in self.jobs}
        if extra:
            self.findings.append("jobs nobody submitted: %s" % {r: by_request[r] for r in extra})
        self.final = {}
        self.ckpts = {}
        self.stats = collections.Counter()
        for rid, job_spec, _ in self.jobs:
            if rid in self.acked:
                self.check_job(rid, self.acked[rid], job_spec)

    def check_slots_released(self):
        """Once every job has ended, every worker is connected and idle: no
        slot is still held for an attempt that tallyd no longer runs."""
        deadline = time.monotonic() + 15
        while True:
            series = parse_exposition(self.tallyd.scrape())
            used = series.get('tally_worker_slots{gpu_type="cpu",state="used"}')
            connected = series.get('tally_workers{gpu_type="cpu",state="connected"}')
            if used == 0 and connected == len(WORKER_IDS):
                return
            if time.monotonic() > deadline:
                self.findings.append(
                    "15 s after every job ended: %s cpu slots used, %s of %d workers connected"
                    % (used, connected, len(WORKER_IDS)))
                return
            time.sleep(0.5)

    def check_job(self, rid, name, job_spec):
        def broken(text):
            self.findings.append("%s (%s): %s" % (name, rid, text))

        try:
            job = self.get(name)
        except grpc.RpcError as e:
            broken("acknowledged but GetJob says %s %s" % (e.code(), e.details()))
            return
        self.final[name] = job
        counts = collections.Counter()
        if job.state not in TERMINAL:
            broken("ended the soak %s, not terminal" % STATE(job.state))
            return
        events = self.events(name)
        ckpts = list(self.tallyd.jobs.ListCheckpoints(
            jobs_pb2.ListCheckpointsRequest(name=name), timeout=10).checkpoints)
        self.ckpts[name] = ckpts

        # Event log: 1..N, no gap, from "submitted" to one ending event.
        seqs = [e.sequence for e in events]
        if seqs != list(range(1, len(seqs) + 1)) or len(seqs) != job.last_event_sequence:
            gaps = [(a, b) for a, b in zip([0] + seqs, seqs) if b != a + 1]
            broken("event sequences are not 1..%d: %d events, breaks at %s"
                   % (job.last_event_sequence, len(seqs), gaps[:5]))
        if not events or events[0].type != "submitted":
            broken("first event is %r, not 'submitted'" % (events[0].type if events else None))
        if events and (events[-1].state != job.state or events[-1].type not in ENDED_TYPES):
            broken("last event is %s/%s, the job is %s" % (events[-1].type,
                   STATE(events[-1].state), STATE(job.state)))

        # Attempts: at most max_attempts, numbered 1..k, never two live at once.
        max_attempts = job.spec.max_attempts
        started = [e for e in events if e.type == "started"]
        counted = job.attempt - job.preemption.count - job.attempts_not_counted
        if counted > max_attempts:
            broken("attempt %d (%d counted) > max_attempts %d (state %s)"
                   % (job.attempt, counted, max_attempts, STATE(job.state)))
        # A slot refusal caused by tallyd's own placement (a paused worker
        # still holding it) never counts as a failed attempt.
        for e in events:
            if "no free slot" in e.reason and "not counted" not in e.reason:
                broken("event %d (%s): a slot refusal counted: %s" % (e.sequence, e.type,
                                                                      e.reason))
            if "no free slot" in e.reason:
                self.stats["slot_refusals_not_counted"] += 1
        # A damaged checkpoint is found, struck out and fallen back from.
        damaged_paths = {d.path for d in job.damaged_checkpoints}
        self.stats["checkpoints_found_damaged"] += len(damaged_paths)
        if name in self.damaged and self.damaged[name] not in damaged_paths:
            later = [e for e in started if e.attempt > 1 and RESUME_RE.search(e.detail)
                     and any(c.path == self.damaged[name] and
                             int(RESUME_RE.search(e.detail).group(1)) == c.step
                             for c in ckpts)]
            if later:
                broken("attempt %d resumed from the damaged %s, and the job does not list it "
                       "as damaged" % (later[-1].attempt, self.damaged[name]))
        if damaged_paths - set(self.damaged.values()):
            broken("checkpoints found damaged that nobody damaged: %s"
                   % sorted(damaged_paths - set(self.damaged.values())))
        if [e.attempt for e in started] != list(range(1, len(started) + 1)) or \
                len(started) != job.attempt:
            broken("started events for attempts %s, the job says attempt %d"
                   % ([e.attempt for e in started], job.attempt))
        live, ended = None, False
        for e in events:
            where = "event %d (%s, attempt %d)" % (e.sequence, e.type, e.attempt)
            if ended:
                broken("%s after the job ended" % where)
                break
            if e.type == "started":
                if live is not None:
                    broken("%s while attempt %d was still live" % (where, live))
                live = e.attempt
            elif e.type == "adopted":
                if live != e.attempt:
                    broken("%s: the live attempt is %s" % (where, live))
                self.stats["adoptions"] += 1
                counts["adopted"] += 1
            elif e.type == "requeued":
                if live != e.attempt:
                    broken("%s: the live attempt is %s" % (where, live))
                live = None
                self.stats["requeues"] += 1
                counts["requeued"] += 1
            elif e.type in ENDED_TYPES:
                live, ended = None, True
            elif e.type in REPORT_TYPES and live != e.attempt:
                broken("%s accepted from an attempt that is not live (live: %s)" % (where, live))
        if job.state == jobs_pb2.JOB_STATE_FAILED and "no attempts left" in job.state_reason \
                and counted != max_attempts:
            broken("failed for attempts after %d of %d" % (counted, max_attempts))

        # Dollars: never negative, never decreasing, GPU-seconds x price.
        cost = job.cost
        if cost.cost_usd < 0 or cost.lost_usd < 0 or cost.gpu_seconds < 0:
            broken("negative dollars: cost %r, lost %r, gpu_seconds %r"
                   % (cost.cost_usd, cost.lost_usd, cost.gpu_seconds))
        if cost.lost_usd > cost.cost_usd * (1 + 1e-9):
            broken("lost $%.6f > cost $%.6f" % (cost.lost_usd, cost.cost_usd))
        expected = cost.gpu_seconds * cost.usd_per_gpu_hour / 3600
        if abs(cost.cost_usd - expected) > COST_TOLERANCE * max(expected, 1e-6):
            broken("cost $%.6f but gpu_seconds %.3f x $%g/h = $%.6f"
                   % (cost.cost_usd, cost.gpu_seconds, cost.usd_per_gpu_hour, expected))
        if job.attempt > 0 and cost.usd_per_gpu_hour != PRICE:
            broken("priced at $%g/GPU-hour, configured $%g" % (cost.usd_per_gpu_hour, PRICE))
        dollars = [e.cost_usd for e in events]
        drops = [(events[i].sequence, dollars[i - 1], dollars[i]) for i in range(1, len(events))
                 if dollars[i] < dollars[i - 1] - 1e-9]
        if drops:
            broken("dollars went down at events (sequence, before, after) %s" % drops[:3])
        if dollars and dollars[-1] > cost.cost_usd + 1e-9:
            broken("an event says $%.6f, the job's final cost is $%.6f"
                   % (dollars[-1], cost.cost_usd))

        # Checkpoints: on disk, with the recorded whole-file SHA-256.
        for c in ckpts:
            if c.attempt < 1 or c.attempt > job.attempt:
                broken("checkpoint at step %d from attempt %d of %d" % (c.step, c.attempt,
                                                                        job.attempt))
            if not os.path.isfile(c.path):
                broken("checkpoint %s (attempt %d, step %d) is not on disk"
                       % (c.path, c.attempt, c.step))
                continue
            if c.path == self.damaged.get(name):
                continue  # damaged on purpose
            actual = sha256_file(c.path)
            if actual != c.sha256:
                broken("checkpoint %s (attempt %d, step %d): recorded SHA-256 %s, sha256sum %s"
                       % (c.path, c.attempt, c.step, c.sha256[:16], actual[:16]))
                self.stats["checkpoint_sha_mismatches"] += 1
        self.stats["checkpoints"] += len(ckpts)

        # A resumed attempt starts from the latest checkpoint before it and
        # goes on after it.
        for s in started:
            # Checkpoints found damaged before this attempt are never resumed from.
            struck = {d.step for d in job.damaged_checkpoints if d.attempt < s.attempt}
            earlier = [c.step for c in ckpts if c.attempt < s.attempt and c.step not in struck]
            m = RESUME_RE.search(s.detail)
            if m is None:
                if earlier:
                    broken("attempt %d started from scratch though checkpoints up to step %d "
                           "were recorded" % (s.attempt, max(earlier)))
                continue
            resume = int(m.group(1))
            self.stats["resumes"] += 1
            if resume not in earlier:
                broken("attempt %d resumes from step %d, which no earlier attempt recorded "
                       "(recorded: %s)" % (s.attempt, resume, sorted(earlier)))
            elif resume != max(earlier):
                broken("attempt %d resumes from step %d, not from the latest checkpoint, "
                       "step %d" % (s.attempt, resume, max(earlier)))
            first = next((e for e in events if e.attempt == s.attempt and e.type == "progress"),
                         None)
            if first is not None and first.step <= resume:
                broken("attempt %d resumed from step %d but first reported step %d"
                       % (s.attempt, resume, first.step))
            own = [c.step for c in ckpts if c.attempt == s.attempt]
            if own and min(own) <= resume:
                broken("attempt %d resumed from step %d but checkpointed step %d"
                       % (s.attempt, resume, min(own)))

        if job.state == jobs_pb2.JOB_STATE_SUCCEEDED and job.step != job_spec.training.max_steps:
            broken("SUCCEEDED at step %d of %d" % (job.step, job_spec.training.max_steps))
        print("  %-8s %-10s %-15s step %4d/%-4d attempt %d/%d, %d requeued, %d adopted, "
              "%3d checkpoints, $%.4f ($%.4f lost)"
              % (name, rid, STATE(job.state)[len("JOB_STATE_"):], job.step,
                 job_spec.training.max_steps, job.attempt, max_attempts, counts["requeued"],
                 counts["adopted"], len(ckpts), cost.cost_usd, cost.lost_usd), flush=True)

    # --- tallyd's store, read after it stopped ----------------------------

    def check_store(self):
        """Dollars against attempts, and checkpoint files against records,
        from tallyd's store (attempts are not in the API): its SQLite file,
        or its PostgreSQL database under TALLY_TEST_STORE=postgres."""
        jobs = {}
        for (blob,) in self.tallyd.query("SELECT record FROM jobs"):
            rec = records_pb2.JobRecord.FromString(blob)
            jobs[rec.job.name] = rec
        attempts = collections.defaultdict(list)
        for (blob,) in self.tallyd.query("SELECT record FROM attempts ORDER BY job_id, attempt"):
            a = records_pb2.AttemptRecord.FromString(blob)
            attempts[a.job_id].append(a)
        exits = self.worker_exits()
        offline = self.worker_offline()
        for name in self.final:
            if name not in jobs:
                self.findings.append("%s: GetJob has it, tallyd's database does not" % name)
                continue
            rec = jobs[name]
            self.check_attempt_dollars(name, rec, attempts[rec.id])
            self.check_checkpoint_files(name, rec, attempts[rec.id], exits, offline)
        root = os.path.join(self.dir, "checkpoints")
        known = {"job-%d" % r.id for r in jobs.values()}
        if os.path.isdir(root):
            for folder in sorted(set(os.listdir(root)) - known):
                self.findings.append("checkpoint folder %s belongs to no job" % folder)

    def check_attempt_dollars(self, name, rec, attempts):
        """A running attempt accrues gpu_count x price for every second of
        tallyd's clock from cost.accrued_until, and accrued_until is the
        attempt's start_time when it starts (queued time costs nothing) and
        its end_time when it ends, in the same commit. While tallyd is down
        the attempt's worker keeps training: the first commit after the
        restart accrues from accrued_until, so the downtime is charged, and
        it lies inside (end_time - start_time) too. So the job's GPU-seconds
        are exactly the sum over its attempts, and its dollars that sum x
        price."""
        def broken(text):
            self.findings.append("%s: %s" % (name, text))

        job = rec.job
        gpus = max(1, job.spec.resources.gpu_count)
        gpu_seconds = 0.0
        for a in attempts:
            if a.state == records_pb2.ATTEMPT_STATE_RUNNING or not a.HasField("end_time"):
                broken("attempt %d is %s with end_time %s though the job is %s"
                       % (a.attempt, records_pb2.AttemptState.Name(a.state),
                          a.end_time.ToJsonString() if a.HasField("end_time") else "unset",
                          STATE(job.state)))
                continue
            if len(a.worker_ids) != gpus:
                broken("attempt %d ran on %d workers %s for gpu_count %d"
                       % (a.attempt, len(a.worker_ids), list(a.worker_ids), gpus))
            held = (a.end_time.ToNanoseconds() - a.start_time.ToNanoseconds()) / 1e9
            if held < 0:
                broken("attempt %d ends %.3fs before it starts" % (a.attempt, -held))
            gpu_seconds += held * gpus
        if [a.attempt for a in attempts] != list(range(1, job.attempt + 1)):
            broken("stored attempts %s, the job says attempt %d"
                   % ([a.attempt for a in attempts], job.attempt))
        cost = job.cost
        if cost.cost_usd < 0:
            broken("stored cost $%.6f is negative" % cost.cost_usd)
        tolerance = (ATTEMPT_SUM_TOLERANCE_GPU_SECONDS
                     + ATTEMPT_SUM_TOLERANCE_RELATIVE * gpu_seconds)
        if abs(cost.gpu_seconds - gpu_seconds) > tolerance:
            broken("charged %.6f GPU-seconds, its %d attempts ran %.6f (x %d GPUs)"
                   % (cost.gpu_seconds, len(attempts), gpu_seconds, gpus))
        expected = gpu_seconds * PRICE / 3600
        if abs(cost.cost_usd - expected) > tolerance * PRICE / 3600:
            broken("cost $%.9f, its attempts' %.6f GPU-seconds x $%g/h = $%.9f"
                   % (cost.cost_usd, gpu_seconds, PRICE, expected))
        final = self.final[name].cost
        if (final.cost_usd, final.gpu_seconds) != (cost.cost_usd, cost.gpu_seconds):
            broken("GetJob said $%r / %r GPU-seconds, the store has $%r / %r"
                   % (final.cost_usd, final.gpu_seconds, cost.cost_usd, cost.gpu_seconds))
        self.stats["attempt_gpu_seconds"] += gpu_seconds

    @staticmethod
    def log_time(m):
        return time.mktime(time.strptime(m.group(1), "%Y-%m-%d %H:%M:%S")) + int(m.group(2)) / 1000

    def worker_offline(self):
        """{worker_id: [(from, until)]}: the spans its log shows it without a
        stream to tallyd (until: its next Hello; infinity when none came)."""
        offline = collections.defaultdict(list)
        for w in self.workers:
            since = None
            with open(w.log_path) as f:
                for line in f:
                    m = WORKER_LINK_RE.match(line)
                    if m is None:
                        continue
                    t = self.log_time(m)
                    if m.group(3).startswith("connected"):
                        if since is not None:
                            offline[w.worker_id].append((since, t))
                        since = None
                    elif since is None:
                        since = t
            if since is not None:
                offline[w.worker_id].append((since, float("inf")))
        return offline

    def worker_exits(self):
        """{(job, attempt): [times]} each worker logged an attempt's end (it
        logs it once the trainer has returned: nothing is written after)."""
        exits = collections.defaultdict(list)
        for w in self.workers:
            with open(w.log_path) as f:
                for line in f:
                    m = WORKER_EXIT_RE.match(line)
                    if m:
                        exits[(m.group(4), int(m.group(3)), w.worker_id)].append(
                            self.log_time(m))
        return exits

    def check_checkpoint_files(self, name, rec, attempts, exits, offline):
        """Every step-*.ckpt in the job's folder is a recorded checkpoint.

        The worker writes step-N.ckpt.tmp, fsyncs, renames it into place,
        then queues the report; its outbox lets go of a message once it is on
        the stream, and tallyd records it only from the attempt it runs. So
        a file is legitimately unrecorded only when:
          - its .tmp write was cut by a kill -9 (not a step-*.ckpt: counted,
            at most one per worker kill, as a worker runs one trainer);
          - its report was lost in a kill: the writer was killed between
            the rename and sending it, or tallyd was killed with it on the
            wire (a file at most REPORT_SECONDS older than the kill);
          - its attempt had already been ended by tallyd (a stale attempt:
            declared lost while its worker kept training, e.g. not back
            within heartbeat_timeout of a tallyd restart): written while
            that attempt's rank 0 still ran it, with the report reaching
            tallyd after the end (late, held while tallyd was down, or held
            while the writer was reconnecting and back only after the end:
            its backoff reaches 5 s, past the 3 s heartbeat timeout).
        Anything else is a report tallyd lost or a file nobody reported."""
        folder = os.path.join(self.dir, "checkpoints", "job-%d" % rec.id)
        if not os.path.isdir(folder):
            return
        recorded = {os.path.realpath(c.path) for c in self.ckpts[name]}
        tallyd_kills = [t for t, target in self.kill_log if target == "tallyd"]
        now = time.time()
        windows = []  # (attempt, writer, start, tallyd's end, the writer's last moment)
        for a in attempts:
            if not a.worker_ids:
                continue
            writer, start = a.worker_ids[0], a.start_time.ToNanoseconds() / 1e9
            end = a.end_time.ToNanoseconds() / 1e9 if a.HasField("end_time") else now
            gone = [t for t in exits.get((rec.job.name, a.attempt, writer), []) if t >= start]
            gone += [t for t, target in self.kill_log if target == writer and t >= start]
            windows.append((a, writer, start, end, min(gone) + 0.001 if gone else now))
        tmp_files = 0
        for entry in sorted(os.listdir(folder)):
            if CKPT_TMP_RE.match(entry):
                tmp_files += 1
                continue
            if not CKPT_RE.match(entry):
                continue
            path = os.path.join(folder, entry)
            if os.path.realpath(path) in recorded:
                continue
            mtime = os.stat(path).st_mtime
            cut = [t for t in tallyd_kills if mtime <= t <= mtime + REPORT_SECONDS]
            cut += [t for a, writer, start, _, last in windows if start <= mtime <= last
                    for k, target in self.kill_log
                    if target == writer and mtime <= k <= mtime + REPORT_SECONDS]
            if cut:
                self.stats["unrecorded_report_cut_by_kill"] += 1
                continue
            stale = [a.attempt for a, writer, start, end, last in windows
                     if a.state != records_pb2.ATTEMPT_STATE_SUCCEEDED
                     and start <= mtime <= last and end < last
                     and (mtime + REPORT_SECONDS >= end
                          or any(mtime - REPORT_SECONDS <= t <= end for t in tallyd_kills)
                          or any(since <= mtime + REPORT_SECONDS and mtime <= until
                                 and until + REPORT_SECONDS >= end
                                 for since, until in offline.get(writer, [])))]
            if stale:
                self.stats["unrecorded_from_stale_attempt"] += 1
                continue
            live = ["attempt %d on %s %.3fs..%.3fs (%s, worker done %+.3fs)"
                    % (a.attempt, writer, start - mtime, end - mtime,
                       records_pb2.AttemptState.Name(a.state)[len("ATTEMPT_STATE_"):].lower(),
                       last - mtime)
                    for a, writer, start, end, last in windows]
            self.findings.append(
                "%s: %s (written %s) is not a recorded checkpoint, and no kill or stale "
                "attempt explains it; relative to the write: %s; kills %s"
                % (name, path, time.strftime("%H:%M:%S", time.localtime(mtime)),
                   "; ".join(live) or "no attempts",
                   ["%s %+.3fs" % (target, t - mtime) for t, target in self.kill_log]))
        worker_kills = sum(1 for _, target in self.kill_log if target != "tallyd")
        self.stats["tmp_files"] += tmp_files
        if tmp_files > worker_kills:
            self.findings.append("%s: %d cut checkpoint writes (*.ckpt.tmp) in %s, more than "
                                 "the %d worker kills" % (name, tmp_files, folder, worker_kills))

    def summarize(self, wall):
        by_state = collections.Counter(STATE(j.state) for j in self.final.values())
        print("chaos seed %d: %.0fs wall; kills: %d tallyd, %d worker (%d skipped); jobs: %s"
              % (self.seed, wall, self.kills["tallyd"], self.kills["worker"], self.skipped_kills,
                 ", ".join("%s %d" % kv for kv in sorted(by_state.items()))))
        print("faults: %d pauses past the heartbeat timeout (%d slot refusals, none counted), "
              "%d checkpoints damaged (%d found and fallen back from)"
              % (self.kills["pause"], self.stats["slot_refusals_not_counted"],
                 self.kills["damage"], self.stats["checkpoints_found_damaged"]), flush=True)
        print("attempts: %d requeued, %d adopted, %d resumed from a checkpoint; "
              "%d checkpoints (%d with a SHA-256 that is not the file's); "
              "submits: %d tries for %d jobs, %d killed in flight (%s); $%.4f spent, $%.4f lost"
              % (self.stats["requeues"], self.stats["adoptions"], self.stats["resumes"],
                 self.stats["checkpoints"], self.stats["checkpoint_sha_mismatches"],
                 sum(self.submit_tries.values()), len(self.jobs), len(self.lost_submits),
                 ",".join(self.lost_submits) or "none",
                 sum(j.cost.cost_usd for j in self.final.values()),
                 sum(j.cost.lost_usd for j in self.final.values())), flush=True)
        print("store: %.1f GPU-seconds over all attempts; checkpoint files not recorded: "
              "%d cut mid-write (.tmp), %d with the report cut by a kill, %d from a stale "
              "attempt" % (self.stats["attempt_gpu_seconds"], self.stats["tmp_files"],
                           self.stats["unrecorded_report_cut_by_kill"],
                           self.stats["unrecorded_from_stale_attempt"]), flush=True)


if __name__ == "__main__":
    unittest.main()
