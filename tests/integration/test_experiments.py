"""Experiments end to end: real tallyd and CPU workers, created through
tallyctl as a user would, read back through the API, tallyctl and metrics."""

import json
import os
import xml.etree.ElementTree as ET

from harness import (TRAIN_PATH, ClusterTest, experiments_pb2, jobs_pb2,
                     parse_exposition, wait_for)

PRICE = 36.0  # $ per GPU-hour: a cpu second costs a cent

EXPERIMENT = """\
display_name: it-recipe
base:
  model: {{num_layers: 1, d_model: 16, num_heads: 2}}
  data: {{train_path: {train}, seq_len: 64, packing: packed}}
  training: {{max_steps: {steps}, micro_batch_rows: 2, eval_interval_steps: {every},
             eval_tokens: 4096, checkpoint_interval_steps: 0, seed: 1}}
  optimizer: {{lr: 1.0e-2, min_lr: 1.0e-3, warmup_steps: 5}}
  resources: {{gpu_type: cpu, gpu_count: 1}}
  max_attempts: 1
variants:
  - name: naive
    overrides: {{data: {{packing: pad_to_seq_len}}}}
  - name: packed
    overrides: {{}}
  - name: {third}
    overrides: {third_overrides}
target: {{from_variant: naive}}
"""

VARIANT_FIELDS = ("name", "job", "state", "final_val_loss", "best_val_loss", "cost_usd",
                  "reached_target", "cost_to_target_usd", "tokens_to_target",
                  "gpu_seconds_to_target", "ratio_to_reference", "recipe_cost_to_target_usd",
                  "recipe_cost_low_usd", "recipe_cost_high_usd", "recipe_ratio_to_reference",
                  "steps_to_target", "flops_to_target", "step_seconds", "step_seconds_spread",
                  "step_time_varied")

TERMINAL = {experiments_pb2.EXPERIMENT_STATE_SUCCEEDED,
            experiments_pb2.EXPERIMENT_STATE_CANCELLED,
            experiments_pb2.EXPERIMENT_STATE_BUDGET_EXHAUSTED}


