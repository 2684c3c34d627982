"""mypy --strict on a user's script: the installed package's types (its
py.typed, the messages' .pyi files read with types-protobuf) catch a
misspelt field and a wrong object passed as a job, and pass a correct
script."""

import os
import subprocess
import sys
import tempfile
import textwrap
import unittest

GOOD = textwrap.dedent("""
    import tally

    def latest(client: tally.Client, job: tally.JobRef) -> float:
        j = client.jobs.wait(job, timeout=60.0, progress=False)
        name: str = tally.state_name(j)
        return j.val_loss if name == "SUCCEEDED" else float("nan")

    def submit(client: tally.Client) -> str:
        return client.submit({"model": {"num_layers": 1}}).name
    """)

BAD = textwrap.dedent("""
    import tally

    def use(client: tally.Client) -> None:
        job = client.get(1)
        print(job.nmae)
        client.cancel({"name": "jobs/1"})
        client.submit(3.5)
    """)


class TypingTest(unittest.TestCase):
    def mypy(self, source):
        folder = tempfile.mkdtemp(prefix="tally_typing_")
        path = os.path.join(folder, "user_script.py")
        with open(path, "w") as f:
            f.write(source)
        return subprocess.run(
            [sys.executable, "-m", "mypy", "--strict", "--no-error-summary",
             "--cache-dir", os.path.join(folder, ".mypy_cache"), path],
            capture_output=True, text=True, timeout=300, cwd=folder)

    def test_a_correct_script_passes(self):
        r = self.mypy(GOOD)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)

    def test_a_misspelt_field_and_wrong_objects_are_caught(self):
        r = self.mypy(BAD)
        self.assertNotEqual(r.returncode, 0)
        self.assertIn('"Job" has no attribute "nmae"', r.stdout)
        self.assertIn('"cancel" of "Client" has incompatible type "dict[str, str]"', r.stdout)
        self.assertIn('"submit" of "Client" has incompatible type "float"', r.stdout)


if __name__ == "__main__":
    unittest.main()
