"""How jobs and experiments show in a notebook, without a tallyd: state
names, one-line summaries and HTML tables of the messages, a plot that
displays as a cell's last expression, and job references checked before
anything is sent."""

import base64
import unittest

import tally
from tally import _common
from tally.v1 import experiments_pb2, jobs_pb2


def big_job():
    job = jobs_pb2.Job(name="jobs/12", state=jobs_pb2.JOB_STATE_SUCCEEDED, step=30,
                       val_loss=2.3125, state_reason="max_steps reached")
    job.spec.display_name = "py-done"
    job.spec.training.max_steps = 30
    job.cost.cost_usd = 0.0123
    for i in range(200):
        job.curve.add(step=i, val_loss=3.0 - i / 100.0, cost_usd=i / 1000.0)
        job.worker_ids.append("worker-%d" % i)
    return job


class StateNameTest(unittest.TestCase):
    def test_states_read_as_names(self):
        self.assertEqual(tally.state_name(big_job()), "SUCCEEDED")
        self.assertEqual(tally.state_name(jobs_pb2.JOB_STATE_EARLY_STOPPED), "EARLY_STOPPED")
        self.assertEqual(tally.state_name(jobs_pb2.JobEvent(state=jobs_pb2.JOB_STATE_RUNNING)),
                         "RUNNING")
        exp = experiments_pb2.Experiment(state=experiments_pb2.EXPERIMENT_STATE_SUCCEEDED)
        self.assertEqual(tally.state_name(exp), "SUCCEEDED")
        with self.assertRaises(TypeError):
            tally.state_name({"state": 3})

    def test_job_state_is_a_readable_enum_equal_to_the_number(self):
        state = tally.JobState(big_job().state)
        self.assertEqual(str(state), "SUCCEEDED")
        self.assertEqual(state, jobs_pb2.JOB_STATE_SUCCEEDED)
        self.assertTrue(state.ended)
        self.assertFalse(tally.JobState.RUNNING.ended)
        self.assertEqual(f"{tally.JobState(2)}", "RUNNING")
        self.assertEqual([s.name for s in tally.JobState][1:],
                         [n.removeprefix("JOB_STATE_") for n in jobs_pb2.JobState.keys()][1:])


class SummaryTest(unittest.TestCase):
    def test_a_job_is_one_short_line_not_its_whole_message(self):
        job = big_job()
        self.assertGreater(len(str(job)), 5000)
        line = tally.job_summary(job)
        self.assertEqual(line, "<tally Job jobs/12 'py-done' SUCCEEDED step 30/30 "
                               "val_loss 2.3125 $0.0123>")

    def test_ipython_shows_the_line_and_a_table_with_a_sparkline(self):
        from IPython.core.interactiveshell import InteractiveShell
        shell = InteractiveShell.instance()
        self.assertTrue(tally.register_ipython())
        data, _ = shell.display_formatter.format(big_job())
        self.assertEqual(data["text/plain"], tally.job_summary(big_job()))
        self.assertIn("SUCCEEDED", data["text/html"])
        self.assertIn("2.3125", data["text/html"])
        self.assertIn("$0.0123", data["text/html"])
        self.assertIn("<svg", data["text/html"])
        exp = experiments_pb2.Experiment(name="experiments/3", target_val_loss=2.5, cost_usd=1.5)
        exp.variants.add(name="a<b", state=jobs_pb2.JOB_STATE_RUNNING, final_val_loss=0)
        data, _ = shell.display_formatter.format(exp)
        self.assertTrue(data["text/plain"].startswith("<tally Experiment experiments/3"))
        self.assertIn("a&lt;b", data["text/html"])  # names are escaped
        self.assertIn("RUNNING", data["text/html"])


class PlotDisplayTest(unittest.TestCase):
    def test_the_returned_figure_displays_as_a_png(self):
        from IPython.core.formatters import DisplayFormatter
        exp = experiments_pb2.Experiment(name="experiments/1", target_val_loss=2.0)
        exp.variants.add(name="a", job="jobs/1", recipe_usd_per_step=0.01)
        points = [jobs_pb2.EvalPoint(step=s, val_loss=3.0 - s / 100, cost_usd=s / 100)
                  for s in (0, 50, 100)]
        fig = tally.plot_loss_vs_dollars(tally.ExperimentReport(exp, {"a": points}))
        data, _ = DisplayFormatter().format(fig)
        self.assertIn("image/png", data)
        png = data["image/png"]
        if isinstance(png, str):
            png = base64.b64decode(png)
        self.assertEqual(png[:8], b"\x89PNG\r\n\x1a\n")


class JobRefTest(unittest.TestCase):
    def test_a_name_a_number_or_the_object(self):
        for ref in (7, "7", "jobs/7", jobs_pb2.Job(name="jobs/7")):
            self.assertEqual(_common.job_name(ref), "jobs/7")
        self.assertEqual(_common.experiment_name(experiments_pb2.Experiment(
            name="experiments/2")), "experiments/2")
        self.assertEqual(_common.experiment_name(2), "experiments/2")

    def test_anything_else_is_refused_before_a_call(self):
        client = tally.Client("127.0.0.1:1", environ={}, retries=1, timeout=1)
        self.addCleanup(client.close)
        with self.assertRaises(TypeError) as cm:
            client.cancel({"name": "jobs/1"})
        self.assertIn("expected jobs/N, a number or a Job, got dict", str(cm.exception))
        with self.assertRaises(TypeError):
            client.get(jobs_pb2.JobEvent())
        with self.assertRaises(TypeError):
            client.experiments.get(jobs_pb2.Job(name="jobs/1"))
        with self.assertRaises(TypeError):
            client.get(True)
        with self.assertRaises(tally.InvalidSpec) as cm:
            client.get("jobs/{'name': 1}")
        self.assertEqual(cm.exception.field, "name")


if __name__ == "__main__":
    unittest.main()