class ExperimentsTest(ClusterTest):

    def setUp(self):
        super().setUp()
        config = os.path.join(self.dir, "tallyd.yaml")
        with open(config, "w") as f:
            f.write("usd_per_gpu_hour: {cpu: %g}\n" % PRICE)
        self.tallyd.extra_args = ["--config=" + config]
        self.tallyd.restart()

    def write(self, steps=300, every=25, third="packed-moe",
              third_overrides="{model: {moe: {num_experts: 4, top_k: 1}}}", extra=""):
        path = os.path.join(self.dir, "exp.yaml")
        with open(path, "w") as f:
            f.write(EXPERIMENT.format(train=TRAIN_PATH, steps=steps, every=every, third=third,
                                      third_overrides=third_overrides) + extra)
        return path

    def create_edited(self, path, old, new):
        """Replaces `old` with `new` in the experiment file, creates it with
        tallyctl, and returns its name."""
        with open(path) as f:
            text = f.read()
        self.assertIn(old, text)
        with open(path, "w") as f:
            f.write(text.replace(old, new))
        out = self.tallyctl("experiment", "create", "-f", path)
        self.assertEqual(out.returncode, 0, out.stderr)
        return out.stdout.strip()

    def get_exp(self, name):
        return self.tallyd.experiments.GetExperiment(
            experiments_pb2.GetExperimentRequest(name=name), timeout=10)

    def wait_exp(self, name, timeout=240):
        return wait_for(lambda: (lambda e: e if e.state in TERMINAL else None)(
            self.get_exp(name)), timeout=timeout, interval=0.2,
            what="%s to end" % name)

    def experiment_jobs(self, name, calibration=False):
        """The experiment's variant jobs (its timing calibration's with
        calibration=True)."""
        jobs = self.tallyd.jobs.ListJobs(jobs_pb2.ListJobsRequest(page_size=1000),
                                         timeout=10).jobs
        return [j for j in jobs if j.spec.labels.get("experiment") == name
                and ("calibration" in j.spec.labels) == calibration]

    def test_three_variants_reach_a_result_with_figures_a_report_and_metrics(self):
        # One slot: the reference, submitted first, runs first, so the others
        # all run with its final loss as their target.
        self.add_worker("w1")
        path = self.write()
        out = self.tallyctl("experiment", "create", "-f", path, "--request_id=it-1")
        self.assertEqual(out.returncode, 0, out.stderr)
        name = out.stdout.strip()
        self.assertRegex(name, r"^experiments/\d+$")
        # Idempotent: the same request id gives the same experiment, no new jobs.
        again = self.tallyctl("experiment", "create", "-f", path, "--request_id=it-1")
        self.assertEqual(again.returncode, 0, again.stderr)
        self.assertEqual(again.stdout.strip(), name)

        watch = self.tallyctl("experiment", "watch", name)
        self.assertEqual(watch.returncode, 0, watch.stdout + watch.stderr)
        self.assertIn("variant_ended", watch.stdout)
        self.assertIn("SUCCEEDED", watch.stdout)

        jobs = self.experiment_jobs(name)
        self.assertEqual(sorted(j.spec.labels["variant"] for j in jobs),
                         ["naive", "packed", "packed-moe"])
        e = self.get_exp(name)
        self.assertEqual(e.state, experiments_pb2.EXPERIMENT_STATE_SUCCEEDED, e.state_reason)
        self.assertEqual(e.reference_variant, "naive")
        naive = e.variants[0]
        self.assertEqual(naive.state, jobs_pb2.JOB_STATE_SUCCEEDED)
        self.assertAlmostEqual(e.target_val_loss, naive.final_val_loss, places=9)
        self.assertTrue(naive.reached_target)
        self.assertAlmostEqual(naive.ratio_to_reference, 1.0, places=9)
        by_job = {j.name: j for j in jobs}
        for v in e.variants[1:]:
            job = by_job[v.job]
            # The reference's final loss was the target in force on the others.
            self.assertAlmostEqual(job.target_val_loss, e.target_val_loss, places=9)
            if v.reached_target:
                self.assertGreater(v.cost_to_target_usd, 0)
                self.assertLessEqual(v.cost_to_target_usd, v.cost_usd + 1e-9)
                self.assertAlmostEqual(v.ratio_to_reference,
                                       v.cost_to_target_usd / naive.cost_to_target_usd,
                                       places=6)
                self.assertGreater(v.tokens_to_target, 0)
                self.assertGreater(v.gpu_seconds_to_target, 0)
                # The recipe cost: steps to the target at the variant's own
                # median step time, inside its p10-p90 interval.
                self.assertGreater(v.steps_to_target, 0)
                self.assertGreater(v.step_seconds, 0)
                self.assertAlmostEqual(v.recipe_cost_to_target_usd,
                                       v.steps_to_target * v.step_seconds * PRICE / 3600,
                                       places=9)
                self.assertLessEqual(v.recipe_cost_low_usd, v.recipe_cost_to_target_usd)
                self.assertGreaterEqual(v.recipe_cost_high_usd, v.recipe_cost_to_target_usd)
                self.assertAlmostEqual(
                    v.recipe_ratio_to_reference,
                    v.recipe_cost_to_target_usd / naive.recipe_cost_to_target_usd, places=6)
            else:
                self.assertEqual(v.ratio_to_reference, 0)
                self.assertEqual(v.note, "never reached the target")
        # The timing calibration: one job that timed every variant's step on
        # the same worker; its dollars are the experiment's, its times price
        # every recipe.
        [cal] = self.experiment_jobs(name, calibration=True)
        self.assertEqual(cal.name, e.calibration.job)
        self.assertEqual(cal.state, jobs_pb2.JOB_STATE_SUCCEEDED, cal.state_reason)
        self.assertEqual([t.name for t in cal.calibration], ["naive", "packed", "packed-moe"])
        self.assertTrue(e.calibration.enabled)
        self.assertGreater(e.calibration.cost_usd, 0)
        self.assertIn("timing calibrated by " + cal.name, e.state_reason)
        times = {t.name: t for t in e.calibration.times}
        for v in e.variants:
            t = times[v.name]
            self.assertEqual(t.samples, 15)  # 3 rounds x 5 timed steps
            self.assertLessEqual(t.p10_seconds, t.median_seconds)
            self.assertLessEqual(t.median_seconds, t.p90_seconds)
            self.assertTrue(v.timing_calibrated, v.name)
            self.assertAlmostEqual(v.step_seconds, t.median_seconds, places=12)
            self.assertGreater(v.own_step_seconds, 0)
        self.assertAlmostEqual(e.cost_usd, sum(v.cost_usd for v in e.variants)
                               + e.calibration.cost_usd, places=9)

        # The contract outside tools read: every field, by these names.
        got = self.tallyctl("experiment", "get", name, "--output=json")
        self.assertEqual(got.returncode, 0, got.stderr)
        doc = json.loads(got.stdout)
        self.assertIn("target_val_loss", doc)
        self.assertEqual(doc["reference_variant"], "naive")
        for v in doc["variants"]:
            for field in VARIANT_FIELDS:
                self.assertIn(field, v)
        text = self.tallyctl("experiment", "get", name)
        self.assertIn("RECIPE $ TO T", text.stdout)
        self.assertIn("BILLED $ TO T", text.stdout)
        self.assertIn("STEPS TO T", text.stdout)
        listed = self.tallyctl("experiment", "list")
        self.assertIn(name, listed.stdout)

        svg = os.path.join(self.dir, "report.svg")
        rep = self.tallyctl("experiment", "report", name, "--svg=" + svg)
        self.assertEqual(rep.returncode, 0, rep.stderr)
        root = ET.parse(svg).getroot()
        self.assertEqual(root.tag, "{http://www.w3.org/2000/svg}svg")
        paths = [p for p in root.iter("{http://www.w3.org/2000/svg}path")
                 if p.get("class") == "variant"]
        self.assertEqual(sorted(p.get("data-variant") for p in paths),
                         ["naive", "packed", "packed-moe"])

        series = parse_exposition(self.tallyd.scrape())
        key = ('tally_experiment_variant_reached_target{experiment="%s",variant="naive"}'
               % name)
        self.assertEqual(series.get(key), 1.0, key)
        key = ('tally_experiment_variant_cost_to_target_dollars{experiment="%s",'
               'variant="naive"}' % name)
        self.assertAlmostEqual(series[key], naive.cost_to_target_usd, places=6)
        key = ('tally_experiment_variant_recipe_cost_to_target_dollars{experiment="%s",'
               'variant="naive"}' % name)
        self.assertAlmostEqual(series[key], naive.recipe_cost_to_target_usd, places=6)
        print("\n" + text.stdout)

    def test_a_failing_variant_does_not_fail_the_experiment(self):
        self.add_worker("w1")
        self.add_worker("w2")
        path = self.write(steps=120, third="broken",
                          third_overrides="{data: {train_path: /nonexistent/corpus/train}}")
        out = self.tallyctl("experiment", "create", "-f", path)
        self.assertEqual(out.returncode, 0, out.stderr)
        name = out.stdout.strip()
        e = self.wait_exp(name)
        self.assertEqual(e.state, experiments_pb2.EXPERIMENT_STATE_SUCCEEDED, e.state_reason)
        broken = e.variants[2]
        self.assertEqual(broken.state, jobs_pb2.JOB_STATE_FAILED)
        self.assertFalse(broken.reached_target)
        self.assertEqual(broken.cost_to_target_usd, 0)
        self.assertEqual(broken.ratio_to_reference, 0)
        # The table says it failed and why, not "no evaluations yet".
        self.assertTrue(broken.note.startswith("failed: "), broken.note)
        self.assertIn("/nonexistent/corpus/train", broken.note)
        out = self.tallyctl("experiment", "get", name)
        self.assertEqual(out.returncode, 0, out.stderr)
        line = next(l for l in out.stdout.splitlines() if l.strip().startswith("broken "))
        self.assertIn("FAILED", line)
        self.assertIn("failed: ", line)
        self.assertTrue(e.variants[0].reached_target)

    def test_a_quantized_target_judges_every_variant_by_its_quantized_loss(self):
        self.add_worker("w1")
        self.add_worker("w2")
        path = self.write(steps=120, every=30, third="qat",
                          third_overrides="{training: {qat: {format: q8_0}}}")
        with open(path) as f:
            text = f.read()
        text = text.replace("target: {from_variant: naive}",
                            "target: {from_variant: naive, metric: quantized_val_loss}")
        text = text.replace("d_model: 16", "d_model: 32")  # whole blocks of 32 weights
        with open(path, "w") as f:
            f.write(text)
        # naive and packed measure no quantized loss: refused, each named.
        out = self.tallyctl("experiment", "create", "-f", path)
        self.assertEqual(out.returncode, 2, out.stdout)
        self.assertIn("variants[0] (naive): spec.training: target.metric quantized_val_loss "
                      "needs a quantized evaluation in every variant", out.stderr)
        self.assertIn("variants[1] (packed)", out.stderr)
        self.assertNotIn("variants[2]", out.stderr)
        # Post-training quantization measured in the base: every variant has it.
        name = self.create_edited(path, "checkpoint_interval_steps: 0, seed: 1",
                                  "checkpoint_interval_steps: 0, seed: 1, eval_quantized: q8_0")
        e = self.wait_exp(name)
        self.assertEqual(e.state, experiments_pb2.EXPERIMENT_STATE_SUCCEEDED, e.state_reason)
        self.assertIn("cheapest to the target quantized_val_loss", e.state_reason)
        naive = e.variants[0]
        self.assertTrue(naive.HasField("final_quantized_val_loss"))
        self.assertAlmostEqual(e.target_val_loss, naive.final_quantized_val_loss, places=12,
                               msg="the reference's final quantized loss")
        for v in e.variants:
            self.assertTrue(v.HasField("best_quantized_val_loss"), v.name)
        jobs = self.experiment_jobs(name)
        self.assertEqual({j.spec.early_stopping.metric for j in jobs}, {"quantized_val_loss"})
        for v in e.variants:
            if not v.reached_target:
                continue
            job = next(j for j in jobs if j.name == v.job)
            crossing = next(p for p in job.curve if p.step == v.target_step)
            self.assertLessEqual(crossing.quantized_val_loss, e.target_val_loss, v.name)
        out = self.tallyctl("experiment", "get", name)
        self.assertEqual(out.returncode, 0, out.stderr)
        self.assertIn("target:    quantized_val_loss", out.stdout)
        self.assertIn("BEST QUANT", out.stdout)

    def test_a_kill_9_of_tallyd_mid_experiment_loses_and_doubles_nothing(self):
        self.add_worker("w1")
        self.add_worker("w2")
        path = self.write(steps=1500, every=100)
        out = self.tallyctl("experiment", "create", "-f", path)
        self.assertEqual(out.returncode, 0, out.stderr)
        name = out.stdout.strip()
        wait_for(lambda: any(v.step > 0 for v in self.get_exp(name).variants), timeout=60,
                 what="a variant to make progress")
        self.tallyd.restart()  # SIGKILL, then the same data directory
        e = self.wait_exp(name, timeout=400)
        self.assertEqual(e.state, experiments_pb2.EXPERIMENT_STATE_SUCCEEDED, e.state_reason)
        self.assertEqual(len(self.experiment_jobs(name)), 3, "no variant submitted twice")
        self.assertEqual(len(self.experiment_jobs(name, calibration=True)), 1,
                         "nor the calibration")
        self.assertGreater(e.target_val_loss, 0)
        events = list(self.tallyd.experiments.WatchExperiment(
            experiments_pb2.WatchExperimentRequest(name=name), timeout=30))
        self.assertEqual([ev.sequence for ev in events], list(range(1, len(events) + 1)))
        self.assertEqual(sum(ev.type == "variant_ended" for ev in events), 3)
        self.assertEqual(events[-1].type, "succeeded")

    def test_cancel_ends_the_experiment_and_its_variants(self):
        self.add_worker("w1")
        path = self.write(steps=100000)
        name = self.tallyctl("experiment", "create", "-f", path).stdout.strip()
        wait_for(lambda: any(v.state == jobs_pb2.JOB_STATE_RUNNING
                             for v in self.get_exp(name).variants),
                 timeout=30, what="a variant to run")
        out = self.tallyctl("experiment", "cancel", name, "--reason=enough")
        self.assertEqual(out.returncode, 0, out.stderr)
        e = self.get_exp(name)
        self.assertEqual(e.state, experiments_pb2.EXPERIMENT_STATE_CANCELLED)
        self.assertEqual(e.state_reason, "cancelled: enough")
        for j in self.experiment_jobs(name) + self.experiment_jobs(name, calibration=True):
            self.assertEqual(j.state, jobs_pb2.JOB_STATE_CANCELLED, j.name)
        again = self.tallyctl("experiment", "cancel", name)
        self.assertEqual(again.returncode, 4, again.stderr)
        watch = self.tallyctl("experiment", "watch", name)
        self.assertEqual(watch.returncode, 6, "a cancelled experiment is not a success")

    def test_bad_files_and_names_get_clear_errors(self):
        path = self.write(third="packed-moe",
                          third_overrides="{model: {moe: {num_experts: 4, top_k: 9}}}")
        out = self.tallyctl("experiment", "create", "-f", path)
        self.assertEqual(out.returncode, 2)
        self.assertIn("variants[2] (packed-moe): spec.model.moe.top_k", out.stderr)
        # The server makes the same check for clients that skip tallyctl's.
        with self.assertRaises(Exception) as ctx:
            self.tallyd.experiments.CreateExperiment(
                experiments_pb2.CreateExperimentRequest(), timeout=10)
        self.assertIn("spec: is required", str(ctx.exception))
        out = self.tallyctl("experiment", "get", "experiments/99")
        self.assertEqual(out.returncode, 3)
        out = self.tallyctl("experiment", "get", "jobs/1")
        self.assertEqual(out.returncode, 2, out.stderr)
        self.assertIn("experiments/7", out.stderr)

    def test_successive_halving_stops_the_worse_half_with_fewer_workers_than_variants(self):
        # Four variants, two workers: the first two to reach a rung's mark
        # are held there (requeued, keeping their checkpoint) so that the
        # other two start; the rung is judged once all four reached it.
        self.add_worker("w1")
        self.add_worker("w2")
        path = self.write(steps=1600, every=50, third="packed-lowlr",
                          third_overrides="{optimizer: {lr: 1.0e-4, min_lr: 1.0e-5}}")
        # A fourth variant, an absolute target out of reach, and halving.
        name = self.create_edited(path, "target: {from_variant: naive}\n",
                                  "  - name: packed-tinylr\n"
                                  "    overrides: {optimizer: {lr: 1.0e-5, min_lr: 1.0e-6}}\n"
                                  "target: {val_loss: 0.5}\n"
                                  "strategy: successive_halving\n")
        e = self.wait_exp(name, timeout=400)
        self.assertEqual(e.state, experiments_pb2.EXPERIMENT_STATE_SUCCEEDED, e.state_reason)
        halted = {v.name for v in e.variants if v.halted}
        self.assertGreaterEqual(len(halted), 2, [(v.name, v.state_reason) for v in e.variants])
        for v in e.variants:
            if v.name in halted:
                self.assertEqual(v.state, jobs_pb2.JOB_STATE_EARLY_STOPPED, v.state_reason)
                self.assertIn("successive halving", v.state_reason)
        # The low learning rates learn slowest: they go first.
        self.assertIn("packed-tinylr", halted)
        jobs = {j.spec.labels["variant"]: j for j in self.experiment_jobs(name)}
        self.assertEqual(jobs["packed-tinylr"].early_stopping.stop_rule, "experiment_halving")
        events = list(self.tallyd.experiments.WatchExperiment(
            experiments_pb2.WatchExperimentRequest(name=name), timeout=30))
        held = [ev for ev in events if ev.type == "held"]
        self.assertGreaterEqual(len(held), 2, [(ev.type, ev.reason) for ev in events])
        for ev in held:
            self.assertIn("held there", ev.reason)
        halvings = [ev for ev in events if ev.type == "halving"]
        self.assertEqual(len(halvings), 2, [(ev.type, ev.reason) for ev in events])
        # Rung 1 judged all three in the race, each at the mark (none still queued, none
        # run to its end first), naming the figure it was ranked by.
        first = halvings[0].reason + " " + halvings[0].detail
        for v in ("packed", "packed-lowlr", "packed-tinylr"):
            self.assertIn(v + " (", first)
        # naive is the reference (the first variant of a val_loss target):
        # never halved, so every ratio has its denominator.
        self.assertNotIn("naive (", first)
        self.assertNotIn("naive", halted)
        self.assertRegex(first, r"\((forecast final val_loss|latest val_loss) [0-9.]+\)")

    def test_replicates_run_each_variant_per_seed_with_intervals_and_a_verdict(self):
        self.add_worker("w1")
        self.add_worker("w2")
        path = self.write(steps=60, every=20, extra="replicates: 2\n")
        # naive, packed, and naive again under another name: the same recipe
        # and seeds, so the same curve, run by run.
        name = self.create_edited(path, "  - name: packed-moe\n"
                                  "    overrides: {model: {moe: {num_experts: 4, top_k: 1}}}\n",
                                  "  - name: again\n"
                                  "    overrides: {data: {packing: pad_to_seq_len}}\n")
        e = self.wait_exp(name, timeout=400)
        self.assertEqual(e.state, experiments_pb2.EXPERIMENT_STATE_SUCCEEDED, e.state_reason)
        self.assertEqual(e.spec.replicates, 2)
        # Six jobs: each variant twice, with seeds 1 and 2.
        jobs = self.experiment_jobs(name)
        runs = sorted((j.spec.labels["variant"], j.spec.labels["replicate"],
                       j.spec.training.seed) for j in jobs)
        self.assertEqual(runs, [("again", "1", 1), ("again", "2", 2),
                                ("naive", "1", 1), ("naive", "2", 2),
                                ("packed", "1", 1), ("packed", "2", 2)])
        self.assertEqual([(v.name, v.replicate) for v in e.variants],
                         [("naive", 1), ("naive", 2), ("packed", 1), ("packed", 2),
                          ("again", 1), ("again", 2)])
        # Replicate r of each variant trains with the same seed: the same
        # recipe gives the same curve, so the same steps to the target.
        self.assertEqual([v.steps_to_target for v in e.variants if v.name == "again"],
                         [v.steps_to_target for v in e.variants if v.name == "naive"])
        # The target: the worse of naive's two final losses; both reached it.
        finals = [v.final_val_loss for v in e.variants if v.name == "naive"]
        self.assertAlmostEqual(e.target_val_loss, max(finals), places=9)
        self.assertTrue(all(v.reached_target for v in e.variants if v.name == "naive"))
        self.assertEqual([s.name for s in e.summaries], ["naive", "packed", "again"])
        naive, packed, again = e.summaries
        self.assertEqual(naive.verdict, "reference")
        self.assertEqual(naive.replicates, 2)
        self.assertEqual(naive.reached_target, 2)
        self.assertLessEqual(naive.recipe_cost_ci90_low_usd, naive.recipe_cost_to_target_usd)
        self.assertGreaterEqual(naive.recipe_cost_ci90_high_usd, naive.recipe_cost_to_target_usd)
        # Each run of "again" pairs with naive's run of its seed: the ratio
        # is the two step times', the interval around their geometric mean.
        self.assertEqual(again.ratio_pairs, 2)
        self.assertEqual(again.reached_target, 2)
        self.assertLessEqual(again.recipe_ratio_ci90_low, again.recipe_ratio_to_reference)
        self.assertGreaterEqual(again.recipe_ratio_ci90_high, again.recipe_ratio_to_reference)
        self.assertIn(again.verdict, ("cheaper", "dearer", "no clear difference"))
        ratios = [v.recipe_ratio_to_reference for v in e.variants if v.name == "again"]
        self.assertAlmostEqual(again.recipe_ratio_to_reference,
                               (ratios[0] * ratios[1]) ** 0.5, places=6)
        self.assertIn(packed.verdict, ("cheaper", "dearer", "no clear difference",
                                       "not reached"))
        self.assertIn("90% interval", e.state_reason)
        text = self.tallyctl("experiment", "get", name)
        self.assertIn("packed#2", text.stdout)
        self.assertIn("over 2 replicates", text.stdout)
        got = json.loads(self.tallyctl("experiment", "get", name, "--output=json").stdout)
        for field in ("recipe_cost_ci90_low_usd", "recipe_cost_ci90_high_usd",
                      "recipe_ratio_ci90_low", "recipe_ratio_ci90_high", "verdict"):
            self.assertIn(field, got["summaries"][1])
        svg = os.path.join(self.dir, "replicates.svg")
        rep = self.tallyctl("experiment", "report", name, "--svg=" + svg)
        self.assertEqual(rep.returncode, 0, rep.stderr)
        ET.parse(svg)
        print("\n" + text.stdout)

    def test_list_pages_newest_first(self):
        path = self.write()  # no workers: the variants stay queued
        names = [self.tallyctl("experiment", "create", "-f", path).stdout.strip()
                 for _ in range(3)]
        page = self.tallyd.experiments.ListExperiments(
            experiments_pb2.ListExperimentsRequest(page_size=2), timeout=10)
        self.assertEqual([e.name for e in page.experiments], names[:0:-1])
        self.assertTrue(page.next_page_token)
        rest = self.tallyd.experiments.ListExperiments(
            experiments_pb2.ListExperimentsRequest(page_size=2,
                                                   page_token=page.next_page_token),
            timeout=10)
        self.assertEqual([e.name for e in rest.experiments], names[:1])
        self.assertFalse(rest.next_page_token)
        out = self.tallyctl("experiment", "list", "--page_token=bogus")
        self.assertEqual(out.returncode, 2, out.stderr)
        self.assertIn("page_token", out.stderr)
        for name in names:
            self.assertEqual(self.tallyctl("experiment", "cancel", name).returncode, 0)
        self.assertEqual(len(self.tallyd.jobs.ListJobs(
            jobs_pb2.ListJobsRequest(states=[jobs_pb2.JOB_STATE_QUEUED]), timeout=10).jobs), 0)
