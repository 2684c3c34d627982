"""The Python client's logs(): a real job's lines from the sync and the
asyncio clients, a page and followed. Run by the virtual environment
scripts/setup.sh makes, with the package installed (python.install)."""

import asyncio
import unittest

# The package first: harness.py's own stubs then resolve to its modules.
import tally  # noqa: E402
import tally.aio  # noqa: E402

from harness import ClusterTest, jobs_pb2, spec  # noqa: E402


class PythonLogsTest(ClusterTest):

    def test_sync_and_asyncio_logs(self):
        client = tally.Client(self.tallyd.grpc_addr)
        name = self.submit(spec(max_steps=200)).name
        self.add_worker("w1")
        followed = list(client.logs(name, follow=True))
        self.assertEqual(self.get(name).state, jobs_pb2.JOB_STATE_SUCCEEDED)
        texts = [line.text for line in followed]
        self.assertTrue(any(t.startswith(name + " attempt 1: ") and "parameters" in t
                            for t in texts), texts)
        self.assertIsInstance(followed[0], tally.LogLine)
        self.assertEqual([l.sequence for l in followed], sorted(l.sequence for l in followed))
        page = list(client.logs(name))
        self.assertEqual(page, followed)
        self.assertEqual(list(client.logs(name, tail=1)), followed[-1:])
        self.assertEqual(list(client.logs(name, attempt=2)), [])

        async def read():
            async with tally.aio.Client(self.tallyd.grpc_addr) as c:
                got = [line async for line in c.logs(name)]
                followed = [line async for line in c.logs(name, follow=True, after=1)]
                return got, followed

        got, after_one = asyncio.run(read())
        self.assertEqual(got, page)
        self.assertEqual(after_one, page[1:])
        with self.assertRaises(tally.NotFound):
            list(client.logs("jobs/999"))


if __name__ == "__main__":
    unittest.main()
